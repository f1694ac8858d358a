"""Native XLA:CPU kernels (C++ through XLA's FFI), built on first use.

    if native.paged_attention_target():   # compiled, loaded and registered (or False)
        jax.ffi.ffi_call(native.PAGED_ATTENTION, ...)

  paged_attention.cc   decode attention over the paged KV pool, and a new pool left
                       unwritten for it (`models.paged_attention`)
  flash_attention.cc   causal self-attention forward and backward for training
                       (`models.attention.native`)
  common.h             the vectorised exponential and the work split over XLA's threads

The source files ship in this package. The first process that asks compiles one with the
host's C++ compiler (`$CXX`, else `c++`, `g++`, `clang++`) against the XLA FFI headers that
jaxlib ships (`jax.ffi.include_dir()`), for the host CPU (`-march=native`), into a cache
folder (`$SGS_JAX_KERNEL_CACHE`, default `~/.cache/sgs_jax/kernels`) under a name that
hashes the source (and common.h), the flags, the compiler, jaxlib's version and the CPU, so a change of
any rebuilds and concurrent processes never read a half-written library (each writes its
own file, then renames it into place). Later processes load the cached library (a few ms).

Without a compiler, or when the build fails, `paged_attention_target()` and
`flash_attention_targets()` return False once with a warning that says why, and callers use
their XLA path (the gather backend for decode, blockwise attention for training): slower on
CPU, the same results up to float rounding.
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

PAGED_ATTENTION = "sgs_paged_attention_cpu"  # FFI target names (platform cpu)
UNWRITTEN_POOL = "sgs_unwritten_pool_cpu"
FLASH_FORWARD = "sgs_flash_attention_forward_cpu"
FLASH_BACKWARD = "sgs_flash_attention_backward_cpu"
_SOURCE_DIR = Path(__file__).resolve().parent
# No -ffast-math: linked into a shared library it sets flush-to-zero for the whole process
# on load (crtfastmath), changing every other computation's denormals.
_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp-simd")
_BUILD_TIMEOUT_S = 300


def cache_dir() -> Path:
    """Where built libraries live: $SGS_JAX_KERNEL_CACHE, else ~/.cache/sgs_jax/kernels."""
    return Path(os.environ.get("SGS_JAX_KERNEL_CACHE") or Path.home() / ".cache" / "sgs_jax" / "kernels")


def compiler() -> str | None:
    """The host's C++ compiler: $CXX, else the first of c++, g++, clang++ on PATH; None if none."""
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


def build(source: Path, compiler: str, portable: bool = False) -> Path:
    """The built library of `source` (compiled now unless cached; any C++ source beside
    headers of its own folder, e.g. `parallel/native/large_blocks.cc`); raises on failure.
    portable: only the build without -march=native (the fallback for compilers without it:
    the compiler's baseline instruction set; tests check the kernels' narrow-vector path
    with it on any host)."""
    import jaxlib

    include = jax.ffi.include_dir()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    attempts = [_FLAGS] if portable else [(*_FLAGS, "-march=native"), _FLAGS]  # the second for compilers without -march=native
    headers = [h.read_text() for h in sorted(source.parent.glob("*.h"))]  # the shared header(s) it includes
    errors = []
    for flags in attempts:
        key = hashlib.sha256("\0".join([source.read_text(), *headers, *flags, compiler, version, jaxlib.__version__, _cpu_signature()]).encode())
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


def build_or_warn(source: Path, fallback: str) -> Path | None:
    """The built library of `source` (`build` with the host's compiler), or None with a
    warning ending in `fallback` (what the caller does instead) when there is no compiler or
    the build fails."""
    cxx = compiler()
    if cxx is None:
        log.warning("no C++ compiler found ($CXX, c++, g++, clang++): %s", fallback)
        return None
    try:
        return build(source, cxx)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        log.warning("%s did not build (%s): %s", source.name, error, fallback)
        return None


def _load(source: str, targets: dict[str, str], what: str) -> bool:
    """Build (or find cached) `source`, load it and register each FFI target name ->
    exported handler symbol for the cpu platform; False (warned once) when it cannot."""
    fallback = f"{what} uses its XLA path"
    path = build_or_warn(_SOURCE_DIR / source, fallback)
    if path is None:
        return False
    try:
        library = ctypes.CDLL(str(path))
        for name, symbol in targets.items():
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    except (OSError, AttributeError) as error:
        log.warning("the native kernel %s is unavailable (%s): %s", source, error, fallback)
        return False
    return True


@functools.cache
def paged_attention_target() -> bool:
    """True once the CPU paged-attention kernel (`paged_attention.cc`) is built, loaded and
    registered as the FFI targets `PAGED_ATTENTION` and `UNWRITTEN_POOL` (a pool left
    unwritten, for that kernel only); False (warned once) when it cannot be: CPU decode
    attention then uses the XLA gather."""
    return _load("paged_attention.cc", {PAGED_ATTENTION: "SgsPagedAttention", UNWRITTEN_POOL: "SgsUnwrittenPool"},
                 "CPU decode attention")


@functools.cache
def flash_attention_targets() -> bool:
    """True once the CPU training attention kernels (`flash_attention.cc`: forward and
    backward) are built, loaded and registered as `FLASH_FORWARD` / `FLASH_BACKWARD`; False
    (warned once) when they cannot be: CPU self-attention then uses the blockwise JAX path."""
    return _load("flash_attention.cc", {FLASH_FORWARD: "SgsFlashAttentionForward", FLASH_BACKWARD: "SgsFlashAttentionBackward"},
                 "CPU self-attention")
