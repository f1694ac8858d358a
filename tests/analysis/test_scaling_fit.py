"""Scaling-law fit: the curve against hand values, parameter recovery, robustness, errors."""

import numpy as np
import pytest

from sgs_jax.analysis.scaling import (ScalingFit, fit_robustness, fit_scaling_curve, scaling_curve)

PAPER = {"A": 0.671, "C_mid": 1_252_336.0, "B": 0.585}
R0 = 0.45
GENERATIONS = np.concatenate([[0.0], np.linspace(16_000, 8_000_000, 500)])  # 500 iterations


def paper_curve(noise: float, seed: int) -> np.ndarray:
    rates = scaling_curve(GENERATIONS, R0, **PAPER)
    rates[1:] += np.random.default_rng(seed).normal(0.0, noise, GENERATIONS.size - 1)
    return rates


def test_curve_matches_hand_values():
    # C = C_mid: halfway between R0 and A. C -> 0: R0. (C_mid/C)^B = 2^1 at C = C_mid/2, B = 1.
    assert scaling_curve(np.array([1e6]), 0.2, 0.8, 1e6, 0.7)[0] == pytest.approx(0.5, abs=1e-12)
    assert scaling_curve(np.array([0.0]), 0.2, 0.8, 1e6, 0.7)[0] == pytest.approx(0.2, abs=1e-12)
    assert scaling_curve(np.array([5e5]), 0.2, 0.8, 1e6, 1.0)[0] == pytest.approx(0.2 + 0.6 / 3, abs=1e-12)
    assert scaling_curve(np.array([1e12]), 0.2, 0.8, 1e6, 1.0)[0] == pytest.approx(0.8, abs=1e-6)


def test_noise_free_curve_is_recovered_exactly():
    fit = fit_scaling_curve(GENERATIONS, paper_curve(0.0, 0))
    assert fit.R0 == R0
    assert fit.A == pytest.approx(PAPER["A"], abs=1e-6)
    assert fit.C_mid == pytest.approx(PAPER["C_mid"], rel=1e-4)
    assert fit.B == pytest.approx(PAPER["B"], abs=1e-5)
    assert fit.n_points == int(np.sum(GENERATIONS >= 100_000))
    assert fit.rmse < 1e-6


@pytest.mark.parametrize("seed", range(5))
def test_asymptote_within_one_point_with_realistic_noise(seed):
    # 0.3 pp of noise: about 10 of D3k's 3,323 targets.
    fit = fit_scaling_curve(GENERATIONS, paper_curve(0.003, seed))
    assert abs(fit.A - PAPER["A"]) < 0.01
    assert fit.C_mid == pytest.approx(PAPER["C_mid"], rel=0.25)
    assert fit.B == pytest.approx(PAPER["B"], abs=0.1)
    np.testing.assert_allclose(fit.predict(GENERATIONS[1:]), scaling_curve(GENERATIONS[1:], R0, **PAPER), atol=0.003)


def test_r0_is_first_point_before_dropping_and_early_points_are_not_fitted():
    rates = paper_curve(0.0, 0)
    rates[1:5] = 0.0  # garbage below min_generations must not matter
    fit = fit_scaling_curve(GENERATIONS, rates, min_generations=100_000)
    assert fit.R0 == R0 and fit.A == pytest.approx(PAPER["A"], abs=1e-6)
    fit = fit_scaling_curve(GENERATIONS[1:], paper_curve(0.0, 0)[1:])
    assert fit.R0 == paper_curve(0.0, 0)[1]  # the first observed value, whatever C it had


def test_robustness_reports_spread():
    rob = fit_robustness(GENERATIONS, paper_curve(0.003, 0), seed=7, n_subsets=100)
    assert [f for f, _ in rob.truncated] == [0.1, 0.2, 0.3]
    assert len(rob.subset_A) + len(rob.truncated) + rob.failed_refits == 103
    values = np.array([a for _, a in rob.truncated] + list(rob.subset_A))
    assert rob.A_std == pytest.approx(values.std(), abs=1e-12)
    assert rob.A_range == pytest.approx(values.max() - values.min(), abs=1e-12)
    assert 0 < rob.A_std < 0.02 and rob.A_range < 0.06
    assert abs(rob.full.A - PAPER["A"]) < 0.01
    # Seeded: the same seed gives the same subsets.
    again = fit_robustness(GENERATIONS, paper_curve(0.003, 0), seed=7, n_subsets=100)
    assert again.subset_A == rob.subset_A


def test_truncated_refit_equals_direct_fit_of_the_prefix():
    rates = paper_curve(0.003, 1)
    rob = fit_robustness(GENERATIONS, rates, n_subsets=0)
    kept = GENERATIONS >= 100_000
    c, r = GENERATIONS[kept], rates[kept]
    n_keep = c.size - int(round(0.2 * c.size))
    direct = fit_scaling_curve(np.concatenate([[0.0], c[:n_keep]]), np.concatenate([[R0], r[:n_keep]]))
    assert dict(rob.truncated)[0.2] == pytest.approx(direct.A, abs=1e-5)


@pytest.mark.parametrize("generations,rates,message", [
    ([0, 2e5, 3e5], [0.1, 0.2, 0.3], "too few points"),
    (np.linspace(0, 1e6, 50), np.full(50, 0.3), "no curvature"),
    (np.linspace(0, 1e6, 50), 0.3 + 0.05 * np.linspace(0, 1, 50), "no curvature"),  # a straight line
    (np.linspace(0, 1e6, 50), np.linspace(0.5, 0.3, 50), "does not rise"),
    ([0, 1], [0.1], "equal length"),
    ([], [], "no points"),
    ([0, 2e5, 1e5, 3e5, 4e5, 5e5], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], "non-decreasing"),
    ([0, 2e5, 3e5, 4e5, 5e5, 6e5], [0.1, 0.2, 1.3, 0.4, 0.5, 0.6], r"\[0, 1\]"),
    ([0, 2e5, np.nan, 4e5, 5e5, 6e5], [0.1] * 6, "finite"),
    (np.linspace(0, 1e6, 50), np.full(50, 1.0), "no room"),
])
def test_clear_errors(generations, rates, message):
    with pytest.raises(ValueError, match=message):
        fit_scaling_curve(generations, rates)


def test_fit_result_is_a_frozen_record():
    fit = fit_scaling_curve(GENERATIONS, paper_curve(0.0, 0))
    assert isinstance(fit, ScalingFit)
    with pytest.raises(AttributeError):
        fit.A = 0.5


def test_noise_without_a_rise_is_rejected():
    rates = np.r_[0.3, 0.3 + 1e-3 * np.random.default_rng(0).normal(size=49)]
    with pytest.raises(ValueError, match="no curvature"):
        fit_scaling_curve(np.linspace(0, 1e6, 50), rates)


def test_early_run_before_the_midpoint_still_fits():
    # Data only up to C_mid / 2: a quarter of the rise is seen, the fit still stands.
    c = np.concatenate([[0.0], np.linspace(16_000, 600_000, 40)])
    fit = fit_scaling_curve(c, scaling_curve(c, R0, **PAPER))
    assert fit.A == pytest.approx(PAPER["A"], abs=1e-4)
