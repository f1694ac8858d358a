"""Timing shared by the benchmarks (run as `python benchmarks/NAME.py`, so this directory
is on the import path)."""

from __future__ import annotations

import time
from typing import Callable


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Best wall time in seconds of `repeats` calls of fn() after one untimed warm-up call
    (which compiles and fills caches)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
