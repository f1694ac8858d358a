"""Native XLA:CPU kernels (C++ through XLA's FFI), built on first use.

    if native.paged_attention_target():   # compiled, loaded and registered (or False)
        jax.ffi.ffi_call(native.PAGED_ATTENTION, ...)

  paged_attention.cc   decode attention over the paged KV pool, and a new pool left
                       unwritten for it (`models.paged_attention`)
  flash_attention.cc   causal self-attention forward and backward for training
                       (`models.attention.native`)
  common.h             the vectorised exponential and the work split over XLA's threads

The source files ship in this package. The first process that asks compiles one for the
host CPU and caches it (`sgs_jax.native_build`: the compiler, the flags, the cache); later
processes load the cached library (a few ms).

Without a compiler, or when the build fails, `paged_attention_target()` and
`flash_attention_targets()` return False once with a warning that says why, and callers use
their XLA path (the gather backend for decode, blockwise attention for training): slower on
CPU, the same results up to float rounding.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import jax

from sgs_jax.native_build import build_or_warn

log = logging.getLogger(__name__)

PAGED_ATTENTION = "sgs_paged_attention_cpu"  # FFI target names (platform cpu)
UNWRITTEN_POOL = "sgs_unwritten_pool_cpu"
FLASH_FORWARD = "sgs_flash_attention_forward_cpu"
FLASH_BACKWARD = "sgs_flash_attention_backward_cpu"
_SOURCE_DIR = Path(__file__).resolve().parent


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
