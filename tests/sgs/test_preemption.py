"""A run killed mid-iteration (SIGKILL, as a preempted VM would be) resumes where it stopped."""

import json
import os
import signal
import subprocess
import sys
import time

from tests.sgs.run_support import small_run_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _command(models, workdir, iterations):
    cmd = [sys.executable, "-m", "sgs_jax.cli.train", "--config", os.path.join(ROOT, "configs/sgs.py:testbed"),
           "--iterations", str(iterations)]
    for item in small_run_overrides(models, workdir):
        cmd += ["--set", item]
    return cmd


def _completed_steps(workdir):
    path = os.path.join(workdir, "checkpoints")
    return sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []


def test_killed_run_resumes(tmp_path, random_checkpoints):
    workdir = tmp_path / "run"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    proc = subprocess.Popen(_command(random_checkpoints, workdir, 3), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while 1 not in _completed_steps(workdir):
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)  # in iteration 2: nothing of it may survive
    finally:
        proc.kill()
        proc.wait()
    done = subprocess.run(_command(random_checkpoints, workdir, 3), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout[done.stdout.index("{"):])
    assert summary["iterations"] == 3
    steps = [json.loads(line)["step"] for line in open(workdir / "metrics.jsonl") if "scalars" in line]
    assert steps[-1] == 3 and {1, 2, 3} <= set(steps)
    state = json.load(open(workdir / "targets_state.json"))
    assert [it["iteration"] for it in state["iterations"]] == [0, 1, 2]
