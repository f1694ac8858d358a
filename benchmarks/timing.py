"""Timing shared by the benchmarks (run as `python benchmarks/NAME.py`, so this directory
is on the import path)."""

from __future__ import annotations

import time
from typing import Callable, Mapping


def alternated_best(sides: Mapping[str, Callable[[], object]], repeats: int, calls: int = 1, warmup: int = 1) -> dict[str, float]:
    """Best wall seconds per call of each side's fn(), the sides timed in turn.

    Each side is first called `warmup` times untimed (compiles, fills caches), then
    `repeats` rounds run every side once in turn, each timing `calls` consecutive calls.
    Alternating is what makes a ratio of two sides fair on a shared host, where load comes
    in bursts of seconds to minutes: a burst slows one round of every side instead of all
    of one side's timings. Returns {side: best seconds per call}."""
    for fn in sides.values():
        for _ in range(warmup):
            fn()
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(repeats):
        for side, fn in sides.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[side] = min(best[side], (time.perf_counter() - start) / calls)
    return best
