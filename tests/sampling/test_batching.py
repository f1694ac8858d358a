"""Continuous batching, stop handling, length caps, reproducibility and compiled-program reuse."""

import numpy as np
import pytest
from scipy import stats

from sgs_jax.models import tiny
from sgs_jax.sampling import Sampler, SamplingParams
from tests.sampling.conftest import BUCKETS, random_model
from tests.sampling.reference import full_logits, warped_probs

PLAIN = SamplingParams(temperature=1.0, max_new_tokens=10, num_samples=3, max_total_len=64, seed=4)


def _tokens(out):
    return [[c.token_ids for c in row] for row in out]


def test_results_do_not_depend_on_slots_or_chunking(model, sampler, prompts):
    prompts = [p for p in prompts if len(p) <= 8]  # one prefill bucket: fewer programs to compile
    # 2 slots, 3-step chunks, and a 32-slot attention window instead of the 256-slot cache.
    other = Sampler(model.config, max_batch=2, prompt_buckets=BUCKETS, chunk_steps=3, min_window=32)
    a = sampler.generate(model, prompts, PLAIN)
    done = []  # (prompt, completions, rows finished so far) per on_prompt_done call
    b = other.generate(model, prompts, PLAIN, on_prompt_done=lambda i, c: done.append((i, c)))
    assert _tokens(a) == _tokens(b)
    # Each prompt reported once, as soon as its 3 samples finished, with the returned completions.
    assert sorted(i for i, _ in done) == list(range(len(prompts)))
    assert all(c == b[i] for i, c in done)
    for ra, rb in zip(a, b):
        for ca, cb in zip(ra, rb):
            np.testing.assert_allclose(ca.logprobs, cb.logprobs, atol=1e-5)
    assert other.last_stats.num_slots == 2 and other.last_stats.refills >= 4
    assert other.last_stats.max_window == 32 < other.last_stats.cache_len == sampler.last_stats.max_window
    # A different seed changes the samples; samples of one prompt differ from each other.
    c = sampler.generate(model, prompts, SamplingParams(**{**PLAIN.__dict__, "seed": 5}))
    assert _tokens(c) != _tokens(a)
    assert len(set(_tokens(a)[0])) == 3


def test_stop_tokens_end_rows_and_are_kept(model, sampler, prompts):
    greedy = SamplingParams(temperature=0, max_new_tokens=12, num_samples=3, max_total_len=64, stop_token_ids=())
    free = sampler.generate(model, prompts, greedy)[0][0].token_ids
    stop = free[3]
    first = free.index(stop)
    out = sampler.generate(model, prompts, SamplingParams(**{**greedy.__dict__, "stop_token_ids": (stop,)}))
    got = out[0][0]
    assert got.token_ids == free[: first + 1] and got.finish_reason == "stop"
    for row in out:
        for c in row:
            assert stop not in c.token_ids[:-1]
            assert (c.finish_reason == "stop") == (c.token_ids[-1] == stop)


def test_total_length_cap_and_per_prompt_caps(model, sampler, prompts):
    capped = sampler.generate(model, prompts, SamplingParams(max_new_tokens=12, num_samples=3, max_total_len=24, stop_token_ids=()))
    for prompt, row in zip(prompts, capped):
        for c in row:
            assert len(c.token_ids) == min(12, 24 - len(prompt)) and c.finish_reason == "length"
    caps = [1, 5, 3, 12]
    out = sampler.generate(model, prompts, SamplingParams(**{**PLAIN.__dict__, "stop_token_ids": ()}), max_new_tokens_per_prompt=caps)
    assert [[len(c.token_ids) for c in row] for row in out] == [[cap] * 3 for cap in caps]
    st = sampler.last_stats
    assert st.generated_tokens == 3 * sum(caps) and 0 <= st.decode_waste < 1
    assert st.slot_steps == st.decode_steps * st.num_slots and st.prefill_real_tokens <= st.prefill_tokens


def test_fresh_weights_reuse_compiled_programs(model, sampler, prompts):
    greedy = SamplingParams(temperature=0, max_new_tokens=6, num_samples=3, max_total_len=64)
    sampler.generate(model, prompts, greedy)
    compiled = (sampler._decode._cache_size(), sampler._insert._cache_size())
    other = random_model(model.config, seed=11)
    out = sampler.generate(other, prompts, greedy)  # a Llama; an nnx.State works the same
    assert (sampler._decode._cache_size(), sampler._insert._cache_size()) == compiled
    logits = full_logits(other, prompts[0])
    assert out[0][0].token_ids[0] == int(np.argmax(logits[-1]))


def test_first_token_frequencies_through_the_engine(model, sampler):
    """2000 one-token samples of one prompt through prefill, refills and decode match the
    top-p/temperature distribution of the full-forward logits (chi-square, fixed seed)."""
    prompt = [1, 5]
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=10, max_new_tokens=1, num_samples=2000, max_total_len=64, seed=2)
    out = sampler.generate(model, [prompt], params)
    tokens = np.array([c.token_ids[0] for c in out[0]])
    expected = warped_probs(full_logits(model, prompt)[-1], 0.8, 10, 0.9)
    counts = np.bincount(tokens, minlength=expected.size)
    assert counts[expected == 0].sum() == 0
    support = expected > 0
    assert support.sum() >= 3, "the test needs a spread distribution"
    _, p_value = stats.chisquare(counts[support], len(tokens) * expected[support])
    assert p_value > 1e-3
    untempered = warped_probs(full_logits(model, prompt)[-1], 1.0, 10, 0.9)  # power check
    assert stats.chisquare(counts[support], len(tokens) * untempered[support] / untempered[support].sum())[1] < 1e-6


def test_bad_prompts_and_parameters_are_clear_errors(model, sampler):
    from sgs_jax.sampling import PromptError

    with pytest.raises(PromptError) as info:
        sampler.generate(model, [[1, 5], [], [1] * 70, [1, 500]], PLAIN)
    assert set(info.value.problems) == {1, 2, 3}
    assert "empty" in info.value.problems[1] and "max_total_len" in info.value.problems[2]
    assert "outside" in info.value.problems[3]
    assert sampler.generate(model, [], PLAIN) == []
    with pytest.raises(ValueError, match="config differs"):
        sampler.generate(random_model(tiny(num_layers=1)), [[1, 2]], PLAIN)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="one cap"):
        sampler.generate(model, [[1, 2]], PLAIN, max_new_tokens_per_prompt=[1, 2])
