"""Greedy decoding equals argmax over repeated full forward passes, and `transformers`
`generate(do_sample=False)` on the same random checkpoint."""

import numpy as np
import torch

from sgs_jax.models import load_hf
from sgs_jax.sampling import SamplingParams
from tests.models.hf_reference import make_hf_model
from tests.sampling.conftest import token_lists
from tests.sampling.reference import full_logits

NEW = 12


def argmax_decode(model, prompt, steps, stop_ids):
    ids, out = list(prompt), []
    for _ in range(steps):
        token = int(np.argmax(full_logits(model, ids)[-1]))
        out.append(token)
        ids.append(token)
        if token in stop_ids:
            break
    return out


def test_greedy_equals_full_forward_argmax(model, sampler, prompts):
    # 4 prompts x 3 samples = 12 rows on 8 slots: refills happen mid-run.
    params = SamplingParams(temperature=0, max_new_tokens=NEW, num_samples=3, max_total_len=64)
    out = sampler.generate(model, prompts, params)
    assert sampler.last_stats.refills >= 2
    got = token_lists(out)
    for i, prompt in enumerate(prompts):
        expected = argmax_decode(model, prompt, NEW, model.config.eos_token_ids)
        assert got[i] == [expected] * 3
        for row in out.rows_of(i):
            assert out.finish_reasons[row] == ("stop" if expected[-1] == 2 else "length")
            assert out.lengths[row] == len(expected)


def test_greedy_equals_transformers_generate(tmp_path, sampler):
    # Same architecture as the shared tiny model, so the shared Sampler's programs serve it.
    hf = make_hf_model(seed=3, max_pos=512, vocab_size=97, intermediate_size=48)
    hf.save_pretrained(tmp_path)
    model = load_hf(tmp_path)
    rng = np.random.default_rng(5)
    prompts = [[1] + rng.integers(3, 97, size=n).tolist() for n in (3, 7, 17)]  # buckets the shared tests use
    new = 20
    out = sampler.generate(model, prompts, SamplingParams(temperature=0, max_new_tokens=new, num_samples=3, max_total_len=64))
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new, eos_token_id=2, pad_token_id=0)
        expected = ref[0, len(prompt):].tolist()
        assert token_lists(out)[i] == [expected] * 3, f"prompt {i}"
