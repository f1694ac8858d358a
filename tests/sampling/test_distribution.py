"""Temperature / top-k / top-p warps, entropy and sampling against NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from sgs_jax.sampling.distribution import entropy, filter_logits, next_tokens, row_keys
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


def test_entropy_matches_numpy(logits):
    np.testing.assert_allclose(np.asarray(entropy(jnp.asarray(logits))), np_entropy(logits.astype(np.float64)), atol=TOL, rtol=0)
    uniform = np.zeros((1, 50), np.float32)  # hand value: log(50)
    np.testing.assert_allclose(np.asarray(entropy(jnp.asarray(uniform))), [np.log(50)], atol=TOL)


def test_greedy_picks_argmax_and_reports_model_logprob(logits):
    keys = row_keys(0, jnp.arange(6), jnp.zeros(6, jnp.int32))
    tok, lp, ent = next_tokens(jnp.asarray(logits), keys, 1.0, 0, 1.0, greedy=True, filtered=False)
    np.testing.assert_array_equal(np.asarray(tok), logits.argmax(-1))
    expected = log_softmax(logits.astype(np.float64))[np.arange(6), logits.argmax(-1)]
    np.testing.assert_allclose(np.asarray(lp), expected, atol=TOL)
    np.testing.assert_allclose(np.asarray(ent), np_entropy(logits.astype(np.float64)), atol=TOL)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 0.8), (1.0, 6, 1.0)])
def test_sampled_frequencies_chi_square(temperature, top_k, top_p):
    """Draws from one row's distribution over many keys match it (chi-square, fixed seed);
    the same counts reject the untempered softmax, so the test has power."""
    row = np.random.default_rng(1).normal(0, 1.5, size=(30,)).astype(np.float32)
    n = 20000
    keys = row_keys(7, jnp.arange(n), jnp.zeros(n, jnp.int32))
    batch = jnp.broadcast_to(jnp.asarray(row), (n, 30))
    tok, lp, _ = jax.jit(lambda b, k: next_tokens(b, k, temperature, top_k, top_p, greedy=False, filtered=True))(batch, keys)
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
