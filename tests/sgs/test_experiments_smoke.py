"""CI smoke of the findings command: `sgs-experiments` runs a tiny two-iteration version
(2 configs x 2 seeds, random nano models, 6 targets, k = 2) as parallel processes, then
`sgs-report` builds the per-config report from those runs; a rerun skips them all."""

import json
import os

from sgs_jax.cli.experiments import main
from tests.sgs.run_support import small_run_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FINDINGS = os.path.join(ROOT, "configs", "experiments", "findings.py")


def test_findings_smoke(tmp_path, random_checkpoints, capsys):
    tiny = [item for item in small_run_overrides(random_checkpoints, tmp_path) if not item.startswith("run.workdir=")]
    command = [FINDINGS, "--root", str(tmp_path / "runs"), "--jobs", "2", "--only", "sgs,rl_baseline",
               "--seeds", "1,2", "--set", "run.iterations=2", "--report", str(tmp_path / "report")]
    for item in tiny:
        command += ["--set", item]
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
    assert "skipped: sgs_seed1, sgs_seed2, rl_baseline_seed1, rl_baseline_seed2" in out and "start " not in out
