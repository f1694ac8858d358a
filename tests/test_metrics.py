"""MetricsWriter: JSONL and TensorBoard sinks, flushing, resume, validation; buckets."""

import collections
import json

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from sgs_jax import metrics as m


def read_jsonl(run_dir):
    return [json.loads(line) for line in (run_dir / m.JSONL_NAME).read_text(encoding="utf-8").splitlines()]


def accumulator(run_dir):
    """TensorBoard's own reader, keeping every event (size guidance 0)."""
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={
        event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0})
    acc.Reload()
    return acc


def test_scalars_go_to_jsonl_and_tensorboard(tmp_path):
    with m.MetricsWriter(tmp_path) as writer:
        writer.write_scalars(0, {m.GENERATIONS: 16_384, m.CUMULATIVE_SOLVE_RATE: 0.4125})
        writer.write_scalars(1, {m.GENERATIONS: np.int64(32_768), m.SOLVER_ENTROPY: np.float32(0.5)})
    lines = read_jsonl(tmp_path)
    assert [line["step"] for line in lines] == [0, 1]
    assert lines[0]["scalars"] == {"generations": 16384.0, "cumulative_solve_rate": 0.4125}
    assert lines[1]["scalars"] == {"generations": 32768.0, "solver/entropy": 0.5}
    assert all(isinstance(line["time"], float) for line in lines)
    acc = accumulator(tmp_path)
    assert [(e.step, e.value) for e in acc.Scalars(m.GENERATIONS)] == [(0, 16384.0), (1, 32768.0)]
    assert acc.Scalars(m.CUMULATIVE_SOLVE_RATE)[0].value == pytest.approx(0.4125, rel=1e-7)  # float32


def test_histogram_record_and_proto_summaries(tmp_path):
    values = np.array([0.0, 0.125, 0.125, 1.0, 0.5])
    with m.MetricsWriter(tmp_path) as writer:
        writer.write_histogram(3, m.SYNTHETIC_SOLVE_RATE, values)
    (line,) = read_jsonl(tmp_path)
    assert line["step"] == 3 and line["histogram"] == m.SYNTHETIC_SOLVE_RATE and line["values"] == values.tolist()
    (event,) = accumulator(tmp_path).Histograms(m.SYNTHETIC_SOLVE_RATE)
    histo = event.histogram_value
    assert event.step == 3
    assert (histo.min, histo.max, histo.num) == (0.0, 1.0, 5.0)
    assert histo.sum == pytest.approx(1.75, abs=1e-12)
    assert histo.sum_squares == pytest.approx(0.125 ** 2 * 2 + 1 + 0.25, abs=1e-12)
    assert list(histo.bucket_limit) == [0.0, 0.125, 0.5, 1.0]
    assert list(histo.bucket) == [1.0, 2.0, 1.0, 1.0]


def test_empty_histogram_is_recorded(tmp_path):
    with m.MetricsWriter(tmp_path) as writer:
        writer.write_histogram(0, m.SYNTHETIC_SOLVE_RATE, [])
    assert read_jsonl(tmp_path)[0]["values"] == []


def test_each_write_is_on_disk_before_close(tmp_path):
    """A preempted run (no close) keeps every completed write in both sinks."""
    writer = m.MetricsWriter(tmp_path)
    writer.write_scalars(5, {m.CUMULATIVE_SOLVE_RATE: 0.5})
    assert read_jsonl(tmp_path)[0]["step"] == 5
    assert [e.step for e in accumulator(tmp_path).Scalars(m.CUMULATIVE_SOLVE_RATE)] == [5]
    writer.close()
    writer.close()  # closing twice is harmless


def test_resume_appends(tmp_path):
    with m.MetricsWriter(tmp_path) as writer:
        writer.write_scalars(0, {m.GENERATIONS: 1})
    with m.MetricsWriter(tmp_path) as writer:
        writer.write_scalars(1, {m.GENERATIONS: 2})
    assert [line["step"] for line in read_jsonl(tmp_path)] == [0, 1]
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert [e.value for e in accumulator(tmp_path).Scalars(m.GENERATIONS)] == [1.0, 2.0]


def test_resume_after_a_step_drops_later_records_and_rebuilds_tensorboard(tmp_path):
    """A run killed after logging step 3 but checkpointed at step 2: reopened with
    truncate_after=2 it redoes step 3, and every reader sees each step once."""
    with m.MetricsWriter(tmp_path) as writer:
        for step in range(4):
            writer.write_scalars(step, {m.GENERATIONS: step})
            writer.write_histogram(step, m.SYNTHETIC_SOLVE_RATE, [0.25 * step])
    with open(tmp_path / m.JSONL_NAME, "ab") as f:
        f.write(b'{"step": 4, "time": 1.0, "scal')  # and a torn line
    with m.MetricsWriter(tmp_path, truncate_after=2) as writer:
        writer.write_scalars(3, {m.GENERATIONS: 30})
    lines = read_jsonl(tmp_path)
    assert [(line["step"], "histogram" in line) for line in lines] == [
        (0, False), (0, True), (1, False), (1, True), (2, False), (2, True), (3, False)]
    acc = accumulator(tmp_path)
    assert [(e.step, e.value) for e in acc.Scalars(m.GENERATIONS)] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]
    assert [e.step for e in acc.Histograms(m.SYNTHETIC_SOLVE_RATE)] == [0, 1, 2]
    assert acc.Histograms(m.SYNTHETIC_SOLVE_RATE)[2].histogram_value.sum == pytest.approx(0.5)
    # The rebuilt events keep the original wall times.
    assert acc.Scalars(m.GENERATIONS)[1].wall_time == pytest.approx(lines[2]["time"])


def test_starting_over_drops_every_record(tmp_path):
    with m.MetricsWriter(tmp_path) as writer:
        writer.write_scalars(0, {m.GENERATIONS: 1})
    with m.MetricsWriter(tmp_path, truncate_after=-1) as writer:
        writer.write_scalars(0, {m.GENERATIONS: 2})
    assert [line["scalars"][m.GENERATIONS] for line in read_jsonl(tmp_path)] == [2.0]
    assert [e.value for e in accumulator(tmp_path).Scalars(m.GENERATIONS)] == [2.0]


@pytest.mark.parametrize("call,message", [
    (lambda w: w.write_scalars(-1, {"a": 1.0}), "non-negative integer"),
    (lambda w: w.write_scalars(1.5, {"a": 1.0}), "non-negative integer"),
    (lambda w: w.write_scalars(True, {"a": 1.0}), "non-negative integer"),
    (lambda w: w.write_scalars(0, {}), "non-empty mapping"),
    (lambda w: w.write_scalars(0, {"a": 1.0, "b": "x"}), "real number"),
    (lambda w: w.write_scalars(0, {"a": 1.0, "b": [1.0]}), "real number"),
    (lambda w: w.write_scalars(0, {"a": 1.0, "": 2.0}), "non-empty strings"),
    (lambda w: w.write_histogram(0, "h", [1.0, np.nan]), "finite 1-D"),
    (lambda w: w.write_histogram(0, "h", [[1.0]]), "finite 1-D"),
    (lambda w: w.write_histogram(0, "h", ["x"]), "must be numbers"),
    (lambda w: w.write_histogram(0, "", [1.0]), "non-empty string"),
])
def test_bad_input_raises_and_writes_nothing(tmp_path, call, message):
    with m.MetricsWriter(tmp_path) as writer:
        with pytest.raises(ValueError, match=message):
            call(writer)
    assert (tmp_path / m.JSONL_NAME).read_text(encoding="utf-8") == ""


def test_non_finite_scalars_are_kept(tmp_path):
    with m.MetricsWriter(tmp_path) as writer:
        writer.write_scalars(0, {m.SOLVER_ENTROPY: float("nan")})
    assert np.isnan(read_jsonl(tmp_path)[0]["scalars"][m.SOLVER_ENTROPY])


def test_closed_writer_refuses(tmp_path):
    writer = m.MetricsWriter(tmp_path)
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write_scalars(0, {"a": 1.0})


def test_exact_buckets_match_a_counter():
    values = np.random.default_rng(0).integers(0, 9, size=200) / 8.0
    limits, counts = m.histogram_buckets(values)
    reference = collections.Counter(values.tolist())
    assert limits.tolist() == sorted(reference)
    assert counts.tolist() == [float(reference[v]) for v in sorted(reference)]


def test_binned_buckets_match_brute_force():
    values = np.random.default_rng(1).normal(size=1000)
    values[:3] = values.min(), values.max(), 0.0
    limits, counts = m.histogram_buckets(values)
    assert limits.size == m.HISTOGRAM_BINS and limits[-1] == values.max()
    edges = np.linspace(values.min(), values.max(), m.HISTOGRAM_BINS + 1)
    brute = [sum(1 for v in values if (edges[i] < v <= edges[i + 1]) or (i == 0 and v == edges[0]))
             for i in range(m.HISTOGRAM_BINS)]
    assert counts.tolist() == brute and counts.sum() == values.size


def test_canonical_names_are_distinct():
    names = [v for k, v in vars(m).items() if k.isupper() and isinstance(v, str) and k != "JSONL_NAME"]
    assert len(names) == len(set(names)) and m.SYNTHETIC_SOLVE_RATE in names
