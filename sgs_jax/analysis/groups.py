"""Runs grouped by config, and a group's metric on a common generation grid.

A group holds every run of one config: runs with the same label, which is an explicit
label when one is given, else the `experiment` name the run recorded in its config.json,
else the run's folder name. `sgs-experiments` records the entry's label as `experiment`,
so the seeds of one entry form one group.

Grids and interpolation: each run is linearly interpolated between its logged points
(cumulative counts are only observed at iteration ends); a group's grid spans only the
generations every one of its runs covers, so the band never extrapolates.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Sequence

import numpy as np

from sgs_jax import metrics as m
from sgs_jax.analysis.run_log import RunLog, read_run_config


@dataclasses.dataclass(frozen=True, eq=False)
class RunGroup:
    """The runs of one config. seeds[i]: run i's `run.seed` (None when not recorded)."""

    label: str
    runs: tuple[RunLog, ...]
    seeds: tuple[int | None, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Band:
    """A group's metric on a common grid: x [g] (generations or steps), the mean, min and
    max over its runs [g] each, and how many runs it covers."""

    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n_runs: int


def run_identity(run_dir: str | pathlib.Path, label: str | None = None) -> tuple[str, int | None]:
    """(label, seed) of a run folder: the explicit `label`, else config.json's `experiment`,
    else the folder name; the seed is config.json's `run.seed` (None when absent)."""
    config = read_run_config(run_dir) or {}
    recorded = config.get("experiment")
    if not label:
        label = recorded if isinstance(recorded, str) and recorded else pathlib.Path(run_dir).name
    run = config.get("run")
    seed = run.get("seed") if isinstance(run, dict) else None
    return label, seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def group_runs(runs: Sequence[RunLog], labels: Sequence[str],
               seeds: Sequence[int | None] | None = None) -> tuple[RunGroup, ...]:
    """Groups of runs sharing a label, in order of each label's first appearance (runs keep
    their order inside a group). labels[i] and seeds[i] belong to runs[i]."""
    if len(labels) != len(runs) or (seeds is not None and len(seeds) != len(runs)):
        raise ValueError(f"need one label (and seed) per run: {len(runs)} runs, {len(labels)} labels")
    seeds = list(seeds) if seeds is not None else [None] * len(runs)
    members: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        members.setdefault(label, []).append(index)
    return tuple(RunGroup(label, tuple(runs[i] for i in idx), tuple(seeds[i] for i in idx))
                 for label, idx in members.items())


def interpolate(x: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """y(x) linearly interpolated at `grid` [g]; NaN outside [x[0], x[-1]]. x [n] must be
    non-decreasing; of repeated x values the last point wins (the later write)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    grid = np.asarray(grid, dtype=np.float64)
    out = np.full(grid.shape, np.nan)
    if x.size == 0:
        return out
    if np.any(np.diff(x) < 0):
        raise ValueError("x must be non-decreasing (a run's log in step order)")
    last_of_each = np.r_[x[1:] != x[:-1], True]
    x, y = x[last_of_each], y[last_of_each]
    inside = (grid >= x[0]) & (grid <= x[-1])
    out[inside] = np.interp(grid[inside], x, y)
    return out


def common_grid(xs: Sequence[np.ndarray]) -> np.ndarray:
    """Points every series covers: from the largest first x to the smallest last x. The
    series' own points when they all share them (no interpolation needed), else as many
    evenly spaced points as the median series has in that range (rounded up, at least 2). Empty when the ranges
    do not overlap or no series is given."""
    xs = [np.asarray(x, dtype=np.float64) for x in xs if np.size(x)]
    if not xs:
        return np.zeros(0)
    lo, hi = max(x[0] for x in xs), min(x[-1] for x in xs)
    if lo > hi:
        return np.zeros(0)
    inside = [np.unique(x[(x >= lo) & (x <= hi)]) for x in xs]
    if all(np.array_equal(inside[0], points) for points in inside[1:]):
        return inside[0]
    count = max(2, math.ceil(np.median([points.size for points in inside])))
    return np.linspace(lo, hi, count)


def band(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> Band | None:
    """Mean, min and max of the series (x_i [n_i], y_i [n_i]) on their common grid; None
    when they share no range."""
    grid = common_grid(xs)
    if grid.size == 0:
        return None
    values = np.stack([interpolate(x, y, grid) for x, y in zip(xs, ys)])  # [runs, g], finite on the grid
    return Band(grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0), len(xs))


def against_generations(run: RunLog, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(generations, values) at the steps where the run logged both; empty when it lacks either."""
    return run.paired(m.GENERATIONS, name)


def final_generations(run: RunLog) -> float:
    """The run's last logged generation count (NaN when it logs none)."""
    series = run.scalars.get(m.GENERATIONS)
    return float(series.values[-1]) if series is not None and series.values.size else math.nan


def matched_generations(runs: Sequence[RunLog]) -> float:
    """The largest generation count that every run reaches: the smallest final count
    (NaN when a run logs no generations)."""
    finals = [final_generations(run) for run in runs]
    return min(finals) if finals and all(math.isfinite(f) for f in finals) else math.nan


def value_at_generations(run: RunLog, name: str, generations: float) -> float:
    """The run's metric interpolated at one generation count (NaN outside its range)."""
    x, y = against_generations(run, name)
    return float(interpolate(x, y, np.array([generations]))[0])
