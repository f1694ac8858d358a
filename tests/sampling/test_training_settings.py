"""Sampling never inherits training-only settings: every remat policy and both parameter
dtypes (fp32 master weights with bf16 compute, and bf16 weights) sample, and give the same
tokens as a model without remat. (Before, `remat_policy="full"` failed at trace time:
`nnx.remat` inside the decode `lax.while_loop`.)"""

import numpy as np
import pytest

from sgs_jax.models import tiny
from sgs_jax.models.config import REMAT_POLICIES
from sgs_jax.sampling import Sampler, SamplingParams
from tests.sampling.conftest import random_model, token_lists
from tests.sampling.reference import full_logits, log_softmax

PROMPTS = [[1, 5, 6, 7], [1, 40, 41]]
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8, num_samples=2, max_total_len=32, seed=3)
# bf16 compute: the cached and the full forward round differently (bf16 keeps ~3 digits).
BF16_LOGPROB_TOL = 0.1


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"], ids=["fp32_master", "bf16"])
def test_sampling_under_every_remat_policy_and_param_dtype(param_dtype):
    def config(policy):
        return tiny(max_position_embeddings=64, dtype="bfloat16", param_dtype=param_dtype, remat_policy=policy)

    # Built from a training config (as an SGS run does): its programs never remat.
    sampler = Sampler(config("full"), max_batch=4, prompt_buckets=(8,), chunk_steps=4)
    assert sampler.config.remat_policy == "none"
    outputs = {}
    for policy in REMAT_POLICIES:
        model = random_model(config(policy), seed=0)  # the same weights under each policy
        out = sampler.generate(model, PROMPTS, PARAMS)
        outputs[policy] = token_lists(out)
        if policy != "full":
            continue
        for row in range(len(out)):
            prompt, tokens = PROMPTS[out.prompt_index[row]], out.tokens(row)
            assert len(tokens) and np.isfinite(out.row_logprobs(row)).all()
            ids = prompt + tokens.tolist()
            logits = full_logits(model, ids)[len(prompt) - 1 : len(ids) - 1]
            expected = log_softmax(logits)[np.arange(len(tokens)), tokens]
            np.testing.assert_allclose(out.row_logprobs(row), expected, atol=BF16_LOGPROB_TOL, rtol=0)
    assert outputs["full"] == outputs["none"] and outputs["dots"] == outputs["none"]
