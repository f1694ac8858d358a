#!/usr/bin/env bash
# N JAX processes on this machine, each with its own simulated CPU devices, meeting at a local
# coordinator: the multi-host program (docs/multihost.md) without a cluster, for testing.
#
#   bash launch/local_multiprocess.sh [options] CONFIG [sgs-train flags...]
#
# options:
#   -n, --processes N         processes (default 2)
#   -d, --devices-per-process D
#                             simulated CPU devices per process (default 4; the mesh spans N x D)
#   -p, --port PORT           coordinator port on 127.0.0.1 (default: a free one)
#   -l, --logs DIR            one log per process, DIR/process_I.log (default: the run directory's
#                             logs/ when --config.run.workdir=... is given, else ./logs)
#   --dry-run                 print the commands, run nothing
#   -h, --help                this text
#
# Every process runs `python -m sgs_jax.cli.train` with --coordinator, --num-processes and
# --process-id. When one process fails, the others are stopped (as srun --kill-on-bad-exit
# does) and the launcher exits with the first failure's status; rerunning the same command
# resumes the run. PYTHON (default .venv/bin/python) is the interpreter.
#   e.g. bash launch/local_multiprocess.sh -n 2 -d 4 configs/sgs.py:testbed --config.run.iterations=2
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

processes=2 devices=4 port="" logs="" dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--processes) processes=$2; shift 2 ;;
    -d|--devices-per-process) devices=$2; shift 2 ;;
    -p|--port) port=$2; shift 2 ;;
    -l|--logs) logs=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "local_multiprocess.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 1 ]; then
  echo "usage: bash launch/local_multiprocess.sh [options] CONFIG [sgs-train flags...] (see --help)" >&2
  exit 2
fi
config=$1
shift
case "$processes$devices" in *[!0-9]*|'') echo "local_multiprocess.sh: -n and -d take positive integers" >&2; exit 2 ;; esac
if [ "$processes" -lt 1 ] || [ "$devices" -lt 1 ]; then
  echo "local_multiprocess.sh: -n and -d must be >= 1" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
python=${PYTHON:-${SGS_VENV:-.venv}/bin/python}
if [ -z "$port" ]; then
  if [ "$dry_run" = 1 ]; then
    port=PORT
  else
    port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  fi
fi
if [ -z "$logs" ]; then
  logs=logs
  for arg in "$@"; do
    case "$arg" in --config.run.workdir=*) logs="${arg#--config.run.workdir=}/logs" ;; esac
  done
fi

commands=()
for ((i = 0; i < processes; i++)); do
  cmd="env JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=$devices"
  cmd+=" $(printf '%q' "$python") -m sgs_jax.cli.train --config $(printf '%q' "$config")"
  cmd+=" --coordinator 127.0.0.1:$port --num-processes $processes --process-id $i"
  for arg in "$@"; do cmd+=" $(printf '%q' "$arg")"; done
  commands+=("$cmd > $(printf '%q' "$logs/process_$i.log") 2>&1")
done
if [ "$dry_run" = 1 ]; then
  echo "mkdir -p $(printf '%q' "$logs")"
  printf '%s &\n' "${commands[@]}"
  exit 0
fi

mkdir -p "$logs"
pids=()
stop_all() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap 'stop_all; exit 143' TERM
trap 'stop_all; exit 130' INT
for cmd in "${commands[@]}"; do
  bash -c "exec $cmd" &
  pids+=($!)
done
echo "local_multiprocess.sh: $processes processes x $devices CPU devices, coordinator 127.0.0.1:$port, logs in $logs" >&2
status=0
remaining=${#pids[@]}
while [ "$remaining" -gt 0 ]; do
  set +e
  wait -n
  rc=$?
  set -e
  remaining=$((remaining - 1))
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$rc
    echo "local_multiprocess.sh: a process exited with status $rc; stopping the others" >&2
    stop_all
  fi
done
if [ "$status" -eq 0 ]; then
  tail -n 20 "$logs/process_0.log"
fi
exit "$status"
