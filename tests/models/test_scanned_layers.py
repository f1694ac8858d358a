"""Scanned layers: the compiled program does not grow with depth, and the stacked layout
holds one slice per layer; unrolled (`layer_loop`), the same results."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sgs_jax.models import KVCache, abstract_model, create_model, llama, tiny
from sgs_jax.parallel.mesh import make_mesh
from sgs_jax.parallel.rules import activation_sharding
from sgs_jax.rl.logprobs import token_logprobs


def _instructions(compiled) -> int:
    return sum(1 for line in compiled.as_text().splitlines() if " = " in line)


def _training_step(num_layers: int, layer_loop: str = "scan"):
    graphdef, state = abstract_model(tiny(num_layers=num_layers, remat_policy="full", layer_loop=layer_loop))
    ids = jax.ShapeDtypeStruct((2, 16), jnp.int32)

    def loss(params, ids):
        model = nnx.merge(graphdef, params)
        return -jnp.sum(token_logprobs(model, ids, jnp.ones(ids.shape, bool), ids))

    return jax.jit(jax.grad(loss)).lower(state, ids)


def _decode_step(num_layers: int):
    config = tiny(num_layers=num_layers)
    graphdef, state = abstract_model(config)
    cache = jax.eval_shape(lambda: KVCache.create(config, 2, 32))
    ids = jax.ShapeDtypeStruct((2, 1), jnp.int32)
    return jax.jit(lambda p, x, c: nnx.merge(graphdef, p).forward_cached(x, c)).lower(state, ids, cache)


@pytest.mark.parametrize("program", [_training_step, _decode_step], ids=["train_grad", "decode"])
def test_compiled_program_size_does_not_grow_with_depth(program):
    sizes, times = {}, {}
    for layers in (2, 24):
        start = time.perf_counter()
        sizes[layers] = _instructions(program(layers).compile())
        times[layers] = time.perf_counter() - start
    print(f"{program.__name__}: compile 2 layers {times[2]:.2f} s, 24 layers {times[24]:.2f} s; "
          f"{sizes[2]} vs {sizes[24]} HLO instructions")
    assert sizes[2] == sizes[24]


def test_parameters_are_stacked_over_layers():
    config = tiny(num_layers=3)
    model = create_model(config, seed=0)
    q = model.layers.attn.q_proj.kernel[...]
    assert q.shape == (3, config.hidden_size, config.num_heads, config.head_dim)
    assert model.layers.attn_norm.scale[...].shape == (3, config.hidden_size)
    assert model.final_norm.scale[...].shape == (config.hidden_size,)
    # Each layer drew its own weights.
    assert not jnp.allclose(q[0], q[1])


def _gradient(config, ids, mesh=None):
    """Loss and parameter gradients of a token log-prob loss, compiled HLO size too."""
    graphdef, state = nnx.split(create_model(config, seed=3))

    def loss(params):
        model = nnx.merge(graphdef, params)
        return -jnp.sum(token_logprobs(model, ids, jnp.ones(ids.shape, bool), ids))

    def run():
        fn = jax.jit(jax.value_and_grad(loss))
        return _instructions(fn.lower(state).compile()), fn(state)

    if mesh is None:
        return run()
    with activation_sharding(mesh):
        return run()


@pytest.mark.parametrize("remat", ["none", "dots", "full"])
def test_unrolled_layers_equal_the_scan(remat):
    """`layer_loop="unrolled"` traces the layers one after another over the same stacked
    parameters: the loss and every gradient equal the scan's (fp32, 1e-6)."""
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 97, size=(2, 24)), jnp.int32)
    config = tiny(num_layers=3, remat_policy=remat)
    _, (want_loss, want_grads) = _gradient(config.replace(layer_loop="scan"), ids)
    _, (loss, grads) = _gradient(config.replace(layer_loop="unrolled"), ids)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    for got, want in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)


def test_auto_unrolls_on_one_cpu_device_and_scans_on_a_mesh():
    """`layer_loop="auto"` unrolls where XLA:CPU stacks the scan's saved activations (one CPU
    device: the program grows with depth) and keeps the scan on a mesh of several devices,
    the stand-in for accelerators (it does not)."""
    if jax.device_count() < 2:
        pytest.skip("needs several (simulated) devices")
    ids = jnp.zeros((2, 16), jnp.int32)
    sizes = {layers: _gradient(tiny(num_layers=layers), ids)[0] for layers in (2, 4)}
    assert sizes[4] > sizes[2]
    mesh = make_mesh(data=1, fsdp=2, tensor=1, devices=jax.devices()[:2])
    sizes = {layers: _gradient(tiny(num_layers=layers), ids, mesh)[0] for layers in (2, 4)}
    assert sizes[4] == sizes[2]


def _dots(jaxpr) -> int:
    """dot_general equations in a jaxpr, nested ones (custom VJPs, remat) included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "dot_general"
        for sub in jax.core.jaxprs_in_params(eqn.params):
            count += _dots(sub)
    return count


def test_unrolled_layers_on_one_cpu_device_multiply_by_fused_kernels():
    """Unrolled on one CPU device, each layer runs four products (q/k/v fused, o, gate/up
    fused, down) where the scan runs seven, besides the attention's own products; the
    equality test above holds them to the scan's numbers."""
    config = tiny(num_layers=3)
    graphdef, state = nnx.split(create_model(config, seed=0))
    ids = jnp.zeros((2, 8), jnp.int32)

    def forward_dots(layer_loop):
        model = nnx.merge(graphdef, state)
        model.config = config.replace(layer_loop=layer_loop)
        return _dots(jax.make_jaxpr(lambda i: model.hidden_states(i))(ids).jaxpr)

    attention = forward_dots("scan") - 7  # one traced body: seven projections and the attention's products
    assert forward_dots("unrolled") == 3 * (4 + attention)


def test_unrolled_layers_compute_the_rope_tables_once():
    """Unrolled, the RoPE tables are evaluated as often as in the scan (once, each op of
    `rope.sincos` in one place), not again in every layer's q and k fusions, forward and
    backward: the compiled gradient holds as many of `sincos`'s roundings as the scan's,
    fewer than with the tables left to XLA's fusion (`llama._computed_once`)."""
    ids = jnp.zeros((2, 16), jnp.int32)

    def roundings(layer_loop):
        graphdef, state = nnx.split(create_model(tiny(num_layers=3, layer_loop=layer_loop), seed=0))

        def loss(params, mask):  # the mask an argument, as the Trainer's micro-batches pass it
            return -jnp.sum(token_logprobs(nnx.merge(graphdef, params), ids, mask, ids))

        compiled = jax.jit(jax.grad(loss)).lower(state, jnp.ones(ids.shape, bool)).compile()
        return compiled.as_text().count("round-nearest-even(")

    once = roundings("unrolled")
    assert once == roundings("scan")
    original = llama._computed_once
    try:
        llama._computed_once = lambda compute, any_real_token: compute()
        assert roundings("unrolled") > once
    finally:
        llama._computed_once = original


def test_unstack_layers_gradient_is_one_concatenate():
    """`unstack_layers` splits each stacked array once: its gradient concatenates the
    layers' gradients (no per-layer pad to the full [layers, ...] shape), and the slices
    are the layers' own."""
    stacked = {"w": jnp.arange(24.0).reshape(4, 3, 2)}
    layers = llama.unstack_layers(stacked, 4)
    for index, layer in enumerate(layers):
        np.testing.assert_array_equal(layer["w"], stacked["w"][index])

    def loss(stacked):
        return sum(jnp.sum(layer["w"] ** 2) * (i + 1) for i, layer in enumerate(llama.unstack_layers(stacked, 4)))

    grad_jaxpr = jax.make_jaxpr(jax.grad(loss))(stacked).jaxpr
    names = {eqn.primitive.name for eqn in grad_jaxpr.eqns}
    assert "concatenate" in names and "pad" not in names
    want = 2 * stacked["w"] * jnp.arange(1.0, 5.0)[:, None, None]
    np.testing.assert_allclose(jax.grad(loss)(stacked)["w"], want, rtol=1e-6)


def test_layer_loop_is_checked():
    with pytest.raises(ValueError, match="layer_loop must be one of"):
        tiny(layer_loop="python")
