"""Rotary position embeddings with every RoPE scaling type Hugging Face defines for Llama.

Types: default (plain), linear, dynamic (NTK), yarn and llama3, following the formulas of
`transformers.modeling_rope_utils`. The halves layout (`rotate_half`) is the one Llama
checkpoints in Hugging Face format use.

`dynamic` is stateful in transformers (the frequencies grow with the longest sequence
seen); here it is a pure function of the largest position in the current call, which
gives the same numbers for a full forward pass and for decoding that moves forward.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from sgs_jax.models.config import ModelConfig


def _rotary_dim(config: ModelConfig) -> int:
    return int(config.head_dim * config.rope_params().get("partial_rotary_factor", 1.0))


def _plain_inv_freq(base: float, dim: int) -> np.ndarray:
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    return (1.0 / (np.float32(base) ** exponents)).astype(np.float32)


def static_inv_freq(config: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [rotary_dim // 2] and the cos/sin scale, for non-dynamic types.

    For `dynamic` this returns the unscaled frequencies (valid up to
    max_position_embeddings); `rope_cos_sin` rescales them per call.
    """
    params = config.rope_params()
    rope_type = config.rope_type
    dim = _rotary_dim(config)
    base = config.rope_theta
    inv_freq = _plain_inv_freq(base, dim)
    if rope_type in ("default", "dynamic"):
        return inv_freq, 1.0
    if rope_type == "linear":
        return (inv_freq / np.float32(params["factor"])).astype(np.float32), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, params), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(config, params, dim)
    raise ValueError(f"unsupported rope type {rope_type!r}")


def _llama3_inv_freq(inv_freq: np.ndarray, params: dict) -> np.ndarray:
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def _yarn_inv_freq(config: ModelConfig, params: dict, dim: int) -> tuple[np.ndarray, float]:
    base = config.rope_theta
    original_len = params["original_max_position_embeddings"]
    factor = params.get("factor") or config.max_position_embeddings / original_len

    def mscale_of(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim)
        else:
            attention_factor = mscale_of(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(num_rotations):
        return (dim * math.log(original_len / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    inv_extrapolation = 1.0 / pos_freqs
    inv_interpolation = 1.0 / (factor * pos_freqs)
    inv_freq = inv_interpolation * (1 - extrapolation_weight) + inv_extrapolation * extrapolation_weight
    return inv_freq.astype(np.float32), float(attention_factor)


def _dynamic_inv_freq(config: ModelConfig, positions: jnp.ndarray) -> jnp.ndarray:
    """NTK-scaled frequencies for the longest sequence in this call (traced)."""
    dim = _rotary_dim(config)
    factor = config.rope_params()["factor"]
    max_len = config.max_position_embeddings
    seq_len = jnp.maximum(jnp.max(positions).astype(jnp.float32) + 1.0, float(max_len))
    base = config.rope_theta * ((factor * seq_len / max_len) - (factor - 1)) ** (dim / (dim - 2))
    exponents = jnp.arange(0, dim, 2, dtype=jnp.float32) / dim
    return 1.0 / (base**exponents)


def rope_cos_sin(config: ModelConfig, positions: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos and sin tables for integer `positions` [batch, seq] -> two [batch, seq, rotary_dim] fp32."""
    inv_freq, scale = static_inv_freq(config)
    if config.rope_type == "dynamic":
        inv_freq = _dynamic_inv_freq(config, positions)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    angles = jnp.concatenate([angles, angles], axis=-1)
    cos, sin = sincos(angles)
    return cos * scale, sin * scale


def _pio2_parts(bits: int = 7, exact_parts: int = 3) -> tuple[np.float32, ...]:
    """pi / 2 as a sum of fp32 constants for the range reduction (Cody and Waite): the first
    `exact_parts` with `bits` significant bits each, so k * part is exact in fp32 for every
    quadrant count k < 2^(24 - bits), the last the remainder. Products and differences
    then lose nothing whether or not the compiler fuses them into FMAs."""
    rest, parts = np.pi / 2, []
    for _ in range(exact_parts):
        step = 2.0 ** (np.floor(np.log2(abs(rest))) - bits + 1)
        part = np.round(rest / step) * step
        parts.append(np.float32(part))
        rest -= part
    return (*parts, np.float32(rest))


# Exact products for k < 2^17 quadrants: |angle| < 205,000, past the positions of a
# 128K-token context (the angles are positions times frequencies of at most 1).
_PIO2_PARTS = _pio2_parts()
# Minimax polynomials on [-pi/4, pi/4] (Cephes' sinf and cosf).
_SIN_COEFFS = tuple(np.float32(c) for c in (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4))
_COS_COEFFS = tuple(np.float32(c) for c in (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5))


def sincos(angles: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(cos, sin) of fp32 `angles` (any shape, radians), within 2e-7 of the exact values
    for |angle| <= 131,072, jitted or not (tests/models/test_rope.py).

    Reduced to r in [-pi/4, pi/4] by the nearest multiple k of pi/2, then two short
    polynomials in r and k's quadrant pick the signs: only multiplies, adds and selects,
    which every backend vectorises. XLA:CPU's own cos and sin run about 15x slower than its
    exp (`docs/training_benchmark.md`, stop 53)."""
    angles = angles.astype(jnp.float32)
    k = jnp.round(angles * np.float32(2 / np.pi))
    r = angles
    for part in _PIO2_PARTS:
        r = r - k * part
    r2 = r * r
    s1, s2, s3 = _SIN_COEFFS
    c1, c2, c3 = _COS_COEFFS
    sin_r = r + r * r2 * (s1 + r2 * (s2 + r2 * s3))
    cos_r = 1 - 0.5 * r2 + r2 * r2 * (c1 + r2 * (c2 + r2 * c3))
    quadrant = k.astype(jnp.int32) & 3  # two's complement: right for negative k too
    cos = jnp.select([quadrant == 0, quadrant == 1, quadrant == 2], [cos_r, -sin_r, -cos_r], sin_r)
    sin = jnp.select([quadrant == 0, quadrant == 1, quadrant == 2], [sin_r, cos_r, -sin_r], -cos_r)
    return cos, sin


def apply_rope(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """Rotate `x` [batch, seq, heads, head_dim] by cos/sin [batch, seq, rotary_dim].

    Only the first rotary_dim features rotate (partial rotary); the math runs in fp32.
    """
    rotary_dim = cos.shape[-1]
    x32 = x.astype(jnp.float32)
    rot, rest = x32[..., :rotary_dim], x32[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    out = rot * cos[:, :, None, :] + rotated_half * sin[:, :, None, :]
    return jnp.concatenate([out, rest], axis=-1).astype(x.dtype)
