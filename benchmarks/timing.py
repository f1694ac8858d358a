"""Timing shared by the benchmarks (run as `python benchmarks/NAME.py`, so this directory
is on the import path)."""

from __future__ import annotations

import os
import time
from typing import Callable, Mapping

from sgs_jax.parallel.host_memory import SETTING_ENV, configure_host_malloc


def host_malloc(may_restart: bool) -> str:
    """Set the host allocator as the CPU launcher does ($SGS_HOST_MALLOC, default `keep`:
    large freed blocks kept for reuse; `parallel/host_memory.py`) before JAX starts, and say
    so in a header line. It is process-wide, so a benchmark's reference side (PyTorch) runs
    under it too. may_restart: the process may restart itself to preload the allocator's
    library (a benchmark run as a script; not one called in-process by the tests)."""
    choice = configure_host_malloc(os.environ.get(SETTING_ENV) or "keep", may_restart=may_restart)
    how = "large freed blocks kept for reuse" if choice.kept else "the C library's defaults"
    return f"host malloc: {how} ({choice.why}), for every side"


def host_cpu(cpuinfo: str | None = None) -> str:
    """A header line naming the CPU the figures come from: model, x86 family and model
    numbers, cores, and the widest vector extension (AVX-512, AVX2, or neither), which moves
    both XLA:CPU's and the native kernels' code (docs/training_benchmark.md compares hosts
    by it). cpuinfo: the text of /proc/cpuinfo (read here when None; absent off Linux)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    flags = set(fields.get("flags", "").split())
    if "avx512f" in flags:
        extras = [name for name in ("avx512_bf16", "amx_tile") if name in flags]
        vectors = "AVX-512" + (f" ({', '.join(extras)})" if extras else "")
    elif "avx2" in flags:
        vectors = "AVX2 (no AVX-512)"
    else:
        vectors = "no AVX2" if flags else "unknown"
    model = fields.get("model name", "unknown model")
    numbers = f", family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields and "model" in fields else ""
    return f"host: {model}{numbers}, {os.cpu_count()} cores, vectors: {vectors}"


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
