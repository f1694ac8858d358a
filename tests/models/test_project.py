"""`llama.project`, the model's one matmul: values and gradients equal `jnp.tensordot`'s,
and on CPU its weight gradient needs no transposed copy of the output gradient."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgs_jax.models.llama import project

TOL = 1e-5  # fp32; the 2-D path sums in a different order


@pytest.mark.parametrize(
    "x_shape, kernel_shape, contract",
    [((3, 5, 16), (16, 24), 1),  # gate / up / down, the LM head
     ((3, 5, 16), (16, 4, 8), 1),  # q / k / v: [E, H, D]
     ((3, 5, 4, 8), (4, 8, 16), 2),  # o: [H, D, E]
     ((6, 16), (16, 4, 8), 1)],  # decode: one token per row
)
def test_project_equals_tensordot_with_gradients(x_shape, kernel_shape, contract):
    rng = np.random.default_rng(0)
    x, kernel = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in (x_shape, kernel_shape))
    weight = jnp.asarray(rng.normal(size=x_shape[: len(x_shape) - contract] + kernel_shape[contract:]), jnp.float32)

    def loss(fn):
        return lambda x, kernel: jnp.sum(fn(x, kernel) * weight)

    ours = jax.jit(jax.value_and_grad(loss(lambda x, k: project(x, k, contract)), argnums=(0, 1)))(x, kernel)
    want = jax.value_and_grad(loss(lambda x, k: jnp.tensordot(x, k, axes=contract)), argnums=(0, 1))(x, kernel)
    np.testing.assert_allclose(float(ours[0]), float(want[0]), rtol=TOL)
    for got, ref in zip(ours[1], want[1]):
        assert got.shape == ref.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=TOL, rtol=0)


def _transposed_copies(matmul) -> list[str]:
    """Copy fusions whose output is [features, tokens] (a gradient written out transposed) in
    the compiled gradient of a scanned SwiGLU block over 512 tokens."""
    tokens, embed, mlp, layers = 512, 32, 48, 2
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, tokens // 2, embed)), jnp.float32)
    weights = {name: jnp.asarray(rng.normal(size=(layers, *shape)) * 0.1, jnp.float32)
               for name, shape in (("gate", (embed, mlp)), ("up", (embed, mlp)), ("down", (mlp, embed)))}

    def loss(weights, x):
        def layer(h, w):
            return h + matmul(jax.nn.silu(matmul(h, w["gate"])) * matmul(h, w["up"]), w["down"]), None

        return jnp.sum(jax.lax.scan(layer, x, weights)[0] ** 2)

    hlo = jax.jit(jax.grad(loss)).lower(weights, x).compile().as_text()
    return re.findall(rf"%\S*copy\S*fusion\S* = f32\[(?:{embed}|{mlp}),{tokens}\]", hlo)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's layout choice")
def test_weight_gradients_need_no_transposed_copy_on_cpu():
    """The check can fail: autodiff of the same matmul as a plain tensordot gets them."""
    assert _transposed_copies(lambda x, k: jnp.tensordot(x, k, axes=1))
    assert _transposed_copies(project) == []


def test_project_keeps_bf16_in_bf16():
    """bf16 compute: output and both gradients stay bf16, within bf16 rounding of tensordot's."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(2, 7, 32)), jnp.bfloat16)
    kernel = jnp.asarray(rng.normal(size=(32, 4, 8)) * 0.2, jnp.bfloat16)
    loss = lambda fn: lambda x, k: jnp.sum(fn(x, k).astype(jnp.float32) ** 2)  # noqa: E731
    ours = jax.jit(jax.grad(loss(project), argnums=(0, 1)))(x, kernel)
    want = jax.grad(loss(lambda x, k: jnp.tensordot(x, k, axes=1)), argnums=(0, 1))(x, kernel)
    for got, ref in zip(ours, want):
        assert got.dtype == jnp.bfloat16
        scale = float(jnp.abs(ref.astype(jnp.float32)).max())
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref, np.float32), atol=2e-2 * scale, rtol=0)
