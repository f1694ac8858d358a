"""sgs-report on two small synthetic runs: figures, the table, both log sources."""

import json
import pathlib

import numpy as np
import pytest
from matplotlib.image import imread

from sgs_jax import metrics as m
from sgs_jax.analysis.report.build import build_report
from sgs_jax.analysis.report.figures import histogram_matrix
from sgs_jax.analysis.run_log import HistogramSnapshot
from sgs_jax.analysis.scaling import fit_scaling_curve
from sgs_jax.cli.report import main
from synthetic_runs import write_synthetic_run

ALL_FIGURES = {"solve_rate", "solve_rate_bands", "scaling_fit", "conjecture_shape", "conjecture_hacks",
               "guide_scores", "solver_entropy", "synthetic_solve_rate", "cispo_clip_fraction"}
# What write_synthetic_run logs: no difficulty bands, hacks or Guide scores.
SYNTHETIC_FIGURES = ALL_FIGURES - {"solve_rate_bands", "conjecture_hacks", "guide_scores"}


@pytest.fixture
def two_runs(tmp_path):
    sgs = write_synthetic_run(tmp_path / "sgs", iterations=40, generations_per_iteration=200_000, seed=0)
    cispo = write_synthetic_run(tmp_path / "cispo", A=0.575, iterations=40, generations_per_iteration=200_000,
                                cispo=True, disjunctive_growth=0.02, seed=1)
    return tmp_path, {"sgs": sgs, "cispo": cispo}


def test_report_writes_figures_and_table(two_runs):
    root, data = two_runs
    report = build_report([root / "sgs", root / "cispo"], root / "out", n_subsets=10)
    assert set(report.figures) == SYNTHETIC_FIGURES
    assert set(report.skipped_figures) == ALL_FIGURES - SYNTHETIC_FIGURES
    assert report.min_generations == 100_000  # paper scale: 7.8M generations
    for path in report.figures.values():
        image = imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert image[..., :3].std() > 0.01  # something was drawn
    rows = {row.name: row for row in report.rows}
    for name, (generations, rates) in data.items():
        row = rows[name]
        direct = fit_scaling_curve(generations, rates)  # the same data, fitted directly
        assert row.fit.full.A == pytest.approx(direct.A, abs=1e-9)
        assert row.final_solve_rate == rates[-1] and row.final_generations == generations[-1]
        assert np.isfinite(row.fit.A_std) and len(row.fit.subset_A) + row.fit.failed_refits == 10
    assert rows["sgs"].fit.full.A == pytest.approx(0.671, abs=0.01)
    assert rows["cispo"].fit.full.A == pytest.approx(0.575, abs=0.01)
    text = report.report_path.read_text(encoding="utf-8")
    for name, row in rows.items():
        line = next(l for l in text.splitlines() if l.startswith(f"| {name} | {name} |"))
        assert f"{100 * row.fit.full.A:.1f}% ± {100 * row.fit.A_std:.1f} pp" in line
        assert f"{row.fit.full.C_mid:,.0f}" in line and f"{row.fit.full.B:.3f}" in line
    for path in report.figures.values():
        assert f"]({path.name})" in text
    # No --targets: the baseline is the one the runs logged.
    (baseline,) = report.baselines
    assert baseline.disjunctive_fraction == pytest.approx(0.042) and baseline.label == "targets (these runs)"


def test_tensorboard_and_jsonl_reports_agree(two_runs):
    root, _ = two_runs
    a = build_report([root / "sgs", root / "cispo"], root / "a", source="jsonl", n_subsets=5)
    b = build_report([root / "sgs", root / "cispo"], root / "b", source="tensorboard", n_subsets=5)
    for ra, rb in zip(a.rows, b.rows):
        assert ra.name == rb.name
        assert rb.fit.full.A == pytest.approx(ra.fit.full.A, abs=1e-5)  # float32 inputs
        assert rb.final_solve_rate == pytest.approx(ra.final_solve_rate, rel=1e-7)
    assert set(b.figures) == SYNTHETIC_FIGURES


def test_cli_with_targets_baseline(two_runs, capsys):
    root, _ = two_runs
    targets = {"iterations": [], "target_statements": {
        "a": {"theorem": "theorem a : x = 1 ∨ x = 2 := by"},
        "b": {"theorem": "theorem b (h : p ∨ q) : x = 1 := by"},
    }}
    (root / "targets.json").write_text(json.dumps(targets), encoding="utf-8")
    code = main(["--runs", str(root / "sgs"), str(root / "cispo"), "--out", str(root / "cli"),
                 "--targets", str(root / "targets.json"), "--subsets", "3", "--source", "tensorboard"])
    assert code == 0
    out = capsys.readouterr().out
    assert "| sgs | sgs |" in out and "| cispo | cispo |" in out
    assert "2 of 2 statements parsed; disjunctive conclusions 50.0%" in out
    assert "mean conclusion length 9.0 characters" in out  # (13 + 5) / 2
    assert all((root / "cli" / f"{name}.png").exists() for name in SYNTHETIC_FIGURES)


def test_run_without_fit_or_optional_metrics(tmp_path):
    with m.MetricsWriter(tmp_path / "short") as writer:
        for step in range(3):
            writer.write_scalars(step, {m.GENERATIONS: 200_000 * step, m.CUMULATIVE_SOLVE_RATE: 0.3 + 0.01 * step})
    report = build_report([tmp_path / "short"], tmp_path / "out", n_subsets=3)
    (row,) = report.rows
    assert row.fit is None and "too few points" in row.fit_error
    assert set(report.figures) == {"solve_rate", "scaling_fit"}
    assert set(report.skipped_figures) == ALL_FIGURES - {"solve_rate", "scaling_fit"}
    text = report.report_path.read_text(encoding="utf-8")
    assert "no fit: too few points" in text and "Not drawn" in text


def test_cli_reports_missing_runs(tmp_path, capsys):
    assert main(["--runs", str(tmp_path / "absent"), "--out", str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_histogram_matrix_by_hand():
    snaps = (HistogramSnapshot(0, np.array([0.0, 0.5]), np.array([1.0, 3.0])),
             HistogramSnapshot(1, np.array([0.5, 1.0]), np.array([2.0, 2.0])),
             HistogramSnapshot(2, np.zeros(0), np.zeros(0)))
    rows, matrix = histogram_matrix(snaps)
    assert rows.tolist() == [0.0, 0.5, 1.0]
    np.testing.assert_allclose(matrix, [[0.25, 0.0, 0.0], [0.75, 0.5, 0.0], [0.0, 0.5, 0.0]], atol=1e-12)


def test_histogram_matrix_rebins_many_limits():
    limits = np.linspace(0.01, 1.0, 100)
    snaps = (HistogramSnapshot(0, limits, np.ones(100)),)
    rows, matrix = histogram_matrix(snaps)
    assert rows.size == 20 and matrix[:, 0].sum() == pytest.approx(1.0, abs=1e-12)
    # Bucket with upper limit v joins the first row whose upper edge is >= v.
    edges = np.linspace(0.01, 1.0, 21)[1:]
    brute = np.array([np.sum((limits <= e) & (limits > lo)) for lo, e in zip(np.r_[-np.inf, edges[:-1]], edges)])
    np.testing.assert_allclose(matrix[:, 0], brute / 100, atol=1e-12)


def test_kept_findings_runs_give_the_table_the_docs_quote(tmp_path):
    """docs/findings.md quotes seed 3 of the small-pair findings experiment from the run
    records kept in docs/findings/small_seed3: the report made from them again has the same
    cells (the docs' table drops the seed count and the final entropy)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    report = build_report(sorted((root / "docs" / "findings" / "small_seed3").glob("*_seed3")), tmp_path,
                          targets_path=root / "sgs_jax" / "testbed" / "data" / "targets_small.json", n_subsets=2)
    docs = (root / "docs" / "findings.md").read_text(encoding="utf-8")
    lines = [l for l in report.report_path.read_text(encoding="utf-8").splitlines() if "| 1 (3) |" in l]
    assert {l.split(" | ")[0] for l in lines} == {"| sgs", "| rl_baseline", "| no_guide", "| cispo_sgs"}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        quoted = [cells[0]] + cells[2:4] + cells[5:]  # name, solve rates, entropy change, ...
        assert "| " + " | ".join(quoted) + " |" in docs, quoted
