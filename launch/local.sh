#!/usr/bin/env bash
# Local launcher: builds a virtualenv on first use, then runs the main job or the tests.
#   bash launch/local.sh sgs [CONFIG] [extra sgs-train flags]   SGS end to end (default: CPU testbed)
#   bash launch/local.sh test [pytest args]                     the test suite
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGS_VENV:-.venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
# Re-install when setup.py changed since the last install (cheap no-op otherwise).
stamp="$VENV/.sgs_jax_installed"
# libtpu (the `tpu` extra, Linux x86-64 wheels only) lets the tests compile for TPU topologies
# without a TPU; elsewhere those tests skip.
extras=test
if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then extras=test,tpu; fi
if [ ! -f "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q -e ".[$extras]"
  touch "$stamp"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cmd=${1:-sgs}
shift || true
case "$cmd" in
  test)
    set +e
    "$VENV/bin/python" -m pytest "$@"
    rc=$?
    set -e
    # pytest exits 5 when nothing was collected: that is a failure here, not a pass.
    exit $rc
    ;;
  sgs)
    config=configs/sgs.py:testbed
    if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a first argument that is not a flag names the config
      config=$1
      shift
    fi
    # Remaining arguments go to sgs-train, e.g. --set run.iterations=3
    exec "$VENV/bin/sgs-train" --config "$config" "$@"
    ;;
  *)
    echo "usage: bash launch/local.sh {sgs [CONFIG] [flags] | test [pytest args]}" >&2
    exit 2
    ;;
esac
