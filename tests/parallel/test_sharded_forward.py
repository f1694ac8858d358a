"""The model on 8 simulated CPU devices, over several mesh shapes, equals the unsharded model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from sgs_jax.models import KVCache, create_model, tiny
from sgs_jax.parallel import activation_sharding, logical_to_spec, make_mesh, resolve_mesh_shape, state_shardings

MESHES = [dict(data=1, fsdp=8, tensor=1), dict(data=2, fsdp=2, tensor=2), dict(data=1, fsdp=2, tensor=4), dict(data=8, fsdp=1, tensor=1)]


@pytest.fixture(scope="module")
def reference():
    assert jax.device_count() == 8, "tests/conftest.py must set 8 simulated devices"
    config = tiny(num_heads=8, num_kv_heads=4, head_dim=4, vocab_size=96, intermediate_size=64)
    model = create_model(config, seed=1)
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 96, size=(8, 10)), jnp.int32)
    return config, model, ids, np.asarray(model(ids))


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s.values())))
def test_sharded_forward_equals_unsharded(reference, shape):
    config, _, ids, expected = reference
    mesh = make_mesh(**shape)
    sharded = create_model(config, seed=1, mesh=mesh)  # created directly in shards
    kernel = sharded.layers.attn.q_proj.kernel[...]  # stacked: [layers, embed, heads, head_dim]
    assert kernel.shape[0] == config.num_layers
    assert kernel.sharding.spec == logical_to_spec(("layers", "embed", "q_heads", "head_dim"), mesh, kernel.shape)
    graphdef, state = nnx.split(sharded)
    batch_sharding = NamedSharding(mesh, logical_to_spec(("batch", "seq"), mesh, ids.shape))

    @jax.jit
    def forward(state, ids):
        with activation_sharding(mesh):
            return nnx.merge(graphdef, state)(ids)

    got = forward(state, jax.device_put(ids, batch_sharding))
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5, rtol=0)


def test_sharded_cached_decode_equals_unsharded(reference):
    config, model, ids, expected = reference
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = create_model(config, seed=1, mesh=mesh)
    cache = KVCache.create(config, batch=8, max_len=12)
    with activation_sharding(mesh):
        logits, cache = jax.jit(lambda m, x, c: m.forward_cached(x, c))(sharded, ids[:, :9], cache)
        step, _ = jax.jit(lambda m, x, c: m.forward_cached(x, c))(sharded, ids[:, 9:10], cache)
    np.testing.assert_allclose(np.asarray(logits), expected[:, :9], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(step[:, 0]), expected[:, 9], atol=1e-5, rtol=0)


def test_indivisible_dimension_falls_back_to_replication():
    mesh = make_mesh(data=1, fsdp=2, tensor=4)
    # 2 KV heads cannot split over tensor=4: replicated on that dimension, still valid.
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), mesh, (32, 2, 8)) == PartitionSpec("fsdp", None, None)
    assert logical_to_spec(("batch", "seq"), mesh, (8, 5)) == PartitionSpec("fsdp", None)


def test_every_parameter_has_a_sharding():
    config = tiny(tie_word_embeddings=False)
    state = nnx.state(create_model(config))
    shardings = state_shardings(state, make_mesh(fsdp=-1))
    assert len(jax.tree_util.tree_leaves(shardings)) == len(jax.tree_util.tree_leaves(state))


def test_mesh_shape_resolution_and_errors():
    assert resolve_mesh_shape(2, -1, 2, num_devices=8) == (2, 2, 2)
    assert resolve_mesh_shape(1, -1, 1, num_devices=1) == (1, 1, 1)
    with pytest.raises(ValueError, match="at most one"):
        resolve_mesh_shape(-1, -1, 1, num_devices=8)
    with pytest.raises(ValueError, match="needs"):
        resolve_mesh_shape(2, 2, 1, num_devices=8)
