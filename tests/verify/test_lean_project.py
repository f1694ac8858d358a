"""third_party/lean: pins agree with each other, and build.sh runs the right steps.

No Lean toolchain or internet here: build.sh runs against stand-in `elan` and `lake`
programs that log their arguments and answer like the real ones would.
"""

import os
import pathlib
import shutil
import subprocess
import tomllib

LEAN_DIR = pathlib.Path(__file__).resolve().parents[2] / "third_party" / "lean"


def test_pins_match_the_toolchain():
    toolchain = (LEAN_DIR / "lean-toolchain").read_text().strip()
    assert toolchain == "leanprover/lean4:v4.15.0"
    lakefile = tomllib.loads((LEAN_DIR / "lakefile.toml").read_text())
    requires = {r["name"]: r for r in lakefile["require"]}
    assert requires["mathlib"]["git"] == "https://github.com/leanprover-community/mathlib4"
    assert requires["REPL"]["git"] == "https://github.com/leanprover-community/repl"
    version = toolchain.split(":")[1]
    assert requires["mathlib"]["rev"] == version and requires["REPL"]["rev"] == version
    libs = [lib["name"] for lib in lakefile["lean_lib"]]
    assert lakefile["defaultTargets"] == libs == ["SgsLean"]
    assert "import Mathlib" in (LEAN_DIR / "SgsLean.lean").read_text()


def _stub(bin_dir, name, log, body=""):
    path = bin_dir / name
    path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "{log}"\n{body}\n')
    path.chmod(0o755)


def _run_build(tmp_path, with_elan=True, repl_reply='{"env": 0, "messages": [{"data": "\'sgs_smoke\' depends on axioms: [propext]"}]}'):
    work = tmp_path / "lean"
    shutil.copytree(LEAN_DIR, work, ignore=shutil.ignore_patterns(".lake"))
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    if with_elan:
        _stub(bin_dir, "elan", log)
    # `lake exe repl` reads the command from stdin and answers like the REPL.
    _stub(bin_dir, "lake", log, f'if [ "$1 $2" = "exe repl" ]; then cat > /dev/null; echo \'{repl_reply}\'; fi')
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", HOME=str(tmp_path))
    proc = subprocess.run(["bash", str(work / "build.sh")], env=env, capture_output=True, text=True, timeout=30)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


def test_build_script_steps(tmp_path):
    proc, calls = _run_build(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert calls == [
        "elan toolchain install leanprover/lean4:v4.15.0",
        "lake update",
        "lake exe cache get",
        "lake build repl",
        "lake build",
        "lake exe repl",
    ]
    assert "--lean-project-dir" in proc.stdout


def test_build_script_fails_loudly(tmp_path):
    proc, calls = _run_build(tmp_path, with_elan=False)
    assert proc.returncode == 1 and "elan not found" in proc.stderr and calls == []
    proc, _ = _run_build(tmp_path / "again", repl_reply='{"message": "unknown package Mathlib"}')
    assert proc.returncode == 1 and "did not report the axioms" in proc.stderr
