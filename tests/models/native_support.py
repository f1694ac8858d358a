"""The native kernels' portable build, for tests: what a compiler without -march=native
builds (the compiler's baseline instruction set; on x86-64 no AVX2, FMA or AVX-512), so the
kernels' narrow-vector code runs on any host."""

import ctypes

import jax

from sgs_jax import native_build
from sgs_jax.models import native


def use_portable_build(patch, kernel_cache, source: str, targets: dict[str, str]) -> None:
    """Build `source` without -march=native into the folder `kernel_cache`, register each
    handler symbol under a target name of its own, and point `native`'s target-name
    constants at them through `patch` (pytest's monkeypatch, or one of its contexts), so
    every call traced after this runs the portable build. targets: `native` constant ->
    exported handler symbol."""
    patch.setenv("SGS_JAX_KERNEL_CACHE", str(kernel_cache))
    library = ctypes.CDLL(str(native_build.build(native._SOURCE_DIR / source, native_build.compiler(), portable=True)))
    for constant, symbol in targets.items():
        name = f"{getattr(native, constant)}_portable"
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
        patch.setattr(native, constant, name)
