"""JAX's persistent compilation cache: compiled programs saved on disk, so a restarted or
resumed process loads them instead of compiling again (minutes per program for a 7B model).

The cache key covers the program, its shardings, the compiler version and flags, so a
changed config or JAX version simply compiles anew. Every program is saved, however fast it
compiled (JAX's default keeps only those over 1 s, a guard for slow remote storage): on a
local disk a small entry loads in milliseconds, and the testbed's many sub-second programs
are most of its start-up (a second 2-iteration testbed run: 17 s with all programs cached,
22 s with JAX's default, 37 s with none). The directory is trusted: whoever can write to it can run code in the
process, so keep it private to the user.
"""

from __future__ import annotations

import os

import jax
from jax.experimental.compilation_cache import compilation_cache

OFF = "off"


def compile_cache_dir(setting: str, workdir: str) -> str | None:
    """The directory `run.compile_cache_dir` names: "" = `workdir`/compile_cache, "off" =
    None (no cache), anything else a path (`~` expanded)."""
    if setting == OFF:
        return None
    return os.path.abspath(os.path.expanduser(setting or os.path.join(workdir, "compile_cache")))


def enable_compilation_cache(directory: str | None, min_compile_secs: float = 0.0) -> str | None:
    """Save and load compiled programs in `directory` (created) from now on; None leaves
    the cache as it is. Takes effect even if this process has compiled before."""
    if directory is None:
        return None
    os.makedirs(directory, exist_ok=True)
    compilation_cache.set_cache_dir(directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_secs))
    compilation_cache.reset_cache()  # re-read the directory at the next compile
    return directory
