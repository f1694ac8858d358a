"""Scaling-law fit of cumulative solve rate against generations (SPEC Section 10).

    R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)

R0 is fixed to the first observed rate (the first point overall, before points with
C < min_generations are dropped); A, C_mid and B are fitted by least squares with
`scipy.optimize.curve_fit` under the bounds R0 < A ≤ 1, C_mid > 0, 0 < B < 10.
C_mid is fitted as log(C_mid): it spans orders of magnitude, and the log keeps it
positive and the problem well scaled.

Which points are fitted depends on the scale of the runs (`scale_aware_min_generations`):
the paper drops the first 100,000 generations; a testbed run ends near 10,000, so there
the threshold is a tenth of the shortest run instead.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

DEFAULT_MIN_GENERATIONS = 100_000  # the paper's threshold (SPEC Section 10)
MIN_GENERATIONS_FRACTION = 0.1  # below paper scale: this fraction of the shortest run
MIN_POINTS = 5  # three free parameters plus at least two degrees of freedom
B_MAX = 10.0
# With less of the rise from R0 to A seen by the last point, A is pure extrapolation.
MIN_RISE_SEEN = 0.1
_OPEN = 1e-9  # keeps open interval ends (A > R0, B > 0, B < 10) strictly open


@dataclasses.dataclass(frozen=True)
class ScalingFit:
    """A fitted curve. A and R0 are solve rates in [0, 1]; C_mid is in generations;
    B is dimensionless. n_points: points fitted; rmse: root-mean-square residual
    (solve-rate units)."""

    A: float
    C_mid: float
    B: float
    R0: float
    n_points: int
    rmse: float

    def predict(self, generations: np.ndarray | Sequence[float]) -> np.ndarray:
        """The fitted solve rate at the given generation counts, shape as the input."""
        return scaling_curve(np.asarray(generations, dtype=np.float64), self.R0, self.A, self.C_mid, self.B)


@dataclasses.dataclass(frozen=True)
class ScalingRobustness:
    """Spread of the asymptote A over refits of the same run.

    truncated: (fraction of points dropped from the end, A) for each truncation.
    subset_A: A of each random-subset refit that succeeded.
    failed_refits: refits that raised (too few points, no curvature, ...).
    A_std: population standard deviation of A over all successful refits.
    A_range: max − min of A over all successful refits.
    """

    full: ScalingFit
    truncated: tuple[tuple[float, float], ...]
    subset_A: tuple[float, ...]
    failed_refits: int
    A_std: float
    A_range: float


def scaling_curve(generations: np.ndarray, R0: float, A: float, C_mid: float, B: float) -> np.ndarray:
    """R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B), elementwise; R(0) = R0."""
    c = np.asarray(generations, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        ratio = np.power(C_mid / c, B)
    return R0 + (A - R0) / (1.0 + ratio)


def scale_aware_min_generations(final_generations: Sequence[float]) -> float:
    """The fit threshold for runs ending at `final_generations` (one count per run):
    min(100,000, 0.1 x the smallest final count). Runs of a million generations or more
    get the paper's 100,000; shorter runs drop their first tenth. Raises ValueError when
    no count is given or one is not finite and positive."""
    finals = np.asarray(final_generations, dtype=np.float64)
    if finals.size == 0 or not np.all(np.isfinite(finals)) or np.any(finals <= 0):
        raise ValueError(f"final generation counts must be finite and positive, got {finals.tolist()}")
    return float(min(DEFAULT_MIN_GENERATIONS, MIN_GENERATIONS_FRACTION * finals.min()))


def _validated(generations, solve_rates) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(generations, dtype=np.float64)
    r = np.asarray(solve_rates, dtype=np.float64)
    if c.ndim != 1 or r.ndim != 1 or c.shape != r.shape:
        raise ValueError(f"generations and solve_rates must be 1-D of equal length, got {c.shape} and {r.shape}")
    if c.size == 0:
        raise ValueError("no points to fit")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(r))):
        raise ValueError("generations and solve_rates must be finite")
    if np.any(c < 0) or np.any(np.diff(c) < 0):
        raise ValueError("generations must be non-negative and non-decreasing (a run's log in order)")
    if np.any(r < 0) or np.any(r > 1):
        raise ValueError("solve rates must lie in [0, 1]")
    return c, r


def _starting_points(c: np.ndarray, r: np.ndarray, R0: float) -> list[tuple[float, float, float]]:
    """(A, log C_mid, B) guesses: C_mid where the data cross half their rise; several A
    and B guesses, because the fit has local minima when A is barely identified."""
    half = R0 + 0.5 * (r.max() - R0)
    c_half = float(c[np.argmax(r >= half)]) if np.any(r >= half) else float(c[-1])
    a_guesses = (r.max() + 0.25 * (1.0 - r.max()), r.max() + 0.02)
    return [(max(min(a, 1.0 - 1e-3), R0 + 1e-3), math.log(max(c_half, 1.0)), b)
            for a in a_guesses for b in (0.5, 1.0, 2.0)]


def _fit_with_r0(c: np.ndarray, r: np.ndarray, R0: float, start: ScalingFit | None = None) -> ScalingFit:
    """Least-squares fit of A, C_mid, B to points (c, r) with R0 fixed. `start`: a
    previous fit to start from (robustness refits); otherwise several starting points."""
    if c.size < MIN_POINTS:
        raise ValueError(f"too few points to fit: {c.size} (need at least {MIN_POINTS})")
    if R0 >= 1.0:
        raise ValueError(f"the first observed solve rate is {R0}: no room for an asymptote above it")
    if np.ptp(r) <= 1e-12 or np.ptp(c) <= 0:
        raise ValueError("no curvature: the solve rate (or generation count) is constant over the fitted points")
    if r.max() <= R0:
        raise ValueError(f"the solve rate does not rise above its first observed value R0={R0}")

    def model(cc, A, log_c_mid, B):
        return scaling_curve(cc, R0, A, np.exp(log_c_mid), B)

    lower = [R0 + _OPEN, -np.inf, _OPEN]
    upper = [1.0, np.inf, B_MAX - _OPEN]
    starts = _starting_points(c, r, R0)
    if start is not None:
        inside = (float(np.clip(start.A, R0 + 1e-6, 1.0 - 1e-9)), math.log(start.C_mid),
                  float(np.clip(start.B, 1e-6, B_MAX - 1e-6)))
        starts = [inside]
    best, best_sse = None, np.inf
    for p0 in starts:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)
                params, _ = curve_fit(model, c, r, p0=p0, bounds=(lower, upper), method="trf",
                                      max_nfev=5000, x_scale=[0.1, 1.0, 0.5])
        except (RuntimeError, ValueError):
            continue
        sse = float(np.sum((model(c, *params) - r) ** 2))
        if sse < best_sse:
            best, best_sse = params, sse
    if best is None and start is not None:
        return _fit_with_r0(c, r, R0)  # the warm start failed: try the usual starting points
    if best is None:
        raise ValueError("the fit did not converge from any starting point")
    A, log_c_mid, B = (float(v) for v in best)
    C_mid = math.exp(log_c_mid)
    if not all(math.isfinite(v) for v in (A, C_mid, B)):
        raise ValueError("the fit returned non-finite parameters")
    if A - R0 < 1e-6:
        raise ValueError(f"the solve rate does not rise above its first observed value R0={R0}")
    rise_seen = 1.0 / (1.0 + (C_mid / c.max()) ** B)
    if rise_seen < MIN_RISE_SEEN:
        raise ValueError(f"no curvature: by the last point the fitted curve has covered only "
                         f"{100 * rise_seen:.1f}% of its rise from R0 to A (C_mid={C_mid:.3g}, B={B:.3g}), "
                         "so the asymptote is not identified")
    if A >= 1.0 - 1e-6 and C_mid > c.max():
        # The curve has not bent by the last point: A only sits on its bound.
        raise ValueError("no curvature: the curve is still rising at the last point, so the "
                         "asymptote is not identified (A ran to its bound of 1)")
    return ScalingFit(A=A, C_mid=C_mid, B=B, R0=R0, n_points=int(c.size),
                      rmse=math.sqrt(best_sse / c.size))


def _kept_points(generations, solve_rates, min_generations: float) -> tuple[np.ndarray, np.ndarray, float]:
    c, r = _validated(generations, solve_rates)
    keep = c >= min_generations
    return c[keep], r[keep], float(r[0])


def fit_scaling_curve(generations: Sequence[float] | np.ndarray, solve_rates: Sequence[float] | np.ndarray,
                      min_generations: float = DEFAULT_MIN_GENERATIONS) -> ScalingFit:
    """Fit R(C) to one run's (generations, cumulative solve rate) series.

    generations: shape [n], non-decreasing generation counts. solve_rates: shape [n],
    in [0, 1]. R0 is solve_rates[0]; points with generations < min_generations are
    then dropped. Raises ValueError when the data are malformed, too few points remain,
    or the curve shows no curvature to fit.
    """
    c, r, R0 = _kept_points(generations, solve_rates, min_generations)
    return _fit_with_r0(c, r, R0)


def fit_robustness(generations: Sequence[float] | np.ndarray, solve_rates: Sequence[float] | np.ndarray,
                   min_generations: float = DEFAULT_MIN_GENERATIONS, seed: int = 0, n_subsets: int = 100,
                   subset_fraction: float = 0.5,
                   drop_fractions: tuple[float, ...] = (0.1, 0.2, 0.3)) -> ScalingRobustness:
    """The full fit plus refits without the last 10/20/30% of the kept points and on
    `n_subsets` random subsets (each `subset_fraction` of the kept points, drawn
    without replacement from `np.random.default_rng(seed)`); R0 stays the first
    observed rate throughout. Raises ValueError when the full fit fails; refits that
    fail are counted in `failed_refits`.
    """
    if not 0 < subset_fraction <= 1:
        raise ValueError(f"subset_fraction must be in (0, 1], got {subset_fraction}")
    if any(not 0 <= f < 1 for f in drop_fractions):
        raise ValueError(f"drop_fractions must be in [0, 1), got {drop_fractions}")
    c, r, R0 = _kept_points(generations, solve_rates, min_generations)
    full = _fit_with_r0(c, r, R0)
    n = c.size
    refit_A, truncated, subset_A, failed = [], [], [], 0
    for fraction in drop_fractions:
        keep = n - int(round(fraction * n))
        try:
            A = _fit_with_r0(c[:keep], r[:keep], R0, start=full).A
        except ValueError:
            failed += 1
            continue
        truncated.append((fraction, A))
        refit_A.append(A)
    rng = np.random.default_rng(seed)
    size = max(1, int(round(subset_fraction * n)))
    for _ in range(n_subsets):
        idx = np.sort(rng.choice(n, size=size, replace=False))
        try:
            A = _fit_with_r0(c[idx], r[idx], R0, start=full).A
        except ValueError:
            failed += 1
            continue
        subset_A.append(A)
        refit_A.append(A)
    values = np.asarray(refit_A)
    return ScalingRobustness(
        full=full,
        truncated=tuple(truncated),
        subset_A=tuple(subset_A),
        failed_refits=failed,
        A_std=float(values.std()) if values.size else float("nan"),
        A_range=float(np.ptp(values)) if values.size else float("nan"),
    )
