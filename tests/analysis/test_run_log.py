"""Reading runs back: JSONL and TensorBoard paths agree; resume and torn lines."""

import logging

import numpy as np
import pytest

from sgs_jax import metrics as m
from sgs_jax.analysis.run_log import load_run
from synthetic_runs import write_synthetic_run


def test_both_sources_give_the_same_log(tmp_path):
    generations, rates = write_synthetic_run(tmp_path / "run", iterations=12)
    from_jsonl = load_run(tmp_path / "run", source="jsonl")
    from_events = load_run(tmp_path / "run", source="tensorboard")
    assert (from_jsonl.source, from_events.source) == ("jsonl", "tensorboard")
    assert from_jsonl.scalars.keys() == from_events.scalars.keys()
    for name, series in from_jsonl.scalars.items():
        np.testing.assert_array_equal(series.steps, from_events.scalars[name].steps)
        np.testing.assert_allclose(series.values, from_events.scalars[name].values, rtol=1e-7)  # float32
    x, y = from_jsonl.paired(m.GENERATIONS, m.CUMULATIVE_SOLVE_RATE)
    np.testing.assert_array_equal(x, generations)
    np.testing.assert_array_equal(y, rates)  # JSONL is exact
    a, b = from_jsonl.histograms[m.SYNTHETIC_SOLVE_RATE], from_events.histograms[m.SYNTHETIC_SOLVE_RATE]
    assert [s.step for s in a] == [s.step for s in b] == list(range(12))
    for sa, sb in zip(a, b):
        np.testing.assert_array_equal(sa.limits, sb.limits)
        np.testing.assert_array_equal(sa.counts, sb.counts)
        assert sa.counts.sum() == 50


def test_auto_prefers_jsonl_and_falls_back_to_events(tmp_path):
    write_synthetic_run(tmp_path / "run", iterations=3)
    assert load_run(tmp_path / "run").source == "jsonl"
    (tmp_path / "run" / m.JSONL_NAME).unlink()
    assert load_run(tmp_path / "run").source == "tensorboard"


@pytest.mark.parametrize("source", ["jsonl", "tensorboard"])
def test_resumed_run_keeps_the_later_write_of_a_step(tmp_path, source):
    with m.MetricsWriter(tmp_path) as writer:
        for step in range(4):
            writer.write_scalars(step, {m.GENERATIONS: step, m.CUMULATIVE_SOLVE_RATE: 0.1})
    with m.MetricsWriter(tmp_path) as writer:  # resumed from a checkpoint at step 1
        for step in range(2, 5):
            writer.write_scalars(step, {m.CUMULATIVE_SOLVE_RATE: 0.2})
    series = load_run(tmp_path, source=source).scalars[m.CUMULATIVE_SOLVE_RATE]
    assert series.steps.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(series.values, [0.1, 0.1, 0.2, 0.2, 0.2], rtol=1e-7)


def test_torn_and_undecodable_lines_are_skipped_with_a_warning(tmp_path, caplog):
    with m.MetricsWriter(tmp_path) as writer:
        writer.write_scalars(0, {m.GENERATIONS: 1})
    with open(tmp_path / m.JSONL_NAME, "ab") as f:
        f.write(b'{"step": 1, "time": 1.0, "scalars": {"x\xe2\x88": 1.0}}\n')  # a character cut in two
        f.write(b'{"step": 2, "time": 1.0, "scalars": {"generations": 3}}\n')
        f.write(b'{"step": 3, "scalars": {"generations": "many"}}\n')  # not a number: the whole record goes
        f.write(b'{"step": 4, "time": 1.0, "scal')
    with caplog.at_level(logging.WARNING):
        run = load_run(tmp_path, source="jsonl")
    assert run.skipped_lines == (2, 4, 5) and run.scalars[m.GENERATIONS].steps.tolist() == [0, 2]
    path = tmp_path / m.JSONL_NAME
    assert [r.getMessage() for r in caplog.records] == [
        f"{path} line 2: skipped, not a readable metrics record (UnicodeDecodeError)",
        f"{path} line 4: skipped, not a readable metrics record (ValueError)",
        f"{path} line 5: skipped, not a readable metrics record (JSONDecodeError)"]


def test_paired_uses_common_steps_only(tmp_path):
    with m.MetricsWriter(tmp_path) as writer:
        writer.write_scalars(0, {"x": 1.0})
        writer.write_scalars(1, {"x": 2.0, "y": 20.0})
        writer.write_scalars(2, {"y": 30.0})
    run = load_run(tmp_path)
    x, y = run.paired("x", "y")
    assert x.tolist() == [2.0] and y.tolist() == [20.0]
    assert run.paired("x", "missing")[0].size == 0


def test_missing_metrics_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="event files"):
        load_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        load_run(tmp_path, source="jsonl")
    with pytest.raises(ValueError, match="source"):
        load_run(tmp_path, source="csv")
