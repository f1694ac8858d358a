"""Small synthetic runs written through MetricsWriter, for reader and report tests."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from sgs_jax import metrics as m
from sgs_jax.analysis.scaling import scaling_curve

SOLVER_CLIP_FRACTION = "solver/clip_fraction"  # what training logs

PAPER_SGS = {"A": 0.671, "C_mid": 1_252_336.0, "B": 0.585}
PAPER_R0 = 0.45


def write_synthetic_run(run_dir: pathlib.Path, A: float = PAPER_SGS["A"], C_mid: float = PAPER_SGS["C_mid"],
                        B: float = PAPER_SGS["B"], R0: float = PAPER_R0, iterations: int = 60,
                        generations_per_iteration: int = 40_000, noise: float = 0.002, seed: int = 0,
                        cispo: bool = False, disjunctive_growth: float = 0.0, domain_metrics: bool = False,
                        guide: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Write `iterations` steps of a plausible run; returns (generations, solve rates).

    Step 0 holds the base model's rate R0 at 0 generations; later steps follow the
    scaling curve plus Gaussian noise of std `noise`, clipped to [0, 1]. domain_metrics:
    also the testbed's optional metrics (hard split, difficulty bands, hack fractions,
    ill-formed count, Guide scores: the Guide's own, or shadow scores when not `guide`).
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
                scalars[SOLVER_CLIP_FRACTION] = 0.02 + 0.001 * step
            if domain_metrics:
                scalars["cumulative_solve_rate/hard"] = max(0.0, rates[step] - R0) * 1.5
                scalars["cumulative_solve_rate/band/easy"] = min(1.0, rates[step] * 1.4)
                scalars["cumulative_solve_rate/band/hard"] = rates[step] * 0.5
                if step:
                    scalars["conjectures/hack/easy_disjunct_fraction"] = min(1.0, 0.02 + disjunctive_growth * step)
                    scalars["conjectures/hack/conclusion_in_premises_fraction"] = 0.05
                    scalars["conjectures/ill_formed"] = float(rng.integers(0, 20))
                    prefix = "guide/" if guide else "guide_shadow/"
                    for sub in ("relevance", "redundancy", "conclusion_complexity"):
                        scalars[prefix + sub] = float(rng.uniform(0.3, 0.7))
            writer.write_scalars(step, scalars)
            # Solve rates of k = 8 attempts; CISPO runs pile up at 0 and 1 over time.
            spread = 1.0 / (1.0 + (step / 10 if cispo else 0.0))
            successes = rng.binomial(8, rng.beta(2 * spread, 2 * spread, size=50))
            writer.write_histogram(step, m.SYNTHETIC_SOLVE_RATE, successes / 8.0)
    return generations, rates


def write_config(run_dir: pathlib.Path, experiment: str, seed: int) -> None:
    """A config.json as a run records it (only the fields the report reads)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"experiment": experiment, "run": {"seed": seed}}),
                                         encoding="utf-8")


def write_run(run_dir: pathlib.Path, steps: Sequence[Mapping[str, float]],
              histograms: Mapping[int, Sequence[float]] = {}, experiment: str | None = None,
              seed: int = 0) -> None:
    """A run with the given scalars at steps 0, 1, ... and synthetic solve-rate histograms
    {step: values}; with `experiment`, also its config.json."""
    if experiment is not None:
        write_config(run_dir, experiment, seed)
    with m.MetricsWriter(run_dir) as writer:
        for step, scalars in enumerate(steps):
            writer.write_scalars(step, dict(scalars))
            if step in histograms:
                writer.write_histogram(step, m.SYNTHETIC_SOLVE_RATE, histograms[step])
