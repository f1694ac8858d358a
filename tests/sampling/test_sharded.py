"""The engine on a (data 2, fsdp 2, tensor 2) mesh of simulated CPU devices: rows and KV
pages split over the 4 batch devices (each shard pages its own rows), KV heads over
tensor; sampled tokens' log-probs and entropies equal the unsharded full forward's."""

import jax
import numpy as np
import pytest

from sgs_jax.models import shard_model, tiny
from sgs_jax.parallel import make_mesh
from sgs_jax.sampling import Sampler, SamplingParams
from tests.sampling.conftest import BUCKETS, random_model
from tests.sampling.reference import entropy, full_logits, log_softmax


def test_sharded_sampling_matches_full_forward():
    config = tiny(num_heads=8, num_kv_heads=4, head_dim=4, vocab_size=96, intermediate_size=64, max_position_embeddings=512)
    model = random_model(config, seed=2)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sampler = Sampler(config, mesh=mesh, max_batch=8, prompt_buckets=BUCKETS, chunk_steps=4, page_size=4, kv_pool_tokens=256)
    prompts = [[1, 5, 6], [1, 9, 10, 11, 12, 13, 14], [1, 20]]
    params = SamplingParams(temperature=1.0, max_new_tokens=8, num_samples=3, max_total_len=64, seed=1)
    # Weights in the training layout on the mesh, used as they are.
    sharded = shard_model(random_model(config, seed=2), mesh)
    state = sampler._empty(8, 64, 4)
    P, named = jax.sharding.PartitionSpec, jax.sharding.NamedSharding
    assert state.pool.keys.sharding.is_equivalent_to(named(mesh, P("tensor", None, ("data", "fsdp"), None, None)), 5)
    assert state.cached.sharding.is_equivalent_to(named(mesh, P(("data", "fsdp"))), 1)
    out = sampler.generate(sharded, prompts, params)
    assert sampler.last_stats.num_slots == 8
    for row in range(len(out)):
        prompt, tokens = prompts[out.prompt_index[row]], out.tokens(row)
        ids = prompt + tokens.tolist()
        logits = full_logits(model, ids)[len(prompt) - 1 : len(ids) - 1]
        steps = np.arange(len(tokens))
        np.testing.assert_allclose(out.row_logprobs(row), log_softmax(logits)[steps, tokens], atol=1e-4, rtol=0)
        np.testing.assert_allclose(out.row_entropies(row), entropy(logits), atol=1e-4, rtol=0)
    # The same seed on one device gives the same tokens.
    single = Sampler(config, max_batch=8, prompt_buckets=BUCKETS, chunk_steps=4, page_size=8).generate(model, prompts, params)
    np.testing.assert_array_equal(single.token_ids, out.token_ids)


def test_slots_split_over_the_batch_devices():
    config = tiny(num_heads=8, num_kv_heads=4, head_dim=4, vocab_size=96, intermediate_size=64)
    mesh = make_mesh(data=2, fsdp=4, tensor=1)
    with pytest.raises(ValueError, match=r"max_batch \(sampler slots\)=12 rows .*= 8 devices"):
        Sampler(config, mesh=mesh, max_batch=12)
