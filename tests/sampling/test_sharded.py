"""The engine on a (data 2, fsdp 2, tensor 2) mesh of simulated CPU devices: sampled tokens'
log-probs and entropies equal the unsharded full forward's, and greedy equals argmax."""

import numpy as np
import pytest

from sgs_jax.models import tiny
from sgs_jax.parallel import make_mesh
from sgs_jax.sampling import Sampler, SamplingParams
from tests.sampling.conftest import BUCKETS, random_model
from tests.sampling.reference import entropy, full_logits, log_softmax


def test_sharded_sampling_matches_full_forward():
    config = tiny(num_heads=8, num_kv_heads=4, head_dim=4, vocab_size=96, intermediate_size=64, max_position_embeddings=512)
    model = random_model(config, seed=2)
    sampler = Sampler(config, mesh=make_mesh(data=2, fsdp=2, tensor=2), max_batch=8, prompt_buckets=BUCKETS, chunk_steps=4)
    prompts = [[1, 5, 6], [1, 9, 10, 11, 12], [1, 20]]
    params = SamplingParams(temperature=1.0, max_new_tokens=8, num_samples=3, max_total_len=64, seed=1)
    out = sampler.generate(model, prompts, params)
    for prompt, row in zip(prompts, out):
        for sample in row:
            ids = prompt + list(sample.token_ids)
            logits = full_logits(model, ids)[len(prompt) - 1 : len(ids) - 1]
            steps = np.arange(len(sample.token_ids))
            np.testing.assert_allclose(sample.logprobs, log_softmax(logits)[steps, sample.token_ids], atol=1e-4, rtol=0)
            np.testing.assert_allclose(sample.entropies, entropy(logits), atol=1e-4, rtol=0)


def test_slots_split_over_the_batch_devices():
    config = tiny(num_heads=8, num_kv_heads=4, head_dim=4, vocab_size=96, intermediate_size=64)
    mesh = make_mesh(data=2, fsdp=4, tensor=1)
    with pytest.raises(ValueError, match=r"max_batch \(sampler slots\)=12 rows .*= 8 devices"):
        Sampler(config, mesh=mesh, max_batch=12)
    sampler = Sampler(config, mesh=mesh, max_batch=32)
    assert [sampler.num_slots(n) for n in (1, 3, 8, 9, 40)] == [8, 8, 8, 16, 32]  # padded, never fewer than 8
    assert Sampler(config, max_batch=32).num_slots(3) == 4  # no mesh: the next power of two
