"""Small synthetic runs written through MetricsWriter, for reader and report tests."""

from __future__ import annotations

import pathlib

import numpy as np

from sgs_jax import metrics as m
from sgs_jax.analysis.scaling import scaling_curve

PAPER_SGS = {"A": 0.671, "C_mid": 1_252_336.0, "B": 0.585}
PAPER_R0 = 0.45


def write_synthetic_run(run_dir: pathlib.Path, A: float = PAPER_SGS["A"], C_mid: float = PAPER_SGS["C_mid"],
                        B: float = PAPER_SGS["B"], R0: float = PAPER_R0, iterations: int = 60,
                        generations_per_iteration: int = 40_000, noise: float = 0.002, seed: int = 0,
                        cispo: bool = False, disjunctive_growth: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Write `iterations` steps of a plausible run; returns (generations, solve rates).

    Step 0 holds the base model's rate R0 at 0 generations; later steps follow the
    scaling curve plus Gaussian noise of std `noise`, clipped to [0, 1].
    """
    rng = np.random.default_rng(seed)
    generations = np.arange(iterations, dtype=np.float64) * generations_per_iteration
    rates = scaling_curve(generations, R0, A, C_mid, B)
    rates[1:] += rng.normal(0.0, noise, iterations - 1)
    rates = np.clip(rates, 0.0, 1.0)
    with m.MetricsWriter(run_dir) as writer:
        for step in range(iterations):
            scalars = {
                m.GENERATIONS: generations[step],
                m.CUMULATIVE_SOLVE_RATE: rates[step],
                m.ITERATION_SOLVE_RATE: rates[step] * 0.8,
                m.SOLVER_ENTROPY: 0.6 * np.exp(-step / (10 if cispo else 200)),
                m.CONJECTURE_DISJUNCTIVE_FRACTION: min(1.0, 0.05 + disjunctive_growth * step),
                m.CONJECTURE_MEAN_CONCLUSION_LENGTH: 40.0 + 300.0 * disjunctive_growth * step,
                m.TARGET_DISJUNCTIVE_FRACTION: 0.042,
                m.TARGET_MEAN_CONCLUSION_LENGTH: 47.8,
            }
            if cispo:
                scalars[m.CISPO_CLIP_FRACTION] = 0.02 + 0.001 * step
            writer.write_scalars(step, scalars)
            # Solve rates of k = 8 attempts; CISPO runs pile up at 0 and 1 over time.
            spread = 1.0 / (1.0 + (step / 10 if cispo else 0.0))
            successes = rng.binomial(8, rng.beta(2 * spread, 2 * spread, size=50))
            writer.write_histogram(step, m.SYNTHETIC_SOLVE_RATE, successes / 8.0)
    return generations, rates
