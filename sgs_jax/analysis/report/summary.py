"""What the per-config table says: each run's values, and their mean and range over seeds.

Rules (stated again under the table):
- Solve rates (all targets and the hard split) are read at the matched generation count,
  the largest count every run of every config reaches, by linear interpolation between
  the run's logged points.
- Per-iteration quantities (Solver entropy, synthetic solve-rate shares, conjecture
  fractions) are "final" as the mean over the last quarter of the run's iterations (at
  least the last one): single iterations see only a few conjectures. Step 0 (the baseline
  before training) is not an iteration.
- Entropy change is relative: final / iteration-1 value − 1.
- Synthetic shares at 0 and at 1 come from the `synthetic_solve_rate` histograms: the
  fraction of conjectures in the bucket whose upper limit is exactly 0 (resp. 1), exact
  for solve rates of k attempts (k + 1 distinct values, one bucket each).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from sgs_jax import metrics as m
from sgs_jax.analysis.groups import RunGroup, value_at_generations
from sgs_jax.analysis.report import metric_names as names
from sgs_jax.analysis.run_log import RunLog

LATE_WINDOW_FRACTION = 0.25  # "final" = the mean over this last fraction of iterations


@dataclasses.dataclass(frozen=True)
class Spread:
    """A quantity over the runs of a config: mean, min and max over the `n` runs that
    have it, out of `of` runs (all NaN when n is 0)."""

    mean: float
    low: float
    high: float
    n: int
    of: int


@dataclasses.dataclass(frozen=True)
class ConfigSummary:
    """One row of the per-config table. Rates and shares in [0, 1]; entropy in nats/token;
    entropy_change relative (−0.4 = fell by 40%); hacks: hack name -> fraction."""

    label: str
    seeds: tuple[int | None, ...]
    solve_rate: Spread
    hard_solve_rate: Spread
    final_entropy: Spread
    entropy_change: Spread
    synthetic_at_zero: Spread
    synthetic_at_one: Spread
    disjunctive_fraction: Spread
    hack_fractions: Mapping[str, Spread]


def spread(values: Sequence[float]) -> Spread:
    """Mean, min and max of the finite values; n counts them, `of` counts all."""
    finite = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if finite.size == 0:
        return Spread(math.nan, math.nan, math.nan, 0, len(values))
    return Spread(float(finite.mean()), float(finite.min()), float(finite.max()), int(finite.size), len(values))


def late_window(count: int) -> int:
    """How many of the last `count` iterations form the "final" window: a quarter, at least one."""
    return min(count, max(1, math.ceil(LATE_WINDOW_FRACTION * count)))


def _iteration_values(run: RunLog, name: str) -> np.ndarray:
    series = run.scalars.get(name)
    if series is None:
        return np.zeros(0)
    return series.values[series.steps >= 1]


def late_mean(run: RunLog, name: str) -> float:
    """Mean of the metric over the last quarter of the run's iterations (NaN when unlogged)."""
    values = _iteration_values(run, name)
    return float(values[-late_window(values.size):].mean()) if values.size else math.nan


def entropy_change(run: RunLog) -> float:
    """Final (late-window) Solver entropy relative to iteration 1's, minus 1."""
    values = _iteration_values(run, m.SOLVER_ENTROPY)
    if values.size == 0 or values[0] == 0:
        return math.nan
    return late_mean(run, m.SOLVER_ENTROPY) / float(values[0]) - 1.0


def synthetic_share(run: RunLog, rate: float) -> float:
    """Mean over the late window of histogram records of the share of conjectures whose
    synthetic solve rate is exactly `rate` (empty records are not counted)."""
    snapshots = [s for s in run.histograms.get(m.SYNTHETIC_SOLVE_RATE, ()) if s.step >= 1 and s.counts.sum() > 0]
    if not snapshots:
        return math.nan
    shares = [float(s.counts[s.limits == rate].sum() / s.counts.sum()) for s in snapshots]
    return float(np.mean(shares[-late_window(len(shares)):]))


def hack_names(runs: Sequence[RunLog]) -> list[str]:
    """The hacks any run logs a fraction for (`conjectures/hack/<hack>_fraction`)."""
    return names.family((name for run in runs for name in run.scalars), names.HACK_PREFIX, names.HACK_SUFFIX)


def summarize_config(group: RunGroup, matched: float, hacks: Sequence[str]) -> ConfigSummary:
    """The table row of a config: solve rates at `matched` generations, late-window values."""
    runs = group.runs

    def over_runs(value) -> Spread:
        return spread([value(run) for run in runs])

    return ConfigSummary(
        label=group.label,
        seeds=group.seeds,
        solve_rate=over_runs(lambda run: value_at_generations(run, m.CUMULATIVE_SOLVE_RATE, matched)),
        hard_solve_rate=over_runs(lambda run: value_at_generations(run, names.HARD_SOLVE_RATE, matched)),
        final_entropy=over_runs(lambda run: late_mean(run, m.SOLVER_ENTROPY)),
        entropy_change=over_runs(entropy_change),
        synthetic_at_zero=over_runs(lambda run: synthetic_share(run, 0.0)),
        synthetic_at_one=over_runs(lambda run: synthetic_share(run, 1.0)),
        disjunctive_fraction=over_runs(lambda run: late_mean(run, m.CONJECTURE_DISJUNCTIVE_FRACTION)),
        hack_fractions={hack: over_runs(lambda run, h=hack: late_mean(run, f"{names.HACK_PREFIX}{h}{names.HACK_SUFFIX}"))
                        for hack in hacks},
    )
