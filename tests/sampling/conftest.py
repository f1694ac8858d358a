"""Shared tiny model and Sampler: one set of compiled programs serves most tests."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sgs_jax.models import abstract_model, tiny
from sgs_jax.parallel.rules import path_names
from sgs_jax.sampling import Sampler

BUCKETS = (8, 16, 32)


def random_model(config, seed=0, std=0.1, head_std=0.5):
    """A Llama with NumPy-random weights (no per-shape init programs to compile, so fast).

    Larger weights than training init give peaked next-token distributions (logit spread
    of a few nats), so greedy ties are unlikely and sampling tests can tell warps apart."""
    graphdef, abstract = abstract_model(config)
    rng = np.random.default_rng(seed)

    def init(path, leaf):
        names = path_names(path)
        if names[-1] == "scale":
            value = rng.uniform(0.5, 1.5, size=leaf.shape)
        else:
            value = rng.normal(0, head_std if names[0] == "lm_head" else std, size=leaf.shape)
        return jnp.asarray(value, leaf.dtype)

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(init, abstract))


@pytest.fixture(scope="session")
def model():
    return random_model(tiny(max_position_embeddings=512), seed=0)


@pytest.fixture(scope="session")
def sampler(model):
    # Pages of 4 tokens in a 256-token pool: 8 rows of up to 64 tokens would need 512, so
    # long calls page their rows through a pool that cannot hold every worst case.
    return Sampler(model.config, max_batch=8, prompt_buckets=BUCKETS, chunk_steps=4, page_size=4, kv_pool_tokens=256)


def token_lists(out):
    """[prompt][sample] -> generated ids (list) of a `Completions`."""
    per_prompt = {}
    for row in range(len(out)):
        per_prompt.setdefault(int(out.prompt_index[row]), []).append(out.tokens(row).tolist())
    return [per_prompt[p] for p in sorted(per_prompt)]


@pytest.fixture(scope="session")
def prompts():
    """Mixed lengths (1 to 20 tokens), BOS first, no EOS inside."""
    return [[1, 5, 6, 7], [1], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [1, 40, 41]]
