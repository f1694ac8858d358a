"""PNG figures of runs' metrics, drawn with matplotlib's Agg canvas (no display needed).

Every function takes the run groups (one per config), their styles (one fixed colour and
marker per config, the same in every figure) and a path; it draws only what the runs
logged and returns the path written, or None when no run has the metric (nothing is
written then). Line figures draw each config's mean over its runs with markers and a
shaded min–max band, on a grid every run of the config covers (`analysis.groups`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

from sgs_jax import metrics as m
from sgs_jax.analysis.groups import RunGroup, against_generations, band
from sgs_jax.analysis.report import metric_names as names
from sgs_jax.analysis.run_log import HistogramSnapshot, RunLog
from sgs_jax.analysis.scaling import ScalingFit

HEATMAP_MAX_ROWS = 64  # distinct bucket limits shown as rows; beyond, rebinned
HEATMAP_BINS = 20
HEATMAP_MIN_FRACTION = 1e-3  # the log colour scale starts here (smaller shares look empty)
# Configs of configs/*.py keep their colour in every report; other labels take the rest in order.
KNOWN_CONFIG_COLORS = {
    "sgs": "tab:blue", "rl_baseline": "tab:orange", "no_guide": "tab:green", "cispo_sgs": "tab:red",
    "cispo_solver_only": "tab:purple", "ei_solver_only": "tab:brown", "frozen_conjecturer": "tab:pink",
    "no_problem_conditioning": "tab:olive",
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


@dataclasses.dataclass(frozen=True)
class Style:
    """How one config is drawn everywhere: a matplotlib colour and marker."""

    color: str
    marker: str


@dataclasses.dataclass(frozen=True)
class Baseline:
    """A target set's own statement shape, drawn as reference lines.
    disjunctive_fraction in [0, 1]; mean_conclusion_length in characters; color None = black."""

    disjunctive_fraction: float
    mean_conclusion_length: float
    label: str = "targets (this run)"
    color: str | None = None


@dataclasses.dataclass(frozen=True)
class Panel:
    """One axes of a line figure: the metric (the first of `names` that a run logged is
    drawn, so old and new names both work), its y label, and whether it is a rate (shown
    in percent). references: horizontal (value, label, colour or None) lines."""

    names: tuple[str, ...]
    ylabel: str
    percent: bool = False
    references: tuple[tuple[float, str, str | None], ...] = ()


def group_styles(labels: Sequence[str]) -> dict[str, Style]:
    """A distinct colour and marker per label: the fixed colour of a known config, else
    the next colour of matplotlib's tab10/tab20 that no label uses yet."""
    taken = {to_hex(KNOWN_CONFIG_COLORS[label]) for label in labels if label in KNOWN_CONFIG_COLORS}
    spare = [to_hex(c) for c in list(colormaps["tab10"].colors) + list(colormaps["tab20"].colors)[1::2]]
    spare = [c for c in dict.fromkeys(spare) if c not in taken]
    styles = {}
    for index, label in enumerate(dict.fromkeys(labels)):
        color = KNOWN_CONFIG_COLORS.get(label) or (spare.pop(0) if spare else "grey")
        styles[label] = Style(color, MARKERS[index % len(MARKERS)])
    return styles


def _save(fig: Figure, path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # Agg: draws without a display
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _count_label(value: float, _position=None) -> str:
    """Generation counts as 0, 950, 12k, 1.5M (thousands separators overlap at 5 ticks)."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.0f}"


def _log_minor_label(value: float, _position=None) -> str:
    """Minor ticks of a log axis: labelled at 2 and 5 times a power of ten only."""
    mantissa = value / 10 ** np.floor(np.log10(value)) if value > 0 else 0.0
    return _count_label(value) if np.isclose(mantissa, 2) or np.isclose(mantissa, 5) else ""


def _first_logged(run: RunLog, metric_names: Sequence[str]) -> str | None:
    return next((name for name in metric_names if name in run.scalars), None)


def _series(run: RunLog, name: str, by_generations: bool) -> tuple[np.ndarray, np.ndarray]:
    if by_generations:
        return against_generations(run, name)
    series = run.scalars[name]
    return series.steps.astype(np.float64), series.values


def _figure_legend(fig: Figure, axes) -> None:
    """One legend for the whole figure, below it, each label once."""
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="upper center", bbox_to_anchor=(0.5, 0.0),
                   ncol=min(len(handles), 4), fontsize=8, frameon=False)


def _draw_band(ax, group: RunGroup, style: Style, metric_names: Sequence[str], by_generations: bool) -> bool:
    """The group's mean and min–max band of the metric on `ax`; False when no run has it."""
    series, shadow = [], False
    for run in group.runs:
        name = _first_logged(run, metric_names)
        if name is None:
            continue
        x, y = _series(run, name, by_generations)
        if x.size:
            series.append((x, y))
            shadow |= name.startswith(names.GUIDE_SHADOW_PREFIX)
    if not series:
        return False
    notes = ["shadow Guide"] if shadow else []
    summary = band([x for x, _ in series], [y for _, y in series])
    if summary is None:  # the runs share no range: each run on its own, thin
        label = group.label + (f" ({'; '.join(notes + ['runs apart'])})")
        for x, y in series:
            ax.plot(x, y, color=style.color, marker=style.marker, markersize=3, linewidth=0.8, label=label)
        return True
    if summary.n_runs > 1:
        notes.append(f"mean of {summary.n_runs}, min–max")
    label = group.label + (f" ({'; '.join(notes)})" if notes else "")
    if summary.n_runs > 1:
        ax.fill_between(summary.x, summary.low, summary.high, color=style.color, alpha=0.18, linewidth=0)
    ax.plot(summary.x, summary.mean, color=style.color, marker=style.marker, markersize=4, linewidth=1.5,
            label=label)
    return True


def line_figure(groups: Sequence[RunGroup], styles: Mapping[str, Style], panels: Sequence[Panel],
                path: pathlib.Path, title: str, vline: tuple[float, str] | None = None) -> pathlib.Path | None:
    """One axes per panel, a mean line with a min–max band per config. x: generations
    when every run with the metric logs them, else step. vline: (x, label) drawn when
    inside the data."""
    panels = [p for p in panels if any(_first_logged(run, p.names) for g in groups for run in g.runs)]
    if not panels:
        return None
    fig = Figure(figsize=(5.5 * len(panels), 4.0))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        runs = [run for g in groups for run in g.runs if _first_logged(run, panel.names)]
        by_generations = all(m.GENERATIONS in run.scalars for run in runs)
        x_max = 0.0
        for group in groups:
            _draw_band(ax, group, styles[group.label], panel.names, by_generations)
        for line in ax.get_lines():
            x_max = max(x_max, float(np.nanmax(line.get_xdata())) if len(line.get_xdata()) else 0.0)
        for value, label, color in panel.references:
            ax.axhline(value, color=color or "black", linestyle="--", linewidth=1, label=label)
        if vline is not None and by_generations and vline[0] <= x_max:
            ax.axvline(vline[0], color="grey", linestyle=":", linewidth=1, label=vline[1])
        ax.set_xlabel("generations" if by_generations else "step")
        ax.xaxis.set_major_locator(MaxNLocator(6, integer=True))
        ax.xaxis.set_major_formatter(FuncFormatter(_count_label))
        ax.set_ylabel(panel.ylabel)
        if panel.percent:
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(alpha=0.3)
    _figure_legend(fig, axes)
    fig.suptitle(title)
    return _save(fig, path)


def solve_rate_figure(groups: Sequence[RunGroup], styles: Mapping[str, Style], path: pathlib.Path,
                      matched_generations: float) -> pathlib.Path | None:
    """Cumulative solve rate against generations: all targets, and the hard split when logged."""
    return line_figure(groups, styles, [
        Panel((m.CUMULATIVE_SOLVE_RATE,), "cumulative solve rate, all targets", percent=True),
        Panel((names.HARD_SOLVE_RATE,), "cumulative solve rate, hard split", percent=True),
    ], path, "cumulative solve rate", vline=(matched_generations, "matched generations"))


def solve_rate_bands_figure(groups: Sequence[RunGroup], styles: Mapping[str, Style],
                            path: pathlib.Path) -> pathlib.Path | None:
    """Cumulative solve rate per difficulty band (`cumulative_solve_rate/band/<band>`)."""
    bands = names.family((n for g in groups for run in g.runs for n in run.scalars), names.SOLVE_RATE_BAND_PREFIX)
    return line_figure(groups, styles, [Panel((names.SOLVE_RATE_BAND_PREFIX + b,), f"solve rate, band {b}",
                                              percent=True) for b in bands],
                       path, "cumulative solve rate by difficulty band")


def scaling_fit_figure(groups: Sequence[RunGroup], styles: Mapping[str, Style], fits: Mapping[str, ScalingFit],
                       path: pathlib.Path, min_generations: float) -> pathlib.Path | None:
    """Each run's cumulative solve rate (points, log x) and its fitted curve over the
    fitted range; the "fit starts" line only when it lies inside the data."""
    curves = [(group, run, *against_generations(run, m.CUMULATIVE_SOLVE_RATE)) for group in groups for run in group.runs]
    curves = [(group, run, x[x > 0], y[x > 0]) for group, run, x, y in curves if np.any(x > 0)]
    if not curves:
        return None
    fig = Figure(figsize=(7.0, 4.5))
    ax = fig.subplots()
    for group, run, x, y in curves:
        style = styles[group.label]
        ax.plot(x, y, linestyle="none", marker=style.marker, markersize=3, color=style.color, label=group.label)
        fit = fits.get(run.name)
        if fit is not None:
            grid = np.geomspace(max(min_generations, x.min()), x.max(), 200)  # the fitted range
            ax.plot(grid, fit.predict(grid), color=style.color, linewidth=1.2, label=f"{group.label} fits")
    if min_generations <= max(float(x.max()) for _, _, x, _ in curves):
        ax.axvline(min_generations, color="grey", linestyle=":", linewidth=1, label="fit starts")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_count_label))
    ax.xaxis.set_minor_formatter(FuncFormatter(_log_minor_label))
    ax.set_xlabel("generations")
    ax.set_ylabel("cumulative solve rate")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(alpha=0.3, which="both")
    _figure_legend(fig, [ax])
    fig.suptitle("scaling fits, one curve per run")
    return _save(fig, path)


def conjecture_shape_figure(groups: Sequence[RunGroup], styles: Mapping[str, Style],
                            baselines: Sequence[Baseline], path: pathlib.Path) -> pathlib.Path | None:
    """Disjunctive fraction and mean conclusion length of conjectures vs the targets'."""
    return line_figure(groups, styles, [
        Panel((m.CONJECTURE_DISJUNCTIVE_FRACTION,), "disjunctive conclusions", percent=True,
              references=tuple((b.disjunctive_fraction, b.label, b.color) for b in baselines)),
        Panel((m.CONJECTURE_MEAN_CONCLUSION_LENGTH,), "mean conclusion length (chars)",
              references=tuple((b.mean_conclusion_length, b.label, b.color) for b in baselines)),
    ], path, "conjectures vs targets")


def conjecture_hacks_figure(groups: Sequence[RunGroup], styles: Mapping[str, Style], hacks: Sequence[str],
                            path: pathlib.Path) -> pathlib.Path | None:
    """The fraction of conjectures showing each reward hack, and the ill-formed ones dropped."""
    panels = [Panel((f"{names.HACK_PREFIX}{h}{names.HACK_SUFFIX}",), f"hack: {h}", percent=True) for h in hacks]
    panels.append(Panel((names.ILL_FORMED,), "ill-formed conjectures dropped (count)"))
    return line_figure(groups, styles, panels, path, "conjecture reward hacks and ill-formed conjectures")


def solver_entropy_figure(groups: Sequence[RunGroup], styles: Mapping[str, Style],
                          path: pathlib.Path) -> pathlib.Path | None:
    """Mean per-token Solver entropy over training."""
    return line_figure(groups, styles, [Panel((m.SOLVER_ENTROPY,), "entropy (nats/token)")], path, "Solver entropy")


def clip_fraction_figure(groups: Sequence[RunGroup], styles: Mapping[str, Style],
                         path: pathlib.Path) -> pathlib.Path | None:
    """Fraction of Solver tokens whose CISPO importance ratio was clipped."""
    return line_figure(groups, styles, [Panel(names.CLIP_FRACTIONS, "clipped tokens", percent=True)],
                       path, "CISPO clip fraction (Solver)")


def guide_scores_figure(groups: Sequence[RunGroup], styles: Mapping[str, Style],
                        path: pathlib.Path) -> pathlib.Path | None:
    """Mean Guide sub-scores of the conjectures: the Guide's own (rewarded) scores, or the
    shadow scores of runs without a Guide (logged, never rewarded)."""
    panels = []
    for name in names.GUIDE_SUBSCORES:
        subscore = name[len(names.GUIDE_PREFIX):]
        panels.append(Panel((name, names.GUIDE_SHADOW_PREFIX + subscore), f"Guide {subscore.replace('_', ' ')}"))
    return line_figure(groups, styles, panels, path, "Guide scores of conjectures")


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


def pooled_snapshots(runs: Sequence[RunLog], name: str) -> tuple[HistogramSnapshot, ...]:
    """One snapshot per step pooling the runs' histograms of `name`, each run's counts
    scaled to sum to 1 first, so every run weighs the same at that step."""
    by_step: dict[int, list[HistogramSnapshot]] = {}
    for run in runs:
        for snap in run.histograms.get(name, ()):
            if snap.counts.sum() > 0:
                by_step.setdefault(snap.step, []).append(snap)
    return tuple(HistogramSnapshot(step, np.concatenate([s.limits for s in snaps]),
                                   np.concatenate([s.counts / s.counts.sum() for s in snaps]))
                 for step, snaps in sorted(by_step.items()))


def synthetic_histogram_figure(groups: Sequence[RunGroup], styles: Mapping[str, Style],
                               path: pathlib.Path) -> pathlib.Path | None:
    """Heatmap per config: share of conjectures at each synthetic solve rate (rows) per
    step (columns), pooled over the config's runs, on a log colour scale (empty cells grey)."""
    pooled = [(group, pooled_snapshots(group.runs, m.SYNTHETIC_SOLVE_RATE)) for group in groups]
    pooled = [(group, snaps) for group, snaps in pooled if snaps]
    if not pooled:
        return None
    fig = Figure(figsize=(5.5 * len(pooled), 4.0), layout="constrained")
    axes = fig.subplots(1, len(pooled), squeeze=False)[0]
    cmap = colormaps["viridis"].with_extremes(bad="#eeeeee")
    for ax, (group, snapshots) in zip(axes, pooled):
        rows, matrix = histogram_matrix(snapshots)
        steps = [s.step for s in snapshots]
        shown = np.ma.masked_less(matrix, HEATMAP_MIN_FRACTION)
        image = ax.imshow(shown, aspect="auto", origin="lower", cmap=cmap, interpolation="nearest",
                          norm=LogNorm(vmin=HEATMAP_MIN_FRACTION, vmax=1.0))
        ax.set_yticks(range(rows.size))
        ax.set_yticklabels([f"{v:.3g}" for v in rows], fontsize=7)
        ticks = np.linspace(0, len(steps) - 1, min(len(steps), 8)).astype(int)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(steps[i]) for i in ticks])
        ax.set_xlabel("step")
        ax.set_ylabel("synthetic solve rate")
        n_runs = sum(1 for run in group.runs if run.histograms.get(m.SYNTHETIC_SOLVE_RATE))
        ax.set_title(group.label + (f" ({n_runs} runs pooled)" if n_runs > 1 else ""), color=styles[group.label].color)
        fig.colorbar(image, ax=ax, label="fraction of conjectures (log)")
    return _save(fig, path)
