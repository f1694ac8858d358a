"""`models.elementwise`: the SwiGLU gate with a hand-written VJP. Its values are the plain
formula's exactly, its gradients autodiff's of the plain formula, and it keeps only the
residuals it promises (which is the point of it)."""

import contextlib
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

from sgs_jax.models import tiny
from sgs_jax.models.attention import AttentionMask
from sgs_jax.models.elementwise import swiglu
from sgs_jax.models.llama import DecoderLayer, rope_cos_sin

FP32_TOL = 1e-6  # fp32 gradients: the same derivative by another formula, relative to the largest
BF16_TOL = 2e-2  # bf16: the same, each step rounded to bf16


def saved_shapes(fn, *args) -> list[tuple[int, ...]]:
    """Shapes of what autodiff keeps for fn's backward (JAX's public
    `print_saved_residuals`, one line per residual starting with its type, e.g. f32[3,5])."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(fn, *args)
    lines = out.getvalue().splitlines()
    shapes = [re.match(r"\w+\[([\d,]*)\]", line) for line in lines]
    assert all(shapes), lines
    return sorted(tuple(int(d) for d in m.group(1).split(",") if d) for m in shapes)


def plain_swiglu(gate, up):
    return jax.nn.silu(gate) * up


def _inputs(dtype, shape=(3, 5, 16)):
    rng = np.random.default_rng(0)
    a, b, dy = (jnp.asarray(rng.normal(size=shape) * 3, dtype) for _ in range(3))
    return a, b, dy


def _assert_vjp_equal(ours, plain, args, dy, tol):
    out, vjp = jax.vjp(ours, *args)
    want_out, want_vjp = jax.vjp(plain, *args)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want_out, np.float32))  # the same forward
    for got, want, arg in zip(vjp(dy), want_vjp(dy), args):
        assert got.shape == arg.shape and got.dtype == arg.dtype
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        np.testing.assert_allclose(got, want, atol=tol * np.abs(want).max(), rtol=0)


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, FP32_TOL), (jnp.bfloat16, BF16_TOL)])
def test_swiglu_equals_plain_formula_with_gradients(dtype, tol):
    gate, up, dy = _inputs(dtype)
    _assert_vjp_equal(swiglu, plain_swiglu, (gate, up), dy, tol)


def test_it_keeps_only_its_inputs():
    x, up, _ = _inputs(jnp.float32)
    assert saved_shapes(swiglu, x, up) == [(3, 5, 16), (3, 5, 16)]
    assert len(saved_shapes(plain_swiglu, x, up)) > 2  # what autodiff keeps: the check can fail


def test_decoder_layer_keeps_three_mlp_wide_residuals():
    """A training layer without remat keeps gate, up and their product (the down
    projection's input), not sigmoid(gate) and silu(gate) besides; autodiff of the plain
    formula kept six MLP-wide residuals."""
    config = tiny(hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8, num_layers=1)
    layer = DecoderLayer(config, nnx.Rngs(0))
    graphdef, params = nnx.split(layer)
    b, t = 2, 6
    x = jnp.asarray(np.random.default_rng(0).normal(size=(b, t, 32)), jnp.float32)
    cos, sin = rope_cos_sin(config, jnp.broadcast_to(jnp.arange(t), (b, t)))
    mask = AttentionMask(lengths=jnp.full((b,), t, jnp.int32))

    def run(params, x):
        return nnx.merge(graphdef, params)(x, cos, sin, mask)[0]

    assert saved_shapes(run, params, x).count((b, t, 48)) == 3
