#!/usr/bin/env bash
# Several JAX processes on one machine, as a multi-host job would run (CPU devices):
#   bash launch/local_multiprocess.sh NUM_PROCESSES CONFIG [sgs-train flags...]
# Each process gets its own devices; they meet at a local coordinator.
set -euo pipefail
n=${1:?usage: bash launch/local_multiprocess.sh NUM_PROCESSES CONFIG [flags...]}
config=${2:?config}
shift 2
cd "$(dirname "$0")/.."
VENV=${SGS_VENV:-.venv}
port=${SGS_COORDINATOR_PORT:-12355}
pids=()
for ((i = 0; i < n; i++)); do
  JAX_PLATFORMS=cpu "$VENV/bin/sgs-train" --config "$config" \
    --coordinator "127.0.0.1:$port" --num-processes "$n" --process-id "$i" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
