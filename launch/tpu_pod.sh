#!/usr/bin/env bash
# Run an experiment on every worker of a Cloud TPU VM pod slice.
#   bash launch/tpu_pod.sh TPU_NAME ZONE CONFIG [sgs-train flags...]
# e.g. bash launch/tpu_pod.sh sgs-v5p-64 us-east5-a configs/sgs.py:paper --config.run.workdir=gs://bucket/runs/sgs
# Every worker runs the same program; jax.distributed auto-detects the pod (no flags needed).
# The checkout must exist at the same path on every worker (e.g. cloned by a startup script).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: bash launch/tpu_pod.sh TPU_NAME ZONE CONFIG [sgs-train flags...]" >&2
  exit 2
fi
tpu=$1 zone=$2 config=$3
shift 3
repo=${SGS_REMOTE_REPO:-\$HOME/sgs-jax}
remote="cd $repo && (test -x .venv/bin/python || (python3 -m venv .venv && .venv/bin/pip install -q -e . 'jax[tpu]'))"
remote+=" && .venv/bin/sgs-train --config $config $*"
exec gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command "$remote"
