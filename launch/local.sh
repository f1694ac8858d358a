#!/usr/bin/env bash
# Local launcher: builds a virtualenv on first use, then runs the main job or the tests.
#   bash launch/local.sh sgs [CONFIG] [sgs-train flags]         SGS end to end (default: CPU testbed), e.g.
#       bash launch/local.sh sgs configs/no_guide.py:testbed --config.run.iterations=3
#   bash launch/local.sh test [pytest args]                     the test suite (adds the `test` extra: torch)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGS_VENV:-.venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
# install EXTRAS: the package (plus the named extras) when setup.py changed since the last
# such install (a cheap no-op otherwise). The main job needs no extra; the tests add
# `test` (pytest and the PyTorch reference of the parity tests) and, on Linux x86-64 (the
# only libtpu wheels), `tpu`, so the tests can compile for TPU topologies without a TPU.
install() {
  local stamp="$VENV/.sgs_jax_installed${1:+_$1}"
  if [ ! -f "$stamp" ] || [ setup.py -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install -q -e ".${1:+[$1]}"
    touch "$stamp"
  fi
}
test_extras="test"
if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then test_extras=test,tpu; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cmd=${1:-sgs}
shift || true
case "$cmd" in
  test)
    install "$test_extras"
    # One pytest worker per core, at most 4 (SGS_TEST_WORKERS overrides; 0 = in-process):
    # most tests are bound by single-threaded XLA compiles (2 cores: 1,945 s in-process vs
    # 1,248 s on 2 workers, same loaded host). Files stay whole on a worker (fixtures once).
    cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
    workers=${SGS_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}
    set +e
    "$VENV/bin/python" -m pytest -n "$workers" --dist loadfile "$@"
    rc=$?
    set -e
    # pytest exits 5 when nothing was collected: that is a failure here, not a pass.
    exit $rc
    ;;
  sgs)
    install ""
    config=configs/sgs.py:testbed
    if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a first argument that is not a flag names the config
      config=$1
      shift
    fi
    # Large freed blocks kept for reuse, so XLA:CPU's per-call scratch is not faulted in
    # afresh on every call (sgs_jax/parallel/host_memory.py; SGS_HOST_MALLOC=system turns it off).
    export SGS_HOST_MALLOC=${SGS_HOST_MALLOC:-keep}
    # Compiled programs persist across runs in .cache/jax (a second run skips most of the
    # first iteration's compiling); --config.run.compile_cache_dir=off turns this off.
    # Remaining arguments go to sgs-train as they are, e.g. --config.run.iterations=3
    exec "$VENV/bin/sgs-train" --config "$config" \
      --config.run.compile_cache_dir="$PWD/.cache/jax" "$@"
    ;;
  *)
    echo "usage: bash launch/local.sh {sgs [CONFIG] [flags] | test [pytest args]}" >&2
    exit 2
    ;;
esac
