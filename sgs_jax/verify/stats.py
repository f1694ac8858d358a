"""Verification statistics for the metrics (method.md §9): counts by status,
system-error and timeout rates, a time histogram, throughput and worker events.

`VerifyStats` is the thread-safe accumulator a backend owns; `summarize` and
`time_histogram` are the pure functions behind its `snapshot`.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from typing import Any, Mapping, Sequence

from sgs_jax.verify.interface import Status, VerifyResult

# Upper bucket edges in seconds; the last bucket is open-ended (> 500 s).
TIME_BUCKETS_S = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 200.0, 500.0)


def time_histogram(times_s: Sequence[float], edges_s: Sequence[float] = TIME_BUCKETS_S) -> list[int]:
    """Counts of `times_s` per bucket: (-inf, e0], (e0, e1], ..., (e_last, inf).

    Returns len(edges_s) + 1 counts.
    """
    counts = [0] * (len(edges_s) + 1)
    for t in times_s:
        counts[bisect.bisect_left(edges_s, t)] += 1
    return counts


def summarize(
    counts: Mapping[str, int],
    times_s: Sequence[float],
    wall_s: float,
    events: Mapping[str, int] | None = None,
    edges_s: Sequence[float] = TIME_BUCKETS_S,
) -> dict[str, Any]:
    """Metrics dict from per-status counts, per-item times and the elapsed wall time.

    counts: items per status value ("verified", "timeout", ...).
    times_s: wall seconds of each item that was really checked (cache hits excluded).
    wall_s: seconds from the first submission to the last completion.
    events: worker events (REPL spawns, restarts, recycles, cache hits, ...).
    """
    total = sum(counts.values())
    by_status = {s.value: int(counts.get(s.value, 0)) for s in Status}
    return {
        "total": total,
        "by_status": by_status,
        "verified_rate": by_status["verified"] / total if total else 0.0,
        "system_error_rate": by_status["system_error"] / total if total else 0.0,
        "timeout_rate": by_status["timeout"] / total if total else 0.0,
        "mean_time_s": sum(times_s) / len(times_s) if times_s else 0.0,
        "max_time_s": max(times_s) if times_s else 0.0,
        "time_hist_edges_s": list(edges_s),
        "time_hist": time_histogram(times_s, edges_s),
        "wall_s": wall_s,
        "throughput_per_s": total / wall_s if wall_s > 0 else 0.0,
        "events": dict(events or {}),
    }


class VerifyStats:
    """Thread-safe accumulator of results and worker events for one backend."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._times: list[float] = []
        self._events: collections.Counter[str] = collections.Counter()
        self._first: float | None = None
        self._last: float | None = None

    def submitted(self) -> None:
        """Mark a submission (the throughput clock starts at the first one)."""
        with self._lock:
            if self._first is None:
                self._first = time.monotonic()

    def record(self, result: VerifyResult, checked: bool = True) -> None:
        """Count one finished item; `checked=False` for cache hits (no time recorded)."""
        with self._lock:
            self._counts[result.status.value] += 1
            if checked:
                self._times.append(result.time_s)
            self._last = time.monotonic()

    def event(self, name: str, n: int = 1) -> None:
        """Count a worker event: "repl_spawn", "repl_restart", "cache_hit", ..."""
        with self._lock:
            self._events[name] += n

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            wall = (self._last - self._first) if self._first is not None and self._last is not None else 0.0
            return summarize(dict(self._counts), list(self._times), wall, dict(self._events))


def format_summary(stats: Mapping[str, Any]) -> str:
    """A small plain-text table of a `summarize` dict (for the CLI and benchmarks)."""
    rows = [("items", str(stats.get("total", 0)))]
    total = stats.get("total", 0) or 1
    for status, count in stats.get("by_status", {}).items():
        rows.append((status, f"{count} ({100.0 * count / total:.1f}%)"))
    if "invalid_lines" in stats:  # sgs-verify: input lines rejected before any backend saw them
        rows.append(("invalid input lines", str(stats["invalid_lines"])))
    rows += [
        # Milliseconds to 3 significant digits: a cached or fake check takes well under 1 ms.
        ("mean time", f"{1e3 * stats.get('mean_time_s', 0.0):.3g} ms"),
        ("max time", f"{1e3 * stats.get('max_time_s', 0.0):.3g} ms"),
        ("wall", f"{stats.get('wall_s', 0.0):.2f} s"),
        ("throughput", f"{stats.get('throughput_per_s', 0.0):.2f} proofs/s"),
    ]
    rows += [(name, str(n)) for name, n in sorted(stats.get("events", {}).items())]
    if "cache" in stats:
        rows.append(("cache hits", f"{stats['cache']['hits']} of {stats['cache']['hits'] + stats['cache']['misses']}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
