"""The host allocator, for CPU runs that choose it: memory the process frees kept for its own reuse.

XLA:CPU allocates each program call's temporary buffer afresh and frees it when the call
ends: about 250 MB per optimiser step of `benchmarks/train_step.py` at 256 tokens, 1 GB at
1,024. glibc serves a block that large with a fresh `mmap` (XLA's threads allocate from their
own arenas, which mmap anything over 64 MiB whatever the threshold) and unmaps it on free,
so every call faults its scratch in again page by page, each 4 KiB page zeroed by the
kernel: measured on a 2-core host, 62k page faults and 0.12 s of kernel time per optimiser
step at 256 tokens, 253k and 0.5 s at 1,024 (docs/training_benchmark.md, "The scratch that
was faulted in on every call").

`SGS_HOST_MALLOC=keep` switches glibc (`mallopt`) to one arena, no mmapped blocks and no
trimming: a freed block goes back to the heap and the next call's scratch reuses it, already
mapped (0 faults per step). It is a trade, so it is opt-in, per launch (a fact of the host,
not of the run: it changes no result):

  system   (default) leave the allocator as the C library set it
  keep     keep freed memory for reuse. Faster where the time goes to running programs:
           the training benchmark's step 1.19x / 1.44x torch's at 256 / 1,024 tokens,
           against 1.03x / 1.27x. Slower where it goes to compiling and to many threads
           allocating at once (all sharing the one arena: the likely cause): `bash launch/local.sh
           sgs` 85-89 s against 75-79 s, a compile-bound test file 64-72 s against 56-59 s.
           The process also keeps its high-water mark (freed memory is not returned).

An alternative needing no code: `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` in the
environment (glibc 2.35+, transparent huge pages in `madvise` mode or `always`) faults the
scratch in 2 MiB at a time, with the arenas left alone. It matched `keep` for one trainer
alone in a process, but not inside the training benchmark, where one of its sides ran
slower than under the system allocator (docs/training_benchmark.md), so nothing here sets
it.

Programs run on the calling thread (`jax_cpu_enable_async_dispatch=False`) with mmap and
trimming off would also stop the faults without the one arena, as fast for training, but
the sampler then loses its overlap of host and device (5-12% slower;
docs/training_benchmark.md), so it is not offered.

It must be set before JAX starts its CPU client: a thread keeps the arena it first
allocated from, and XLA's worker threads are made with the client. The CLI entry points
and the benchmarks call `configure_host_malloc` first thing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import logging
import os

log = logging.getLogger(__name__)

SETTING_ENV = "SGS_HOST_MALLOC"
SETTINGS = ("system", "keep")

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_NEVER_TRIM = 2**31 - 1  # the largest value mallopt takes (an int): never give the heap's top back


@dataclasses.dataclass(frozen=True)
class HostMallocChoice:
    """What `configure_host_malloc` did: `kept` = glibc now keeps freed memory; `why` says why, in words."""

    kept: bool
    why: str


_kept: HostMallocChoice | None = None  # what switched glibc, once it has been (there is no switching back)


def configure_host_malloc(setting: str | None = None) -> HostMallocChoice:
    """Switch glibc to keep freed memory for reuse (one arena, no mmapped blocks, no
    trimming) when `setting` (default: $SGS_HOST_MALLOC, else "system") is "keep"; see the
    module docstring. Call before JAX's first computation. Raises ValueError on an unknown
    setting; anything else (no glibc, JAX already started) is logged and left as it is."""
    setting = (setting if setting is not None else os.environ.get(SETTING_ENV, "system")).strip().lower() or "system"
    if setting not in SETTINGS:
        raise ValueError(f"{SETTING_ENV} must be one of {SETTINGS}, got {setting!r}")
    global _kept
    if _kept is not None:  # already switched in this process (switching back is not possible)
        return _kept
    if setting == "system":
        return HostMallocChoice(False, f"{SETTING_ENV}=system")
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():  # e.g. a CLI's main called in a process that has run JAX
        log.info("host malloc left as it is: JAX has already started, and its threads keep their own arenas")
        return HostMallocChoice(False, "JAX had already started")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return HostMallocChoice(False, "not glibc (no mallopt)")
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # Arenas first: from here on a new thread shares the main arena, the only one that can
    # grow without mmap.
    done = [mallopt(param, value) for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER_TRIM))]
    if not all(done):
        return HostMallocChoice(False, f"mallopt refused ({done})")
    _kept = HostMallocChoice(True, f"{SETTING_ENV}={setting}")
    return _kept
