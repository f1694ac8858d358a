"""The host allocator for CPU runs: large blocks the process frees kept mapped for its own reuse.

XLA:CPU allocates each program call's temporary buffer afresh and frees it when the call
ends: about 250 MB per optimiser step of `benchmarks/train_step.py` at 256 tokens, 1 GB at
1,024. glibc serves a block that large with a fresh `mmap` (XLA's threads allocate from their
own arenas, which mmap anything over 64 MiB whatever the threshold) and unmaps it on free,
so every call faults its scratch in again page by page, each 4 KiB page zeroed by the
kernel: measured on a 2-core host, 62k page faults and 0.12 s of kernel time per optimiser
step at 256 tokens, 253k and 0.5 s at 1,024 (docs/training_benchmark.md, "The scratch that
was faulted in on every call").

`SGS_HOST_MALLOC=keep` preloads `native/large_blocks.cc` (built on first use, like the
attention kernels, with the host's C++ compiler): it takes over glibc's malloc family for
blocks over 32 MiB (those glibc always maps afresh), keeps a freed one mapped, and hands it back to the next request of
a similar size, already faulted in (idle blocks up to a quarter of physical memory). Smaller
blocks, nearly all of what compiling allocates, stay glibc's, so compiles run as under the
system allocator. A library must be loaded before the process starts, so `keep` restarts
the process (`os.execv`, the same command line) with it in `LD_PRELOAD`, where the caller
allows (`may_restart`: the command-line entry points and the benchmarks); the restarted
process takes it out of the environment again, so its subprocesses (Lean) run without it.

  system   (the default here) leave the allocator as the C library set it
  keep     (the default of the CPU launcher, `launch/local.sh`, and of the benchmarks) keep
           large freed blocks mapped for reuse. Faster where the time goes to running
           programs, as fast where it goes to compiling (docs/training.md, "The host
           allocator"); the process keeps its large blocks' high-water mark, and
           accelerators gain nothing from it, so it is not the library's default.

Without a C++ compiler, or where the build fails, `keep` is logged and left at `system`.
(Until 2026-12-06 `keep` switched glibc itself to one arena with no mmap and no trimming
(`mallopt`): the same reuse, but compiles ran 10-20% slower, all threads sharing the one
arena; docs/training_benchmark.md has both.)
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

SETTING_ENV = "SGS_HOST_MALLOC"
SETTINGS = ("system", "keep")
_SOURCE = Path(__file__).resolve().parent / "native" / "large_blocks.cc"
_STATS_SYMBOL = "sgs_large_blocks_stats"  # exported by the library: its presence says it is loaded
_RESTARTED_ENV = "SGS_HOST_MALLOC_RESTARTED"  # set for the restarted process: never restart twice


@dataclasses.dataclass(frozen=True)
class HostMallocChoice:
    """What `configure_host_malloc` did: `kept` = large freed blocks are now kept for reuse;
    `why` says why, in words."""

    kept: bool
    why: str


@dataclasses.dataclass(frozen=True)
class LargeBlockStats:
    """The preloaded library's counters since the process started."""

    reused: int  # requests served by a kept block
    mapped: int  # blocks mapped afresh
    unmapped: int  # kept blocks given back to the OS (beyond the idle cap, or out of slots)
    idle_bytes: int  # bytes mapped and kept, not in use


def large_block_stats() -> LargeBlockStats | None:
    """The counters of the preloaded large-block library, or None when it is not loaded."""
    stats = getattr(ctypes.CDLL(None), _STATS_SYMBOL, None)
    if stats is None:
        return None
    out = (ctypes.c_size_t * 4)()
    stats(out)
    return LargeBlockStats(*(int(v) for v in out))


def configure_host_malloc(setting: str | None = None, *, may_restart: bool = False) -> HostMallocChoice:
    """Keep large freed blocks mapped for reuse when `setting` (default: $SGS_HOST_MALLOC,
    else "system") is "keep"; see the module docstring. That needs the library preloaded:
    if it is not, and `may_restart`, the process restarts itself with it (this call then does
    not return); otherwise the choice is logged and left at system. Call first thing in an
    entry point, before any output that must not be repeated. Raises ValueError on an
    unknown setting; anything else (no compiler, a failed build) is logged and left as it is."""
    setting = (setting if setting is not None else os.environ.get(SETTING_ENV, "system")).strip().lower() or "system"
    if setting not in SETTINGS:
        raise ValueError(f"{SETTING_ENV} must be one of {SETTINGS}, got {setting!r}")
    if large_block_stats() is not None:
        _forget_preload()
        return HostMallocChoice(True, f"{SETTING_ENV}=keep" if setting == "keep" else "the large-block library is preloaded")
    if setting == "system":
        return HostMallocChoice(False, f"{SETTING_ENV}=system")
    if os.environ.get(_RESTARTED_ENV):
        log.warning("%s=keep: the preloaded library did not load (LD_PRELOAD=%s); the system allocator stays",
                    SETTING_ENV, os.environ.get("LD_PRELOAD", ""))
        return HostMallocChoice(False, "the preloaded library did not load")
    if not may_restart:
        log.info("%s=keep needs a restart with the library preloaded, which this caller does not allow", SETTING_ENV)
        return HostMallocChoice(False, "no restart allowed here")
    from sgs_jax import native_build

    library = native_build.build_or_warn(_SOURCE, f"{SETTING_ENV}=keep stays at the system allocator")
    if library is None:
        return HostMallocChoice(False, "the large-block library did not build")
    preload = os.environ.get("LD_PRELOAD", "")
    os.environ["LD_PRELOAD"] = f"{library}:{preload}" if preload else str(library)
    os.environ[_RESTARTED_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except OSError as error:  # execv returns only by raising
        _forget_preload()
        log.warning("%s=keep: the restart failed (%s); the system allocator stays", SETTING_ENV, error)
        return HostMallocChoice(False, f"the restart failed ({error})")
    raise AssertionError("unreachable")


def _forget_preload() -> None:
    """Take the library out of this process's environment, so that subprocesses run without it."""
    os.environ.pop(_RESTARTED_ENV, None)
    kept = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p and not Path(p).name.startswith(_SOURCE.stem + "-")]
    if kept:
        os.environ["LD_PRELOAD"] = ":".join(kept)
    else:
        os.environ.pop("LD_PRELOAD", None)
