"""CI smoke of the findings command: `sgs-experiments` runs a tiny two-iteration version
(2 configs x 2 seeds, random nano models, 6 targets, k = 2) as parallel processes, then
`sgs-report` builds the per-config report from those runs; a rerun skips them all."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sgs_jax.cli.experiments import main
from sgs_jax.experiments import completed_iterations
from tests.sgs.run_support import small_run_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FINDINGS = os.path.join(ROOT, "configs", "experiments", "findings.py")


def test_findings_smoke(tmp_path, random_checkpoints, capsys):
    tiny = [item for item in small_run_overrides(random_checkpoints, tmp_path) if not item.startswith("--config.run.workdir=")]
    command = [FINDINGS, "--root", str(tmp_path / "runs"), "--jobs", "2", "--only", "sgs,rl_baseline",
               "--seeds", "1,2", "--config.run.iterations=2", "--report", str(tmp_path / "report"), *tiny]
    assert main(command) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "[experiments] finished sgs_seed1" in out and "4/4 done" in out
    runs = tmp_path / "runs" / "findings"
    assert sorted(p.name for p in runs.iterdir()) == ["rl_baseline_seed1", "rl_baseline_seed2", "sgs_seed1", "sgs_seed2"]
    for run in runs.iterdir():
        config = json.loads((run / "config.json").read_text(encoding="utf-8"))
        assert config["experiment"] == run.name.split("_seed")[0]
        assert config["run"]["seed"] == int(run.name.split("_seed")[1]) and config["run"]["iterations"] == 2
        steps = [json.loads(line)["step"] for line in open(run / "metrics.jsonl") if '"scalars"' in line]
        assert steps == [0, 1, 2]
        assert (run / "train.log").stat().st_size > 0 and (run / "experiment_run.json").exists()

    report = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "2 runs" not in report and "4 runs in 2 configs" in report
    assert "| sgs | 2 (1, 2) |" in report and "| rl_baseline | 2 (1, 2) |" in report
    assert "Matched generations: **" in report
    for figure in ("solve_rate", "solver_entropy", "scaling_fit"):
        assert (tmp_path / "report" / f"{figure}.png").exists(), figure

    # The same command again: every run finished with it, so nothing is started.
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "skipped: sgs_seed1, rl_baseline_seed1, sgs_seed2, rl_baseline_seed2" in out and "start " not in out


@pytest.mark.slow
def test_stopped_experiment_continues_with_the_same_command(tmp_path, random_checkpoints):
    """SIGTERM to the runner stops its runs (exit 130, one line saying how to resume); the
    same command then resumes each run from its checkpoint and finishes it. The runner is
    signalled within 20 ms of the second iteration's checkpoint and the run stops after the
    iteration it is in. A tiny iteration takes a few tenths of a second (with 4 iterations
    and 0.5 s polling the run sometimes ended first), so 8 leave over a second of margin."""
    iterations = 8
    tiny = [item for item in small_run_overrides(random_checkpoints, tmp_path) if not item.startswith("--config.run.workdir=")]
    command = [sys.executable, "-m", "sgs_jax.cli.experiments", FINDINGS, "--root", str(tmp_path / "runs"),
               "--only", "rl_baseline", "--seeds", "1", f"--config.run.iterations={iterations}", *tiny]
    run = tmp_path / "runs" / "findings" / "rl_baseline_seed1"
    env = {**os.environ, "PYTHONPATH": ROOT}
    runner = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    while completed_iterations(run) < 2 and time.monotonic() < deadline and runner.poll() is None:
        time.sleep(0.02)
    assert runner.poll() is None, runner.stdout.read()
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=120)
    assert runner.returncode == 130, out
    assert "stopping: 1 running runs get SIGTERM; rerun the same command to resume them" in out
    stopped_at = completed_iterations(run)
    assert 2 <= stopped_at < iterations

    finished = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert f"start rl_baseline_seed1 (resuming after iteration {stopped_at})" in finished.stdout
    steps = {json.loads(line)["step"] for line in open(run / "metrics.jsonl") if '"scalars"' in line}
    assert steps == set(range(iterations + 1))
