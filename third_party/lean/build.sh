#!/usr/bin/env bash
# Build the Lean project the verifier uses: Lean v4.15.0 + Mathlib + REPL (matching tags).
# Needs internet, elan (https://github.com/leanprover/elan) and a few GB of disk.
#   bash third_party/lean/build.sh               build, then smoke-test the REPL
#   SGS_INSTALL_ELAN=1 bash third_party/lean/build.sh   install elan first if missing
#   SGS_SKIP_SMOKE=1 ...                          skip the REPL smoke test
set -euo pipefail
cd "$(dirname "$0")"
TOOLCHAIN=$(tr -d '[:space:]' < lean-toolchain)

if ! command -v elan >/dev/null 2>&1; then
  if [ "${SGS_INSTALL_ELAN:-0}" = 1 ]; then
    curl -sSfL https://raw.githubusercontent.com/leanprover/elan/master/elan-init.sh \
      | sh -s -- -y --default-toolchain none
    export PATH="$HOME/.elan/bin:$PATH"
  else
    echo "build.sh: elan not found. Install it (or rerun with SGS_INSTALL_ELAN=1):" >&2
    echo "  curl -sSfL https://raw.githubusercontent.com/leanprover/elan/master/elan-init.sh | sh" >&2
    exit 1
  fi
fi

echo "== toolchain $TOOLCHAIN"
elan toolchain install "$TOOLCHAIN"
echo "== resolving Mathlib and REPL (lake update)"
lake update
echo "== downloading Mathlib's compiled files (lake exe cache get)"
lake exe cache get
echo "== building the REPL and checking Mathlib imports"
lake build repl
lake build

if [ "${SGS_SKIP_SMOKE:-0}" != 1 ]; then
  echo "== smoke test: one proof through the REPL"
  reply=$(printf '%s\n\n' '{"cmd": "import Mathlib\ntheorem sgs_smoke : (2 : ℕ) + 2 = 4 := by norm_num\n#print axioms sgs_smoke"}' \
    | lake exe repl)
  echo "$reply"
  case "$reply" in
    *'depends on axioms'*) ;;
    *) echo "build.sh: the REPL did not report the axioms of the smoke theorem" >&2; exit 1 ;;
  esac
fi
echo "== done. Point the verifier at this project:"
echo "   sgs-verify --backend lean --lean-project-dir $(pwd) --repl-cmd 'lake exe repl' --input IN.jsonl --out OUT.jsonl"
