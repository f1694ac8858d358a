"""Temperature / top-k / top-p warps, entropy, the inverse-CDF draw and sampling against NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from sgs_jax.sampling.distribution import draw, filter_logits, next_tokens, row_keys, sampling_mode
from tests.sampling.reference import entropy as np_entropy
from tests.sampling.reference import log_softmax, warped_probs

TOL = 1e-5
CASES = [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 5, 1.0), (0.5, 10, 0.6), (1.0, 1, 1.0), (2.0, 0, 0.05), (1.0, 200, 0.999)]


@pytest.fixture(scope="module")
def logits():
    return np.random.default_rng(0).normal(0, 2.0, size=(6, 50)).astype(np.float32)


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_filter_matches_numpy(logits, temperature, top_k, top_p):
    got = np.asarray(filter_logits(jnp.asarray(logits), temperature, top_k, top_p))
    got_probs = np.exp(log_softmax(got.astype(np.float64)))
    for row in range(logits.shape[0]):
        expected = warped_probs(logits[row].astype(np.float64), temperature, top_k, top_p)
        np.testing.assert_array_equal(got[row] > -np.inf, expected > 0)
        np.testing.assert_allclose(got_probs[row], expected, atol=TOL, rtol=0)


def _entropy(logits):
    keys = row_keys(0, jnp.arange(len(logits)), jnp.zeros(len(logits), jnp.int32))
    return np.asarray(next_tokens(jnp.asarray(logits), keys, 1.0, 0, 1.0, mode="plain")[2])


def test_entropy_matches_numpy(logits):
    np.testing.assert_allclose(_entropy(logits), np_entropy(logits.astype(np.float64)), atol=TOL, rtol=0)
    uniform = np.zeros((1, 50), np.float32)  # hand value: log(50)
    np.testing.assert_allclose(_entropy(uniform), [np.log(50)], atol=TOL)


def test_sampling_modes():
    assert [sampling_mode(*a) for a in [(0, 5, 0.5), (1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.9)]] == [
        "greedy", "plain", "tempered", "filtered", "filtered"]
    with pytest.raises(ValueError, match="mode"):
        next_tokens(jnp.zeros((1, 4)), jnp.zeros((1, 2), jnp.uint32), 1.0, 0, 1.0, mode="nucleus")


def test_draw_frequencies_and_zero_weights():
    """The two-level inverse-CDF draw over a vocabulary of several blocks (300 entries,
    blocks of 128, zero-weight entries and a whole zero block inside) matches the weights
    (chi-square) and never returns a zero-weight entry."""
    rng = np.random.default_rng(3)
    weights = rng.uniform(0, 1, size=300) ** 3
    weights[130:256] = 0  # most of the second block
    weights[rng.integers(0, 300, size=40)] = 0
    n = 40000
    keys = row_keys(9, jnp.arange(n), jnp.zeros(n, jnp.int32))
    tok = np.asarray(jax.jit(draw)(jnp.broadcast_to(jnp.asarray(weights, jnp.float32), (n, 300)), keys))
    counts = np.bincount(tok, minlength=300)
    assert counts[weights == 0].sum() == 0
    expected = weights / weights.sum()
    assert stats.chisquare(counts[expected > 0], n * expected[expected > 0])[1] > 1e-3
    # One positive entry at the very end: every draw returns it.
    spike = np.zeros((4, 300), np.float32)
    spike[:, 299] = 1e-30
    assert np.asarray(draw(jnp.asarray(spike), keys[:4])).tolist() == [299] * 4


def test_greedy_picks_argmax_and_reports_model_logprob(logits):
    keys = row_keys(0, jnp.arange(6), jnp.zeros(6, jnp.int32))
    tok, lp, ent = next_tokens(jnp.asarray(logits), keys, 1.0, 0, 1.0, mode="greedy")
    np.testing.assert_array_equal(np.asarray(tok), logits.argmax(-1))
    expected = log_softmax(logits.astype(np.float64))[np.arange(6), logits.argmax(-1)]
    np.testing.assert_allclose(np.asarray(lp), expected, atol=TOL)
    np.testing.assert_allclose(np.asarray(ent), np_entropy(logits.astype(np.float64)), atol=TOL)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 0.8), (1.0, 6, 1.0), (0.6, 0, 1.0)])
def test_sampled_frequencies_chi_square(temperature, top_k, top_p):
    """Draws from one row's distribution over many keys match it (chi-square, fixed seed);
    the same counts reject the untempered softmax, so the test has power."""
    row = np.random.default_rng(1).normal(0, 1.5, size=(30,)).astype(np.float32)
    n = 20000
    keys = row_keys(7, jnp.arange(n), jnp.zeros(n, jnp.int32))
    batch = jnp.broadcast_to(jnp.asarray(row), (n, 30))
    mode = sampling_mode(temperature, top_k, top_p)
    tok, lp, _ = jax.jit(lambda b, k: next_tokens(b, k, temperature, top_k, top_p, mode=mode))(batch, keys)
    counts = np.bincount(np.asarray(tok), minlength=30)
    expected = warped_probs(row.astype(np.float64), temperature, top_k, top_p)
    assert counts[expected == 0].sum() == 0, "a filtered-out token was sampled"
    support = expected > 0
    _, p_value = stats.chisquare(counts[support], n * expected[support])
    assert p_value > 1e-3
    plain = np.exp(log_softmax(row.astype(np.float64)))
    _, p_wrong = stats.chisquare(counts, n * plain)
    assert p_wrong < 1e-6
    np.testing.assert_allclose(np.asarray(lp), np.log(expected[np.asarray(tok)]), atol=TOL)
