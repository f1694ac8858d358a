"""C++ sources built into shared libraries on first use, cached per source, compiler and CPU.

    from sgs_jax import native_build
    path = native_build.build_or_warn(source, "what the caller does instead")  # or None

Used by the XLA:CPU kernels (`models/native`: loaded and registered as FFI targets) and by
the large-block allocator (`parallel/native/large_blocks.cc`, preloaded: see
`parallel/host_memory`). A source is compiled with the host's C++ compiler (`$CXX`, else
`c++`, `g++`, `clang++`) against the XLA FFI headers that jaxlib ships
(`jax.ffi.include_dir()`), for the host CPU (`-march=native`), into a cache folder
(`$SGS_JAX_KERNEL_CACHE`, default `~/.cache/sgs_jax/kernels`) under a name that hashes the
source and the headers of its folder, the flags, the compiler, jaxlib's version and the
CPU, so a change of any rebuilds and concurrent processes never read a half-written library
(each writes its own file, then renames it into place). Later processes load the cached
library (a few ms).
"""

from __future__ import annotations

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
