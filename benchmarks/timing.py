"""Timing shared by the benchmarks (run as `python benchmarks/NAME.py`, so this directory
is on the import path)."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import time
from pathlib import Path
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


@dataclasses.dataclass(frozen=True)
class Round:
    """One round of `alternated_rounds`: each side's seconds per call, and what the probe
    read just before the round and just after it (None without a probe)."""

    seconds: dict[str, float]
    probe_before: float | None = None
    probe_after: float | None = None


def alternated_rounds(sides: Mapping[str, Callable[[], object]], repeats: int, calls: int = 1, warmup: int = 1,
                      probe: Callable[[], float | None] | None = None) -> list[Round]:
    """Wall seconds per call of each side's fn(), the sides timed in turn, round by round.

    Each side is first called `warmup` times untimed (compiles, fills caches), then
    `repeats` rounds run every side once in turn, each timing `calls` consecutive calls.
    Alternating is what makes a ratio of two sides fair on a shared host, where load comes
    in bursts of seconds to minutes: a burst slows one round of every side instead of all
    of one side's timings. probe: read before the first round and after every round (so a
    round's `probe_after` is the next one's `probe_before`), e.g. `core_round_trip_ns`."""
    for fn in sides.values():
        for _ in range(warmup):
            fn()
    rounds, before = [], probe() if probe else None
    for _ in range(repeats):
        seconds = {}
        for side, fn in sides.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            seconds[side] = (time.perf_counter() - start) / calls
        after = probe() if probe else None
        rounds.append(Round(seconds, before, after))
        before = after
    return rounds


def alternated_best(sides: Mapping[str, Callable[[], object]], repeats: int, calls: int = 1, warmup: int = 1) -> dict[str, float]:
    """Best seconds per call of each side over `alternated_rounds` (same arguments):
    {side: best seconds per call}."""
    return best_of(alternated_rounds(sides, repeats, calls, warmup))


def best_of(rounds: list[Round]) -> dict[str, float]:
    """{side: its least seconds per call over `rounds`}."""
    return {side: min(r.seconds[side] for r in rounds) for side in rounds[0].seconds}


@functools.cache
def _round_trip_library():
    from sgs_jax import native_build

    path = native_build.build_or_warn(Path(__file__).resolve().parent / "core_round_trip.cc", "no core round trip is printed")
    if path is None:
        return None
    function = ctypes.CDLL(str(path)).sgs_core_round_trip_ns
    function.argtypes, function.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_double
    return function


def core_round_trip_ns(iterations: int = 20_000, batches: int = 5) -> float | None:
    """Nanoseconds for one cache line to go from this process's first CPU to its second
    and back (`core_round_trip.cc`: two pinned threads, the least of `batches` batches of
    `iterations`; about 50 ms). On a virtual machine it tells where the hypervisor has put
    the two vCPUs right now: on the 2-core AMD EPYC host of docs/training_benchmark.md
    55-110 ns when they share a last-level cache and 355-510 ns when they do not, and
    XLA:CPU's training step runs 10-25% slower in the second placement while PyTorch's
    does not. None with fewer than two CPUs or no C++ compiler."""
    function = _round_trip_library()
    if function is None:
        return None
    ns = function(iterations, batches)
    return ns if ns > 0 else None


def round_trip_text(ns: float | None) -> str:
    """A `core_round_trip_ns` reading as printed: "448 ns", or "unavailable" for None."""
    return "unavailable" if ns is None else f"{ns:.0f} ns"


def round_trip_line(when: str) -> str:
    """A line with the cores' round trip now (`core_round_trip_ns`), `when` naming the moment
    ("before", "after"): which placement a benchmark's figures came from."""
    return f"cores' round trip {when}: {round_trip_text(core_round_trip_ns())}"
