"""Target log-probabilities (`rl.logprobs`), chunked over every position or run only on
the chunks holding loss positions, equal a whole-vocabulary log-softmax: values and
gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgs_jax.models import create_model, tiny
from sgs_jax.rl.logprobs import chunked_target_logprobs, loss_position_logprobs, sort_loss_positions_first, token_logprobs
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


def test_chunked_gradient_matches_unchunked(setup):
    model, ids, targets = setup
    hidden = model.hidden_states(ids)
    w = jnp.asarray(np.random.default_rng(1).normal(size=targets.shape), jnp.float32)

    def chunked(h):
        return jnp.sum(w * chunked_target_logprobs(model.logits_from_hidden, h, targets, chunk_size=3))

    def whole(h):
        logp = jax.nn.log_softmax(model.logits_from_hidden(h), axis=-1)
        return jnp.sum(w * jnp.take_along_axis(logp, targets[..., None], -1)[..., 0])

    np.testing.assert_allclose(np.asarray(jax.grad(chunked)(hidden)), np.asarray(jax.grad(whole)(hidden)), atol=1e-6, rtol=0)


def _masked_case(seed=0, b=4, t=37, e=16, v=50):
    """Random hidden states, head and targets, and a loss mask with a run per row of
    different lengths, a row of two runs and an empty row."""
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(b, t, e)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(e, v)) * 0.3, jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    mask = np.zeros((b, t), bool)
    mask[0, 5:20] = mask[1, 30:] = True
    mask[2, 2:4] = mask[2, 10:12] = True  # row 3 has none
    return hidden, head, targets, mask


def _whole(hidden, head, targets, mask):
    logp = jax.nn.log_softmax(hidden @ head, axis=-1)
    return jnp.where(mask, jnp.take_along_axis(logp, targets[..., None], -1)[..., 0], 0.0)


# chunk_size >= 37 keeps the softmax (rows in chunks of 10 here, of 37 with the default
# kept chunk); smaller ones recompute it.
@pytest.mark.parametrize("chunk", [1, 4, 8, 36, 37, 1024])
@pytest.mark.parametrize("kept_chunk", [10, 64])
def test_loss_positions_values_and_gradients(chunk, kept_chunk):
    hidden, head, targets, mask = _masked_case()
    w = jnp.asarray(np.random.default_rng(1).normal(size=mask.shape), jnp.float32)
    got = jax.jit(loss_position_logprobs, static_argnums=(4, 5))(hidden, head, targets, jnp.asarray(mask), chunk, kept_chunk)
    np.testing.assert_allclose(np.asarray(got), np.asarray(_whole(hidden, head, targets, mask)), atol=1e-6, rtol=0)
    assert not np.asarray(got)[~mask].any()  # exactly 0 off the loss positions

    loss = lambda fn: lambda h, k: jnp.sum(w * fn(h, k))  # noqa: E731
    ours = jax.jit(jax.grad(loss(lambda h, k: loss_position_logprobs(h, k, targets, jnp.asarray(mask), chunk, kept_chunk)), (0, 1)))(hidden, head)
    want = jax.grad(loss(lambda h, k: _whole(h, k, targets, mask)), (0, 1))(hidden, head)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=0)


def test_chunks_past_every_rows_loss_positions_are_never_read():
    """NaN hidden states wherever a loss-position-first row holds nothing the needed
    chunks reach: values and gradients stay finite, so those chunks never ran."""
    hidden, head, targets, _ = _masked_case()
    mask = np.zeros(targets.shape, bool)
    mask[0, 3:9] = mask[1, 20:22] = True  # at most 6 per row: one chunk of 10 (kept softmax)
    dest, _, _ = sort_loss_positions_first(jnp.asarray(mask))
    unread = np.asarray(dest) >= 10
    hidden = jnp.where(jnp.asarray(unread)[..., None], jnp.nan, hidden)

    def loss(h, k):
        return jnp.sum(loss_position_logprobs(h, k, targets, jnp.asarray(mask), 1024, kept_chunk=10))

    value, (dh, dk) = jax.value_and_grad(loss, (0, 1))(hidden, head)
    assert np.isfinite(float(value)) and np.isfinite(np.asarray(dk)).all()
    assert np.isfinite(np.asarray(dh)[~unread]).all() and not np.asarray(dh)[unread].any()


def test_an_empty_mask_runs_no_chunk():
    hidden, head, targets, _ = _masked_case()
    empty = jnp.zeros(targets.shape, bool)
    value, (dh, dk) = jax.value_and_grad(lambda h, k: jnp.sum(loss_position_logprobs(h, k, targets, empty)), (0, 1))(hidden, head)
    assert float(value) == 0.0 and not np.asarray(dh).any() and not np.asarray(dk).any()


def test_sort_loss_positions_first():
    mask = jnp.asarray([[0, 1, 1, 0, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    dest, perm, count = sort_loss_positions_first(mask)
    np.testing.assert_array_equal(np.asarray(perm), [[1, 2, 4, 0, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(perm), np.asarray(dest), 1), np.tile(np.arange(5), (3, 1)))
    np.testing.assert_array_equal(np.asarray(count), [3, 0, 5])


def test_tied_and_bf16_heads_match_logits_from_hidden():
    """`Llama.lm_head_weights` is the head `logits_from_hidden` multiplies by (tied and
    untied, fp32 and bf16 compute): the log-probs equal a log-softmax of its logits."""
    rng = np.random.default_rng(4)
    for config in (tiny(), tiny(tie_word_embeddings=True), tiny(dtype="bfloat16")):
        model = create_model(config, seed=5)
        hidden = jnp.asarray(rng.normal(size=(2, 9, config.hidden_size)), config.compute_dtype)
        targets = jnp.asarray(rng.integers(0, config.vocab_size, (2, 9)), jnp.int32)
        logp = jax.nn.log_softmax(model.logits_from_hidden(hidden), axis=-1)
        want = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
        got = loss_position_logprobs(hidden, model.lm_head_weights(), targets, jnp.ones(targets.shape, bool))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


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


def test_a_loss_mask_gives_the_same_log_probs_there_and_zeros_elsewhere(setup):
    """token_logprobs with a loss mask (what the Trainer passes; on one CPU device the LM
    head then skips what the mask leaves out) against every position's."""
    model, ids, targets = setup
    mask = jnp.asarray([[0, 0, 1, 1, 1, 0, 0], [0, 1, 0, 0, 0, 0, 1]], bool)
    every = token_logprobs(model, ids, jnp.ones(ids.shape, bool), targets)
    masked = token_logprobs(model, ids, jnp.ones(ids.shape, bool), targets, loss_mask=mask)
    np.testing.assert_allclose(np.asarray(masked), np.where(np.asarray(mask), np.asarray(every), 0.0), atol=1e-6, rtol=0)
