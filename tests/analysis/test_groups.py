"""Grouping runs by config and the common generation grid, against hand-computed values."""

import math

import numpy as np
import pytest

from sgs_jax import metrics as m
from sgs_jax.analysis.groups import (band, common_grid, group_runs, interpolate, matched_generations,
                                     run_identity, value_at_generations)
from sgs_jax.analysis.run_log import load_run
from synthetic_runs import write_config, write_run


def test_interpolate_by_hand():
    x, y = np.array([0.0, 10.0, 20.0]), np.array([0.0, 0.2, 0.6])
    got = interpolate(x, y, np.array([-1.0, 0.0, 5.0, 10.0, 15.0, 20.0, 21.0]))
    np.testing.assert_allclose(got, [np.nan, 0.0, 0.1, 0.2, 0.4, 0.6, np.nan], atol=1e-15)
    # A repeated x (a step written twice) keeps its last value.
    got = interpolate(np.array([0.0, 10.0, 10.0, 20.0]), np.array([0.0, 0.1, 0.3, 0.5]), np.array([5.0, 10.0, 15.0]))
    np.testing.assert_allclose(got, [0.15, 0.3, 0.4], atol=1e-15)
    assert np.isnan(interpolate(np.zeros(0), np.zeros(0), np.array([1.0]))).all()
    with pytest.raises(ValueError, match="non-decreasing"):
        interpolate(np.array([0.0, 2.0, 1.0]), np.zeros(3), np.array([1.0]))


def test_common_grid_and_band_by_hand():
    # Shared points: the grid is those points, no interpolation.
    a, b = np.array([0.0, 5.0, 10.0]), np.array([0.0, 5.0, 10.0, 15.0])
    np.testing.assert_array_equal(common_grid([a, b]), [0.0, 5.0, 10.0])
    # Different points: the overlap [2, 10] with the median count of points inside it
    # (2 and 3 points: 2.5, rounded up).
    c, d = np.array([0.0, 4.0, 8.0, 12.0]), np.array([2.0, 6.0, 10.0])
    np.testing.assert_allclose(common_grid([c, d]), np.linspace(2.0, 10.0, 3), atol=1e-15)
    assert common_grid([np.array([0.0, 1.0]), np.array([2.0, 3.0])]).size == 0
    assert common_grid([]).size == 0
    # Run 1: y = x / 100 on [0, 20]; run 2: y = 0.3 at 0 rising to 0.5 at 30.
    result = band([np.array([0.0, 10.0, 20.0]), np.array([0.0, 15.0, 30.0])],
                  [np.array([0.0, 0.1, 0.2]), np.array([0.3, 0.4, 0.5])])
    # Grid: [0, 20] with 3 points (3 and 2 points inside: 2.5, rounded up): 0, 10, 20.
    np.testing.assert_allclose(result.x, [0.0, 10.0, 20.0])
    run2_at_10, run2_at_20 = 0.3 + 10 / 15 * 0.1, 0.4 + (20 - 15) / 15 * 0.1
    np.testing.assert_allclose(result.mean, [0.15, (0.1 + run2_at_10) / 2, (0.2 + run2_at_20) / 2], atol=1e-15)
    np.testing.assert_allclose(result.low, [0.0, 0.1, 0.2], atol=1e-15)
    np.testing.assert_allclose(result.high, [0.3, run2_at_10, run2_at_20], atol=1e-15)
    assert result.n_runs == 2
    assert band([np.array([0.0, 1.0]), np.array([2.0, 3.0])], [np.zeros(2), np.zeros(2)]) is None


def _tiny_run(path, generations, rates, experiment=None, seed=0):
    write_run(path, [{m.GENERATIONS: g, m.CUMULATIVE_SOLVE_RATE: r} for g, r in zip(generations, rates)],
              experiment=experiment, seed=seed)
    return load_run(path)


def test_grouping_by_recorded_experiment_explicit_label_or_folder(tmp_path):
    for name, experiment, seed in [("a1", "sgs", 1), ("b1", "rl", 1), ("a2", "sgs", 2), ("c", None, 0)]:
        _tiny_run(tmp_path / name, [0, 10], [0.1, 0.2], experiment, seed)
    assert run_identity(tmp_path / "a1") == ("sgs", 1)
    assert run_identity(tmp_path / "a1", "mine") == ("mine", 1)  # an explicit label wins
    assert run_identity(tmp_path / "c") == ("c", None)  # no config.json: the folder name
    (tmp_path / "c" / "config.json").write_bytes(b'{"experiment": "x", "run": {"se')  # torn
    assert run_identity(tmp_path / "c") == ("c", None)

    runs = [load_run(tmp_path / n) for n in ("a1", "b1", "a2", "c")]
    identities = [run_identity(tmp_path / n) for n in ("a1", "b1", "a2", "c")]
    groups = group_runs(runs, [label for label, _ in identities], [seed for _, seed in identities])
    assert [(g.label, [r.name for r in g.runs], g.seeds) for g in groups] == [
        ("sgs", ["a1", "a2"], (1, 2)), ("rl", ["b1"], (1,)), ("c", ["c"], (None,))]
    with pytest.raises(ValueError, match="one label"):
        group_runs(runs, ["x"])


def test_matched_generations_and_values_there(tmp_path):
    short = _tiny_run(tmp_path / "short", [0, 100, 200], [0.1, 0.2, 0.4])
    long = _tiny_run(tmp_path / "long", [0, 150, 300], [0.1, 0.25, 0.3])
    assert matched_generations([short, long]) == 200  # the largest count both reach
    assert value_at_generations(long, m.CUMULATIVE_SOLVE_RATE, 200) == pytest.approx(0.25 + 50 / 150 * 0.05, abs=1e-15)
    assert value_at_generations(short, m.CUMULATIVE_SOLVE_RATE, 200) == pytest.approx(0.4, abs=1e-15)
    assert math.isnan(value_at_generations(short, "absent", 200))
    write_run(tmp_path / "nogen", [{m.CUMULATIVE_SOLVE_RATE: 0.1}])
    assert math.isnan(matched_generations([short, load_run(tmp_path / "nogen")]))
    write_config(tmp_path / "cfg_only", "sgs", 3)
    assert run_identity(tmp_path / "cfg_only") == ("sgs", 3)
