"""What the report's figures draw: read from the matplotlib figures before they are saved."""

import numpy as np
import pytest
from matplotlib.colors import LogNorm, to_hex

from sgs_jax import metrics as m
from sgs_jax.analysis.report import figures
from sgs_jax.analysis.report.build import build_report
from sgs_jax.analysis.run_log import HistogramSnapshot
from synthetic_runs import write_config, write_run, write_synthetic_run


@pytest.fixture
def drawn(monkeypatch):
    """Figures by file stem, captured as build_report saves them."""
    captured = {}
    save = figures._save

    def capture(fig, path):
        captured[path.stem] = fig
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", capture)
    return captured


def _legend_labels(fig):
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def _lines(fig, panel=0):
    return [line for line in fig.axes[panel].get_lines() if not line.get_label().startswith("_")]


@pytest.fixture
def testbed_runs(tmp_path):
    for label, seeds, kwargs in [("sgs", (1, 2), {}), ("cispo_sgs", (1,), {"cispo": True}),
                                 ("my_ablation", (1,), {"guide": False})]:
        for seed in seeds:
            run = tmp_path / f"{label}_seed{seed}"
            write_config(run, label, seed)
            write_synthetic_run(run, C_mid=4000, B=1.0, R0=0.2, A=0.5, iterations=11,
                                generations_per_iteration=1300 + 50 * seed, seed=seed, domain_metrics=True, **kwargs)
    return tmp_path


def test_one_colour_and_marker_per_config_in_every_figure(testbed_runs, drawn):
    build_report(sorted(testbed_runs.iterdir()), testbed_runs / "out", n_subsets=0)
    styles = {}
    for name in ("solve_rate", "solver_entropy", "conjecture_shape", "guide_scores"):
        for line in _lines(drawn[name]):
            label = line.get_label().split(" (")[0]
            if label.startswith("targets") or label == "matched generations":
                continue
            assert line.get_marker() not in (None, "", "None"), (name, label)  # lines carry markers
            styles.setdefault(label, set()).add((to_hex(line.get_color()), line.get_marker()))
    assert set(styles) == {"sgs", "cispo_sgs", "my_ablation"}
    assert all(len(s) == 1 for s in styles.values()), styles  # the same style everywhere
    assert {label: next(iter(s))[0] for label, s in styles.items()}["sgs"] == to_hex("tab:blue")
    assert len({next(iter(s))[0] for s in styles.values()}) == 3  # distinct colours
    # Two seeds: a mean line with a shaded min–max band; one seed: a plain line.
    labels = _legend_labels(drawn["solve_rate"])
    assert "sgs (mean of 2, min–max)" in labels and "cispo_sgs" in labels
    assert "my_ablation (shadow Guide)" in _legend_labels(drawn["guide_scores"])


def test_group_styles_keep_known_colours_and_never_collide():
    styles = figures.group_styles(["x", "rl_baseline", "y", "sgs"])
    assert styles["sgs"].color == "tab:blue" and styles["rl_baseline"].color == "tab:orange"
    colours = {to_hex(s.color) for s in styles.values()}
    assert len(colours) == 4 and len({s.marker for s in styles.values()}) == 4


def test_hard_split_panel_and_matched_generations_line(testbed_runs, drawn, tmp_path):
    build_report(sorted(testbed_runs.iterdir()), testbed_runs / "out", n_subsets=0)
    fig = drawn["solve_rate"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["cumulative solve rate, all targets",
                                                    "cumulative solve rate, hard split"]
    assert "matched generations" in _legend_labels(fig)
    # Without the hard split logged, one panel.
    write_run(tmp_path / "plain", [{m.GENERATIONS: g, m.CUMULATIVE_SOLVE_RATE: 0.1 + g / 1e4} for g in (0, 10, 20)])
    build_report([tmp_path / "plain"], tmp_path / "out2", n_subsets=0)
    assert len(drawn["solve_rate"].axes) == 1


def test_clip_fraction_reads_the_solver_name_and_the_old_one(tmp_path, drawn):
    for name, metric in (("new", "solver/clip_fraction"), ("old", m.CISPO_CLIP_FRACTION)):
        write_run(tmp_path / name, [{m.GENERATIONS: 10.0 * s, metric: 0.01 * s} for s in range(4)], experiment=name)
    report = build_report([tmp_path / "new", tmp_path / "old"], tmp_path / "out", n_subsets=0)
    assert "cispo_clip_fraction" in report.figures
    lines = _lines(drawn["cispo_clip_fraction"])
    assert sorted(line.get_label() for line in lines) == ["new", "old"]
    for line in lines:
        np.testing.assert_allclose(line.get_ydata(), [0.0, 0.01, 0.02, 0.03])


def test_fit_start_line_only_inside_the_data(testbed_runs, drawn):
    runs = sorted(testbed_runs.iterdir())
    report = build_report(runs, testbed_runs / "auto", n_subsets=0)
    assert report.min_generations == pytest.approx(0.1 * 10 * 1350)  # a tenth of the shortest run
    assert "fit starts" in _legend_labels(drawn["scaling_fit"])
    assert report.rows[0].fit is not None  # testbed-scale runs get a fit
    build_report(runs, testbed_runs / "paper", n_subsets=0, min_generations=100_000)
    assert "fit starts" not in _legend_labels(drawn["scaling_fit"])


def test_baseline_is_the_runs_own_targets(tmp_path, drawn):
    write_synthetic_run(tmp_path / "one", iterations=6, disjunctive_growth=0.05)
    report = build_report([tmp_path / "one"], tmp_path / "out", n_subsets=0)
    assert [b.label for b in report.baselines] == ["targets (this run)"]
    fig = drawn["conjecture_shape"]
    references = [line for line in fig.axes[0].get_lines() if line.get_label() == "targets (this run)"]
    assert len(references) == 1 and references[0].get_ydata()[0] == pytest.approx(0.042)
    # Two configs with different targets: one line each, in the config's colour.
    write_run(tmp_path / "other", [{m.GENERATIONS: 0.0, m.TARGET_DISJUNCTIVE_FRACTION: 0.3,
                                    m.TARGET_MEAN_CONCLUSION_LENGTH: 9.0},
                                   {m.GENERATIONS: 5.0, m.CONJECTURE_DISJUNCTIVE_FRACTION: 0.2}], experiment="sgs")
    report = build_report([tmp_path / "one", tmp_path / "other"], tmp_path / "out2", n_subsets=0)
    # "one" is no known config: it takes tab10's first colour that sgs (tab:blue) leaves free.
    assert [(b.label, b.color) for b in report.baselines] == [("targets (one)", to_hex("tab:orange")),
                                                              ("targets (sgs)", "tab:blue")]


def test_histogram_heatmap_pools_seeds_on_a_log_scale(testbed_runs, drawn):
    build_report(sorted(testbed_runs.iterdir()), testbed_runs / "out", n_subsets=0)
    fig = drawn["synthetic_solve_rate"]
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 3 and all(isinstance(image.norm, LogNorm) for image in images)
    titles = [ax.get_title() for ax in fig.axes if ax.images]  # runs sorted by folder name
    assert titles == ["cispo_sgs", "my_ablation", "sgs (2 runs pooled)"]


def test_pooled_snapshots_weigh_runs_equally():
    class Run:
        def __init__(self, snaps):
            self.histograms = {m.SYNTHETIC_SOLVE_RATE: snaps}

    a = Run((HistogramSnapshot(1, np.array([0.0, 1.0]), np.array([3.0, 1.0])),))
    b = Run((HistogramSnapshot(1, np.array([0.5]), np.array([10.0])),
             HistogramSnapshot(2, np.array([1.0]), np.array([2.0]))))
    pooled = figures.pooled_snapshots([a, b], m.SYNTHETIC_SOLVE_RATE)
    rows, matrix = figures.histogram_matrix(pooled)
    assert rows.tolist() == [0.0, 0.5, 1.0] and [s.step for s in pooled] == [1, 2]
    # Step 1: run a gives 3/4 at 0 and 1/4 at 1, run b all at 0.5; each weighs one half.
    np.testing.assert_allclose(matrix[:, 0], [0.375, 0.5, 0.125], atol=1e-15)
    np.testing.assert_allclose(matrix[:, 1], [0.0, 0.0, 1.0], atol=1e-15)
