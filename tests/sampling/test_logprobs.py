"""Per-token log-probabilities and entropies equal those of full-forward logits (1e-4)."""

import numpy as np
import pytest

from sgs_jax.sampling import SamplingParams
from tests.sampling.reference import entropy, full_logits, log_softmax, warped_probs

TOL = 1e-4


def _check(model, prompts, out, params):
    checked = 0
    for row in range(len(out)):
        prompt, tokens = prompts[out.prompt_index[row]], out.tokens(row)
        ids = list(prompt) + tokens.tolist()
        logits = full_logits(model, ids)[len(prompt) - 1 : len(ids) - 1]  # predicts each generated token
        np.testing.assert_allclose(out.row_entropies(row), entropy(logits), atol=TOL, rtol=0)
        if params.temperature == 1 and not params.filtered:
            expected = log_softmax(logits)[np.arange(len(tokens)), tokens]
        else:
            expected = [np.log(warped_probs(step, params.temperature, params.top_k, params.top_p)[tok]) for step, tok in zip(logits, tokens)]
        np.testing.assert_allclose(out.row_logprobs(row), expected, atol=TOL, rtol=0)
        checked += len(tokens)
    assert checked > 40


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 10, 0.8), (1.5, 0, 0.95)], ids=["plain", "topk_topp", "topp"]
)
def test_sampled_logprobs_and_entropies(model, sampler, prompts, temperature, top_k, top_p):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=10, num_samples=3, max_total_len=64, seed=4)
    _check(model, prompts, sampler.generate(model, prompts, params), params)
