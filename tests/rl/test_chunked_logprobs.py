"""Chunked target log-probabilities equal a whole-vocabulary log-softmax, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgs_jax.models import create_model, tiny
from sgs_jax.rl.logprobs import chunked_target_logprobs, token_logprobs
from tests.rl.train_support import log_softmax


@pytest.fixture(scope="module")
def setup():
    model = create_model(tiny(), seed=3)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(3, 97, (2, 7)), jnp.int32)
    targets = jnp.asarray(rng.integers(0, 97, (2, 7)), jnp.int32)
    return model, ids, targets


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_matches_numpy_log_softmax(setup, chunk):
    model, ids, targets = setup
    got = token_logprobs(model, ids, jnp.ones(ids.shape, bool), targets, chunk_size=chunk)
    logp = log_softmax(np.asarray(model(ids)))
    expected = np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5, rtol=0)


def test_gradient_matches_unchunked(setup):
    model, ids, targets = setup
    hidden = model.hidden_states(ids)
    w = jnp.asarray(np.random.default_rng(1).normal(size=targets.shape), jnp.float32)

    def chunked(h):
        return jnp.sum(w * chunked_target_logprobs(model.logits_from_hidden, h, targets, chunk_size=3))

    def whole(h):
        logp = jax.nn.log_softmax(model.logits_from_hidden(h), axis=-1)
        return jnp.sum(w * jnp.take_along_axis(logp, targets[..., None], -1)[..., 0])

    np.testing.assert_allclose(np.asarray(jax.grad(chunked)(hidden)), np.asarray(jax.grad(whole)(hidden)), atol=1e-6, rtol=0)


def test_right_padded_rows_need_no_padding_mask():
    """right_padded=True (what the Trainer passes) drops the padding mask: real tokens'
    log-probs are unchanged, as causal attention alone keeps trailing padding out."""
    model = create_model(tiny(), seed=3)
    rng = np.random.default_rng(2)
    ids = jnp.asarray(rng.integers(3, 97, (3, 64)), jnp.int32)
    mask = np.arange(64)[None, :] < np.array([[64], [40], [9]])
    masked = token_logprobs(model, ids, jnp.asarray(mask), ids, chunk_size=16)
    unmasked = token_logprobs(model, ids, jnp.asarray(mask), ids, chunk_size=16, right_padded=True)
    np.testing.assert_allclose(np.asarray(unmasked)[mask], np.asarray(masked)[mask], atol=1e-5, rtol=0)
