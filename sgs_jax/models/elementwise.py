"""RMSNorm and the SwiGLU gate with hand-written VJPs that keep fewer residuals.

Left to autodiff, each keeps every intermediate its backward reads: RMSNorm the mean
square, the normalised input and the broadcast scale beside the input; the SwiGLU gate
sigmoid(gate), silu(gate) and more beside gate and up, each as large as the MLP's
activations. Inside the training step's layer scan with `remat_policy="none"`, every
residual is a stacked [layers, B, T, ...] buffer written in the forward and read in the
backward: 23 per layer, 6 of them MLP-wide. These VJPs keep only their inputs (and
RMSNorm's [..., 1] inverse RMS) and recompute the cheap rest in the backward, which
leaves 14 per layer, 3 MLP-wide: less activation memory on every platform and, on CPU,
less memory traffic (`docs/training_benchmark.md`, "Fewer saved activations").

The forward computations are the ones the model always ran (the same operations in the
same dtypes), so inference and the HF parity are unchanged; the gradients equal
autodiff's to float rounding (`tests/models/test_elementwise.py`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """scale * x / sqrt(mean(x^2) + eps) over the last axis: normalised in fp32, then
    scaled in x's dtype (as transformers does). x [..., E]; scale [E] (any float dtype)."""
    return _rms_norm_fwd(x, scale, eps)[0]


def _inverse_rms(x32: jax.Array, eps: float) -> jax.Array:
    return jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


def _rms_norm_fwd(x, scale, eps):
    x32 = x.astype(jnp.float32)
    inv = _inverse_rms(x32, eps)  # [..., 1] fp32
    return scale.astype(x.dtype) * (x32 * inv).astype(x.dtype), (x, scale, inv)


def _rms_norm_bwd(eps, residuals, dy):
    x, scale, inv = residuals
    normed = x.astype(jnp.float32) * inv
    dy32 = dy.astype(jnp.float32)
    d_normed = dy32 * scale.astype(jnp.float32)
    # d/dx of x * inv(x): inv * (g - normed * mean(g * normed)) for the incoming g.
    dx = inv * (d_normed - normed * jnp.mean(d_normed * normed, axis=-1, keepdims=True))
    dscale = jnp.sum(dy32 * normed, axis=tuple(range(dy.ndim - 1)))
    return dx.astype(x.dtype), dscale.astype(scale.dtype)


rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


@jax.custom_vjp
def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """silu(gate) * up, elementwise (the Llama MLP's gate; any shape, any float dtype)."""
    return jax.nn.silu(gate) * up


def _swiglu_fwd(gate, up):
    return swiglu(gate, up), (gate, up)


def _swiglu_bwd(residuals, dy):
    gate, up = residuals
    sig = jax.nn.sigmoid(gate)
    silu = gate * sig
    # silu'(g) = sig + g sig (1 - sig) = sig (1 + g (1 - sig)).
    return dy * up * sig * (1 + gate * (1 - sig)), dy * silu


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)
