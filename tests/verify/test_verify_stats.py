"""Verification statistics against NumPy and hand-computed values."""

import numpy as np
import pytest

from sgs_jax.verify.interface import Status, VerifyResult
from sgs_jax.verify.stats import TIME_BUCKETS_S, VerifyStats, format_summary, summarize, time_histogram


def test_time_histogram_matches_numpy():
    rng = np.random.default_rng(0)
    times = np.concatenate([rng.exponential(20.0, 500), [0.0, 0.1, 200.0, 500.0, 900.0]])
    # NumPy bins are [a, b); ours are (a, b]: compare on values that avoid the edges,
    # then check the edge values by hand.
    inner = times[~np.isin(times, TIME_BUCKETS_S)]
    edges = np.array([-np.inf, *TIME_BUCKETS_S, np.inf])
    assert time_histogram(inner.tolist()) == np.histogram(inner, edges)[0].tolist()
    assert time_histogram([0.1, 200.0, 500.0, 500.0001]) == [1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert sum(time_histogram(times.tolist())) == len(times)


def test_summarize_by_hand():
    counts = {"verified": 6, "lean_error": 2, "timeout": 1, "system_error": 1}
    s = summarize(counts, [1.0, 2.0, 3.0, 6.0], wall_s=4.0, events={"repl_spawn": 3})
    assert s["total"] == 10 and s["by_status"]["rejected"] == 0
    assert s["verified_rate"] == pytest.approx(0.6)
    assert s["system_error_rate"] == pytest.approx(0.1) and s["timeout_rate"] == pytest.approx(0.1)
    assert s["mean_time_s"] == pytest.approx(3.0) and s["max_time_s"] == 6.0
    assert s["throughput_per_s"] == pytest.approx(2.5)
    assert s["events"] == {"repl_spawn": 3}
    empty = summarize({}, [], 0.0)
    assert empty["total"] == 0 and empty["throughput_per_s"] == 0.0 and empty["system_error_rate"] == 0.0


def test_accumulator_and_table():
    stats = VerifyStats()
    stats.submitted()
    stats.record(VerifyResult(True, Status.VERIFIED, time_s=0.5))
    stats.record(VerifyResult.failure(Status.TIMEOUT, "slow", time_s=2.0))
    stats.record(VerifyResult(True, Status.VERIFIED), checked=False)  # a cache hit: no time
    stats.event("repl_restart")
    snap = stats.snapshot()
    assert snap["by_status"]["verified"] == 2 and snap["by_status"]["timeout"] == 1
    assert snap["mean_time_s"] == pytest.approx(1.25) and snap["events"] == {"repl_restart": 1}
    assert snap["wall_s"] >= 0
    table = format_summary(snap)
    assert "timeout" in table and "1 (33.3%)" in table and "repl_restart" in table
