"""Native XLA:CPU kernels (C++ through XLA's FFI), built on first use.

    if native.paged_attention_target():   # compiled, loaded and registered (or False)
        jax.ffi.ffi_call(native.PAGED_ATTENTION, ...)

The source files ship in this package. The first process that asks compiles one with the
host's C++ compiler (`$CXX`, else `c++`, `g++`, `clang++`) against the XLA FFI headers that
jaxlib ships (`jax.ffi.include_dir()`), for the host CPU (`-march=native`), into a cache
folder (`$SGS_JAX_KERNEL_CACHE`, default `~/.cache/sgs_jax/kernels`) under a name that
hashes the source, the flags, the compiler, jaxlib's version and the CPU, so a change of
any rebuilds and concurrent processes never read a half-written library (each writes its
own file, then renames it into place). Later processes load the cached library (a few ms).

Without a compiler, or when the build fails, `paged_attention_target()` returns False
once with a warning that says why, and callers use their XLA path (`models.paged_attention`
falls back to the gather backend): slower on CPU, same results.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax

log = logging.getLogger(__name__)

PAGED_ATTENTION = "sgs_paged_attention_cpu"  # the FFI target name (platform cpu)
_SOURCE_DIR = Path(__file__).resolve().parent
_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp-simd", "-ffast-math")
_BUILD_TIMEOUT_S = 300


def cache_dir() -> Path:
    """Where built libraries live: $SGS_JAX_KERNEL_CACHE, else ~/.cache/sgs_jax/kernels."""
    return Path(os.environ.get("SGS_JAX_KERNEL_CACHE") or Path.home() / ".cache" / "sgs_jax" / "kernels")


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_signature() -> str:
    """The CPU's model and feature flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    keep = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep)))


def _build(source: Path, compiler: str) -> Path:
    """The built library of `source` (compiled now unless cached); raises on failure."""
    import jaxlib

    include = jax.ffi.include_dir()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    attempts = [(*_FLAGS, "-march=native"), _FLAGS]  # the second for compilers without -march=native
    errors = []
    for flags in attempts:
        key = hashlib.sha256("\0".join([source.read_text(), *flags, compiler, version, jaxlib.__version__, _cpu_signature()]).encode())
        target = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(suffix=".so.partial", dir=target.parent)
        os.close(fd)
        try:
            done = subprocess.run([compiler, *flags, f"-I{include}", str(source), "-o", partial],
                                  capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
            if done.returncode == 0:
                os.replace(partial, target)
                return target
            errors.append(done.stderr.strip()[-2000:])
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    raise RuntimeError(f"{compiler} failed to build {source.name}:\n" + "\n---\n".join(errors))


@functools.cache
def paged_attention_target() -> bool:
    """True once the CPU paged-attention kernel (`paged_attention.cc`) is built, loaded and
    registered as the FFI target `PAGED_ATTENTION`; False (warned once) when it cannot be."""
    compiler = _compiler()
    if compiler is None:
        log.warning("no C++ compiler found ($CXX, c++, g++, clang++): CPU decode attention uses the XLA gather path")
        return False
    try:
        library = ctypes.CDLL(str(_build(_SOURCE_DIR / "paged_attention.cc", compiler)))
        jax.ffi.register_ffi_target(PAGED_ATTENTION, jax.ffi.pycapsule(library.SgsPagedAttention), platform="cpu")
    except (OSError, AttributeError, RuntimeError, subprocess.SubprocessError) as error:
        log.warning("the native CPU paged-attention kernel is unavailable (%s): CPU decode attention uses the XLA gather path", error)
        return False
    return True
