#!/usr/bin/env bash
# An SGS run on every worker of a Cloud TPU VM slice (one host or a pod slice of many).
#
#   bash launch/tpu_pod.sh --name TPU --zone ZONE [options] CONFIG [sgs-train flags...]
#
# required:
#   --name TPU                the TPU VM (slice) name; reused when it exists
#   --zone ZONE               its zone
# options:
#   --project PROJECT         gcloud project (default: gcloud's configured one)
#   --accelerator-type TYPE   create the slice when it does not exist (e.g. v5p-64: 8 hosts)
#   --version RUNTIME         TPU VM runtime version for creation (e.g. v2-alpha-tpuv5)
#   --spot                    create it as a Spot slice
#   --remote-dir DIR          checkout location on every worker (default: sgs-jax, under ~)
#   --logs DIR                where the workers' logs are collected (default: logs/TPU)
#   --no-install              skip copying the checkout and installing (already done)
#   --dry-run                 print the gcloud commands, run nothing
#   -h, --help                this text
#
# Steps: (1) describe the slice, or create it when --accelerator-type is given; (2) copy this
# checkout (git HEAD, as a tarball) to every worker and install it with the `tpu` extra in a
# virtualenv; (3) run `python -m sgs_jax.cli.train CONFIG FLAGS` on all workers at once, each
# writing sgs-logs/<hostname>.log; jax.distributed detects the slice from the TPU VM metadata
# (no coordinator flags); (4) copy every worker's log to --logs. Every worker must see the run
# directory at the same path: pass --config.run.workdir=/mnt/shared/... on an NFS (Filestore)
# or gcsfuse mount (checkpoints, metrics and side files are written there; docs/multihost.md).
#   e.g. bash launch/tpu_pod.sh --name sgs-v5p-64 --zone us-east5-a --accelerator-type v5p-64 \
#          --version v2-alpha-tpuv5 configs/sgs.py:paper --config.run.workdir=/mnt/shared/runs/sgs
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

name="" zone="" project="" accelerator="" version="" spot=0 remote_dir=sgs-jax logs="" install=1 dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name=$2; shift 2 ;;
    --zone) zone=$2; shift 2 ;;
    --project) project=$2; shift 2 ;;
    --accelerator-type) accelerator=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    --spot) spot=1; shift ;;
    --remote-dir) remote_dir=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --no-install) install=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "tpu_pod.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ -z "$name" ] || [ -z "$zone" ] || [ $# -lt 1 ]; then
  echo "usage: bash launch/tpu_pod.sh --name TPU --zone ZONE [options] CONFIG [sgs-train flags...] (see --help)" >&2
  exit 2
fi
if [ -n "$accelerator" ] && [ -z "$version" ]; then
  echo "tpu_pod.sh: --accelerator-type needs --version (the TPU VM runtime to create it with)" >&2
  exit 2
fi
config=$1
shift
cd "$(dirname "$0")/.."
logs=${logs:-logs/$name}
where=(--zone "$zone")
if [ -n "$project" ]; then where+=(--project "$project"); fi

# run CMD...: print it (quoted, as it would run) under --dry-run, else run it.
run() {
  if [ "$dry_run" = 1 ]; then
    printf '%q ' "$@"
    echo
  else
    "$@"
  fi
}

# The command every worker runs: $remote_dir is relative to the worker's home directory.
train=".venv/bin/python -m sgs_jax.cli.train --config $(printf '%q' "$config")"
for arg in "$@"; do train+=" $(printf '%q' "$arg")"; done
remote_run="cd $(printf '%q' "$remote_dir") && mkdir -p sgs-logs && $train 2>&1 | tee sgs-logs/\$(hostname).log; exit \${PIPESTATUS[0]}"

# (1) the slice: reused when it exists, else created when --accelerator-type says how
describe=(gcloud compute tpus tpu-vm describe "$name" "${where[@]}" --format='value(state)')
create=(gcloud compute tpus tpu-vm create "$name" "${where[@]}" --accelerator-type "$accelerator" --version "$version")
if [ "$spot" = 1 ]; then create+=(--spot); fi
if [ "$dry_run" = 1 ]; then
  run "${describe[@]}"
  if [ -n "$accelerator" ]; then
    echo "# when it does not exist:"
    run "${create[@]}"
  fi
elif ! "${describe[@]}" >/dev/null 2>&1; then
  if [ -z "$accelerator" ]; then
    echo "tpu_pod.sh: no TPU VM $name in $zone; pass --accelerator-type and --version to create it" >&2
    exit 1
  fi
  run "${create[@]}"
fi

# (2) the checkout and its environment on every worker
if [ "$install" = 1 ]; then
  tarball=$(mktemp -u "${TMPDIR:-/tmp}/sgs-jax.XXXXXX").tar.gz
  run git archive --format=tar.gz -o "$tarball" HEAD
  run gcloud compute tpus tpu-vm scp "$tarball" "$name:sgs-jax.tar.gz" "${where[@]}" --worker=all
  setup="mkdir -p $(printf '%q' "$remote_dir") && tar -xzf sgs-jax.tar.gz -C $(printf '%q' "$remote_dir")"
  setup+=" && cd $(printf '%q' "$remote_dir") && (test -x .venv/bin/python || python3 -m venv .venv)"
  setup+=" && .venv/bin/pip install -q -e '.[tpu]'"
  run gcloud compute tpus tpu-vm ssh "$name" "${where[@]}" --worker=all --command "$setup"
fi

# (3) the run, on all workers at once; (4) the logs, whatever the run's status
set +e
run gcloud compute tpus tpu-vm ssh "$name" "${where[@]}" --worker=all --command "$remote_run"
status=$?
set -e
run mkdir -p "$logs"
run gcloud compute tpus tpu-vm scp --recurse "$name:$remote_dir/sgs-logs" "$logs" "${where[@]}" --worker=all
exit "$status"
