"""PNG figures of runs' metrics, drawn with matplotlib's Agg canvas (no display needed).

Every function takes RunLogs and a path, draws only what the runs logged, and returns
the path written, or None when no run has the metric (nothing is written then).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sgs_jax import metrics as m
from sgs_jax.analysis.run_log import HistogramSnapshot, RunLog
from sgs_jax.analysis.scaling import ScalingFit

HEATMAP_MAX_ROWS = 64  # distinct bucket limits shown as rows; beyond, rebinned
HEATMAP_BINS = 20


@dataclasses.dataclass(frozen=True)
class Baseline:
    """The target set's own statement shape, drawn as reference lines.
    disjunctive_fraction in [0, 1]; mean_conclusion_length in characters."""

    disjunctive_fraction: float
    mean_conclusion_length: float
    label: str = "targets"


def _save(fig: Figure, path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # Agg: draws without a display
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _against_generations(run: RunLog, name: str) -> tuple[np.ndarray, np.ndarray, str]:
    """(x, y, x label): y against generations when the run logs them, else against step."""
    x, y = run.paired(m.GENERATIONS, name)
    if x.size:
        return x, y, "generations"
    series = run.scalars[name]
    return series.steps.astype(np.float64), series.values, "step"


def _line_figure(runs: Sequence[RunLog], panels: Sequence[tuple[str, str, float | None]],
                 path: pathlib.Path, title: str) -> pathlib.Path | None:
    """One panel per (metric, y label, reference value or None); a line per run."""
    if not any(name in run.scalars for run in runs for name, _, _ in panels):
        return None
    fig = Figure(figsize=(6.0 * len(panels), 4.0))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, ylabel, reference) in zip(axes, panels):
        xlabel = "step"
        for run in runs:
            if name in run.scalars:
                x, y, xlabel = _against_generations(run, name)
                ax.plot(x, y, marker=".", markersize=3, label=run.name)
        if reference is not None:
            ax.axhline(reference, color="black", linestyle="--", linewidth=1, label="targets baseline")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)


def solve_rate_figure(runs: Sequence[RunLog], fits: Mapping[str, ScalingFit], path: pathlib.Path,
                      min_generations: float) -> pathlib.Path | None:
    """Cumulative solve rate against generations (log x), with each run's fitted curve."""
    curves = [(run, *run.paired(m.GENERATIONS, m.CUMULATIVE_SOLVE_RATE)) for run in runs]
    curves = [(run, x, y) for run, x, y in curves if x.size]
    if not curves:
        return None
    fig = Figure(figsize=(7.0, 4.5))
    ax = fig.subplots()
    for run, x, y in curves:
        points = ax.plot(x, y, ".", markersize=3, label=run.name)[0]
        fit = fits.get(run.name)
        if fit is not None:
            grid = np.geomspace(max(min_generations, 1.0), x.max(), 200)  # the fitted range
            ax.plot(grid, fit.predict(grid), color=points.get_color(),
                    label=f"{run.name} fit: A={100 * fit.A:.1f}%")
    ax.axvline(min_generations, color="grey", linestyle=":", linewidth=1, label="fit starts")
    ax.set_xscale("log")
    ax.set_xlabel("generations")
    ax.set_ylabel("cumulative solve rate")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, path)


def conjecture_shape_figure(runs: Sequence[RunLog], baseline: Baseline | None,
                            path: pathlib.Path) -> pathlib.Path | None:
    """Disjunctive fraction and mean conclusion length of conjectures vs the targets'."""
    return _line_figure(runs, [
        (m.CONJECTURE_DISJUNCTIVE_FRACTION, "disjunctive conclusions (fraction)",
         baseline.disjunctive_fraction if baseline else None),
        (m.CONJECTURE_MEAN_CONCLUSION_LENGTH, "mean conclusion length (chars)",
         baseline.mean_conclusion_length if baseline else None),
    ], path, "conjectures vs targets")


def solver_entropy_figure(runs: Sequence[RunLog], path: pathlib.Path) -> pathlib.Path | None:
    """Mean per-token Solver entropy over training."""
    return _line_figure(runs, [(m.SOLVER_ENTROPY, "entropy (nats/token)", None)], path, "Solver entropy")


def clip_fraction_figure(runs: Sequence[RunLog], path: pathlib.Path) -> pathlib.Path | None:
    """Fraction of CISPO tokens whose importance ratio was clipped."""
    return _line_figure(runs, [(m.CISPO_CLIP_FRACTION, "clipped tokens (fraction)", None)],
                        path, "CISPO clip fraction")


def histogram_matrix(snapshots: Sequence[HistogramSnapshot]) -> tuple[np.ndarray, np.ndarray]:
    """Common rows for histograms over time: (row values [r], fractions [r, t]).

    Rows are the distinct bucket limits when there are at most HEATMAP_MAX_ROWS of them
    (exact for solve rates k/8), else HEATMAP_BINS equal bins (row value: upper edge)
    that each bucket joins by its upper limit. Column t sums to 1 (0 when empty).
    """
    limits = np.unique(np.concatenate([s.limits for s in snapshots])) if snapshots else np.zeros(0)
    if limits.size > HEATMAP_MAX_ROWS:
        limits = np.linspace(limits.min(), limits.max(), HEATMAP_BINS + 1)[1:]
    matrix = np.zeros((limits.size, len(snapshots)))
    for t, snap in enumerate(snapshots):
        rows = np.minimum(np.searchsorted(limits, snap.limits, side="left"), limits.size - 1)
        np.add.at(matrix[:, t], rows, snap.counts)
        total = matrix[:, t].sum()
        if total > 0:
            matrix[:, t] /= total
    return limits, matrix


def synthetic_histogram_figure(runs: Sequence[RunLog], path: pathlib.Path) -> pathlib.Path | None:
    """Heatmap per run: share of conjectures at each solve rate (rows) per step (columns)."""
    with_data = [run for run in runs if run.histograms.get(m.SYNTHETIC_SOLVE_RATE)]
    if not with_data:
        return None
    fig = Figure(figsize=(6.0 * len(with_data), 4.0))
    axes = fig.subplots(1, len(with_data), squeeze=False)[0]
    for ax, run in zip(axes, with_data):
        snapshots = run.histograms[m.SYNTHETIC_SOLVE_RATE]
        rows, matrix = histogram_matrix(snapshots)
        steps = [s.step for s in snapshots]
        image = ax.imshow(matrix, aspect="auto", origin="lower", cmap="viridis", vmin=0.0,
                          interpolation="nearest")
        ax.set_yticks(range(rows.size))
        ax.set_yticklabels([f"{v:.3g}" for v in rows], fontsize=7)
        ticks = np.linspace(0, len(steps) - 1, min(len(steps), 8)).astype(int)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(steps[i]) for i in ticks])
        ax.set_xlabel("step")
        ax.set_ylabel("synthetic solve rate")
        ax.set_title(run.name)
        fig.colorbar(image, ax=ax, label="fraction of conjectures")
    return _save(fig, path)
