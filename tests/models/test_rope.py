"""RoPE tables: `rope.sincos` against float64 cos and sin, and the tables every rope type
builds against the same formula in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgs_jax.models import rope, tiny

# Within this of the exact values (fp32 holds them to 6e-8; XLA's own cos and sin reach 3e-8).
SINCOS_ATOL = 2e-7


@pytest.mark.parametrize("jitted", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("bound", [1.0, 10.0, 8192.0, 131072.0])
def test_sincos_matches_float64(bound, jitted):
    """Over every quadrant, negative angles too, up to the positions of a 128K context;
    jitted (XLA may fuse the reduction's products into FMAs) and op by op (it cannot)."""
    angles = np.random.default_rng(0).uniform(-bound, bound, 200_000).astype(np.float32)
    angles[:5] = [0.0, np.pi / 4, -np.pi / 4, np.pi / 2, bound]
    cos, sin = (jax.jit(rope.sincos) if jitted else rope.sincos)(angles)
    exact = angles.astype(np.float64)
    np.testing.assert_allclose(np.asarray(cos), np.cos(exact), atol=SINCOS_ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(sin), np.sin(exact), atol=SINCOS_ATOL, rtol=0)


def test_pi_over_2_parts_multiply_exactly():
    """Every part but the last has few enough bits that k * part is exact in fp32 for all
    quadrant counts up to 2^17, and the parts sum to pi / 2."""
    k = np.arange(1 << 17, dtype=np.float64)
    for part in rope._PIO2_PARTS[:-1]:
        np.testing.assert_array_equal((k.astype(np.float32) * part).astype(np.float64), k * np.float64(part))
    assert abs(sum(np.float64(p) for p in rope._PIO2_PARTS) - np.pi / 2) < 1e-15


def test_sincos_keeps_shape_and_dtype():
    cos, sin = rope.sincos(jnp.zeros((2, 3, 4), jnp.bfloat16))
    assert cos.shape == sin.shape == (2, 3, 4) and cos.dtype == sin.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(cos), 1.0)
    np.testing.assert_array_equal(np.asarray(sin), 0.0)


@pytest.mark.parametrize("rope_type, params", [
    ("default", {}),
    ("linear", {"factor": 2.0}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 64}),
])
def test_tables_match_float64(rope_type, params):
    """cos/sin tables [B, T, rotary] for each static rope type: the frequencies and scale
    of `static_inv_freq`, the trigonometry exact."""
    scaling = tuple(sorted({"rope_type": rope_type, **params}.items())) if params else ()
    config = tiny(head_dim=16, max_position_embeddings=4096, rope_scaling=scaling)
    assert config.rope_type == rope_type
    positions = jnp.asarray(np.random.default_rng(1).integers(0, 4096, size=(2, 9)), jnp.int32)
    cos, sin = rope.rope_cos_sin(config, positions)
    inv_freq, scale = rope.static_inv_freq(config)
    angles = (np.asarray(positions, np.float32)[..., None] * inv_freq).astype(np.float32).astype(np.float64)
    angles = np.concatenate([angles, angles], axis=-1)
    np.testing.assert_allclose(np.asarray(cos), np.cos(angles) * scale, atol=SINCOS_ATOL * max(scale, 1), rtol=0)
    np.testing.assert_allclose(np.asarray(sin), np.sin(angles) * scale, atol=SINCOS_ATOL * max(scale, 1), rtol=0)
