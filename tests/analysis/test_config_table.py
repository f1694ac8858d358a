"""The per-config table on hand-made run logs: every cell against a hand-computed value."""

import logging
import math

import pytest

from sgs_jax import metrics as m
from sgs_jax.analysis.report.build import build_report
from sgs_jax.analysis.report.summary import late_window
from sgs_jax.cli.report import main
from synthetic_runs import write_run

HARD = "cumulative_solve_rate/hard"
EASY_DISJUNCT = "conjectures/hack/easy_disjunct_fraction"


def _steps(generations, rates, entropy, extra=None):
    """Step 0 (baseline: generations, rate) then one record per iteration."""
    steps = [{m.GENERATIONS: generations[0], m.CUMULATIVE_SOLVE_RATE: rates[0],
              m.TARGET_DISJUNCTIVE_FRACTION: 0.05, m.TARGET_MEAN_CONCLUSION_LENGTH: 20.0}]
    for i in range(1, len(generations)):
        record = {m.GENERATIONS: generations[i], m.CUMULATIVE_SOLVE_RATE: rates[i], m.SOLVER_ENTROPY: entropy[i - 1]}
        for name, values in (extra or {}).items():
            record[name] = values[i - 1]
        steps.append(record)
    return steps


@pytest.fixture
def runs(tmp_path):
    write_run(tmp_path / "sgs_a", _steps([0, 100, 200, 300, 400], [0.1, 0.2, 0.3, 0.4, 0.5], [1.0, 0.9, 0.8, 0.6],
                                         {HARD: [0.1, 0.2, 0.3, 0.4], m.CONJECTURE_DISJUNCTIVE_FRACTION: [0.1, 0.1, 0.2, 0.4],
                                          EASY_DISJUNCT: [0.0, 0.0, 0.1, 0.3]}),
              histograms={1: [0.0, 0.5], 4: [0.0, 0.0, 1.0, 0.5]}, experiment="sgs", seed=1)
    write_run(tmp_path / "sgs_b", _steps([0, 120, 240, 360, 480], [0.1, 0.3, 0.35, 0.4, 0.45], [2.0, 1.5, 1.0, 1.0],
                                         {m.CONJECTURE_DISJUNCTIVE_FRACTION: [0.0, 0.0, 0.0, 0.2]}),
              histograms={4: [0.0, 1.0, 1.0, 1.0]}, experiment="sgs", seed=2)
    write_run(tmp_path / "rl", _steps([0, 50, 100, 150, 200, 250, 300, 350, 400], [0.1] * 8 + [0.3],
                                      [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.7, 0.5]), experiment="rl_baseline", seed=1)
    return tmp_path


def test_late_window_is_a_quarter_rounded_up_at_least_one():
    assert [late_window(n) for n in (0, 1, 2, 4, 5, 8, 9, 10)] == [0, 1, 1, 1, 2, 2, 3, 3]


def test_config_rows_by_hand(runs):
    report = build_report([runs / "sgs_a", runs / "rl", runs / "sgs_b"], runs / "out", n_subsets=2)
    assert report.matched_generations == 400  # sgs_a and rl end at 400, sgs_b at 480
    sgs, rl = report.configs
    assert (sgs.label, sgs.seeds, rl.label, rl.seeds) == ("sgs", (1, 2), "rl_baseline", (1,))
    b_at_400 = 0.4 + 40 / 120 * 0.05
    assert sgs.solve_rate.mean == pytest.approx((0.5 + b_at_400) / 2, abs=1e-12)
    assert (sgs.solve_rate.low, sgs.solve_rate.high) == (pytest.approx(b_at_400, abs=1e-12), 0.5)
    assert (sgs.hard_solve_rate.mean, sgs.hard_solve_rate.n, sgs.hard_solve_rate.of) == (0.4, 1, 2)
    # 4 iterations: the final window is the last one. Entropy 0.6 (from 1.0) and 1.0 (from 2.0).
    assert sgs.final_entropy.mean == pytest.approx(0.8, abs=1e-12)
    assert sgs.entropy_change.mean == pytest.approx(-0.45, abs=1e-12)
    assert (sgs.entropy_change.low, sgs.entropy_change.high) == (pytest.approx(-0.5), pytest.approx(-0.4))
    # Step-4 histograms: a has {0, 0, 1, 0.5} (half at 0, a quarter at 1); b has {0, 1, 1, 1}.
    assert sgs.synthetic_at_zero.mean == pytest.approx((0.5 + 0.25) / 2, abs=1e-12)
    assert sgs.synthetic_at_one.mean == pytest.approx((0.25 + 0.75) / 2, abs=1e-12)
    assert sgs.disjunctive_fraction.mean == pytest.approx(0.3, abs=1e-12)
    assert sgs.hack_fractions["easy_disjunct"].mean == pytest.approx(0.3) and sgs.hack_fractions["easy_disjunct"].n == 1
    # rl: 8 iterations, final window = last 2: entropy (0.7 + 0.5) / 2 = 0.6, 40% below 1.0.
    assert rl.solve_rate.mean == pytest.approx(0.3, abs=1e-12)
    assert rl.final_entropy.mean == pytest.approx(0.6, abs=1e-12)
    assert rl.entropy_change.mean == pytest.approx(-0.4, abs=1e-12)
    for empty in (rl.hard_solve_rate, rl.synthetic_at_zero, rl.disjunctive_fraction, rl.hack_fractions["easy_disjunct"]):
        assert empty.n == 0 and math.isnan(empty.mean)

    text = report.report_path.read_text(encoding="utf-8")
    assert "Matched generations: **400**" in text
    assert ("| sgs | 2 (1, 2) | 45.8% [41.7%, 50.0%] | 40.0% (1 of 2 runs) | 0.800 [0.600, 1.000] "
            "| −45% [−50%, −40%] | 37.5% [25.0%, 50.0%] | 50.0% [25.0%, 75.0%] | 30.0% [20.0%, 40.0%] "
            "| 30.0% (1 of 2 runs) |") in text
    assert "| rl_baseline | 1 (1) | 30.0% | – | 0.600 | −40% | – | – | – | – |" in text
    # Testbed scale: the fit threshold is a tenth of the shortest run (400 generations).
    assert report.min_generations == pytest.approx(40.0)
    assert "fewer than 40 generations are not fitted (min(100,000, 0.1 × the shortest run's generations))" in text
    (baseline,) = report.baselines
    assert (baseline.disjunctive_fraction, baseline.label) == (0.05, "targets (these runs)")


def test_explicit_labels_regroup_runs(runs, capsys):
    assert main(["--runs", f"mine={runs / 'sgs_a'}", f"mine={runs / 'rl'}", str(runs / "sgs_b"),
                 "--out", str(runs / "cli"), "--subsets", "0"]) == 0
    out = capsys.readouterr().out
    assert "| mine | 2 (1, 1) |" in out and "| sgs | 1 (2) |" in out


def test_experiment_folder_expands_to_its_runs(runs, capsys):
    experiment = runs / "exp"
    experiment.mkdir()
    for name in ("sgs_a", "sgs_b", "rl"):
        (runs / name).rename(experiment / name)
    assert main(["--runs", str(experiment), "--out", str(runs / "cli"), "--subsets", "0"]) == 0
    assert "3 runs in 2 configs" in capsys.readouterr().out


def test_unreadable_lines_are_skipped_with_a_warning_naming_file_and_line(runs, caplog):
    path = runs / "sgs_a" / m.JSONL_NAME
    lines = path.read_bytes().splitlines(keepends=True)
    # Line 3 gets a byte that is not UTF-8, and a torn record is glued before the resumed one.
    lines[2] = lines[2][:20] + b"\xff" + lines[2][20:]
    lines.append(b'{"step": 5, "time": 1.0, "scal{"step": 5, "time": 2.0, "scalars": {"x": 1.0}}\n')
    path.write_bytes(b"".join(lines))
    with caplog.at_level(logging.WARNING):
        report = build_report([runs / "sgs_a", runs / "sgs_b"], runs / "out", n_subsets=0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"{path} line 3: skipped, not a readable metrics record (UnicodeDecodeError)",
                        f"{path} line {len(lines)}: skipped, not a readable metrics record (JSONDecodeError)"]
    assert f"`sgs_a` metrics.jsonl lines 3, {len(lines)}" in report.report_path.read_text(encoding="utf-8")
    assert report.configs[0].solve_rate.n == 2  # the rest of the run is read
