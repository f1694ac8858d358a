"""Scanned layers: the compiled program does not grow with depth, and the stacked layout
holds one slice per layer."""

import time

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from sgs_jax.models import KVCache, abstract_model, create_model, tiny
from sgs_jax.rl.logprobs import token_logprobs


def _instructions(compiled) -> int:
    return sum(1 for line in compiled.as_text().splitlines() if " = " in line)


def _training_step(num_layers: int):
    graphdef, state = abstract_model(tiny(num_layers=num_layers, remat_policy="full"))
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
