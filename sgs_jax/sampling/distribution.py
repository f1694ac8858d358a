"""The next-token distribution: temperature, top-k, top-p, sampling, log-probs, entropy.

Pure functions over fp32 logits [B, V]. Order of the warps (as `transformers` and vLLM):
temperature, then top-k, then top-p on the top-k-renormalised distribution. Tokens tied
with the last kept logit are kept too (a threshold, not a sorted-index cut).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def entropy(logits: jax.Array) -> jax.Array:
    """Entropy in nats of softmax(logits) [B, V] -> [B] (temperature 1, no filtering)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.where(logp > -jnp.inf, jnp.exp(logp) * logp, 0.0), axis=-1)


def filter_logits(logits: jax.Array, temperature, top_k, top_p) -> jax.Array:
    """Sampling logits [B, V]: logits / temperature with tokens outside top-k / top-p at -inf.

    temperature > 0 (scalar); top_k: scalar int, 0 = off; top_p: scalar in (0, 1].
    """
    scaled = logits / temperature
    vocab = scaled.shape[-1]
    ranked = -jnp.sort(-scaled, axis=-1)  # descending, [B, V]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    rank = jnp.arange(vocab)[None, :]
    in_top_k = rank < k
    probs = jax.nn.softmax(jnp.where(in_top_k, ranked, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # The top token always stays (mass before it is 0 < top_p).
    kept = in_top_k & (mass_before < top_p)
    num_kept = jnp.sum(kept, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(ranked, num_kept - 1, axis=-1)
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


MODES = ("greedy", "plain", "tempered", "filtered")
_DRAW_BLOCK = 128  # vocabulary block of the two-level inverse-CDF draw


def sampling_mode(temperature: float, top_k: int, top_p: float) -> str:
    """Which static variant of `next_tokens` serves these settings: greedy (temperature
    0), plain (temperature 1, no filtering: the sampling distribution is the model's),
    tempered (temperature only), filtered (top-k / top-p: needs a vocabulary sort)."""
    if temperature == 0:
        return "greedy"
    if top_k > 0 or top_p < 1:
        return "filtered"
    return "plain" if temperature == 1 else "tempered"


def _last_positive(x: jax.Array) -> jax.Array:
    """Index of the last entry > 0 along the last axis (0 when none)."""
    idx = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.max(jnp.where(x > 0, idx, 0), axis=-1)


def draw(weights: jax.Array, keys: jax.Array) -> jax.Array:
    """One index per row from unnormalised non-negative `weights` [B, V] with probability
    weights / sum, by inverse CDF on one uniform per row (`keys` [B, 2]).

    Two levels, so no length-V cumulative sum is taken: the uniform first picks a block of
    `_DRAW_BLOCK` entries from the block sums' cumulative sum, then an entry inside that
    block. An index of weight 0 is never returned (fp32 rounding at the top end is clamped
    to the last positive block / entry)."""
    rows, vocab = weights.shape
    blocks = -(-vocab // _DRAW_BLOCK)
    padded = jnp.pad(weights, ((0, 0), (0, blocks * _DRAW_BLOCK - vocab))).reshape(rows, blocks, _DRAW_BLOCK)
    block_mass = jnp.sum(padded, axis=-1)  # [B, blocks]
    cumulative = jnp.cumsum(block_mass, axis=-1)
    u = jax.vmap(lambda k: jax.random.uniform(k, dtype=jnp.float32))(keys) * cumulative[:, -1]
    block = jnp.minimum(jnp.sum(cumulative <= u[:, None], axis=-1), _last_positive(block_mass))
    inside = jnp.take_along_axis(padded, block[:, None, None], axis=1)[:, 0]  # [B, block]
    before = jnp.take_along_axis(cumulative - block_mass, block[:, None], axis=1)
    entry = jnp.minimum(jnp.sum(before + jnp.cumsum(inside, axis=-1) <= u[:, None], axis=-1), _last_positive(inside))
    return (block * _DRAW_BLOCK + entry).astype(jnp.int32)


def next_tokens(logits: jax.Array, keys: jax.Array, temperature, top_k, top_p, *, mode: str):
    """Choose one token per row and score it.

    logits [B, V] fp32; keys [B, 2] uint32, one PRNG key per row (unused when greedy);
    mode: `sampling_mode(...)` of the runtime temperature / top_k / top_p (scalars).
    Returns (tokens [B] int32, logprobs [B] fp32, entropies [B] fp32): the log-prob under
    the sampling distribution (for greedy, the temperature-1 log-softmax) and the
    temperature-1 entropy (see `Completions`). One exponential pass over the vocabulary
    serves entropy, log-prob and the draw in plain mode.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    logits = logits.astype(jnp.float32)
    shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
    exp = jnp.exp(shifted)
    total = jnp.sum(exp, axis=-1)
    log_total = jnp.log(total)
    ent = log_total - jnp.sum(exp * shifted, axis=-1) / total
    if mode == "greedy":
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    elif mode == "plain":
        tokens = draw(exp, keys)
    else:
        sampling = filter_logits(logits, temperature, top_k, top_p) if mode == "filtered" else logits / temperature
        shifted = sampling - jnp.max(sampling, axis=-1, keepdims=True)
        exp = jnp.exp(shifted)
        log_total = jnp.log(jnp.sum(exp, axis=-1))
        tokens = draw(exp, keys)
    chosen = jnp.take_along_axis(shifted, tokens[:, None], axis=-1)[:, 0] - log_total
    return tokens, chosen, ent


def row_keys(seed: int, prompt_index, sample_index) -> np.ndarray:
    """Per-row base keys [R, 2] uint32 from (seed, prompt index [R], sample index [R]); step t
    of a row draws with fold_in(base, t), so a row's stream depends on nothing else.

    One compiled program per power-of-two row count (the indices are padded, the keys of the
    padding dropped), so calls with different row counts do not each compile."""
    prompt_index, sample_index = np.asarray(prompt_index, np.int32), np.asarray(sample_index, np.int32)
    rows = len(prompt_index)
    size = 1 << max(rows - 1, 0).bit_length()
    padding = (0, size - rows)
    keys = _row_keys(jax.random.PRNGKey(seed), np.pad(prompt_index, padding), np.pad(sample_index, padding))
    return np.asarray(keys)[:rows]


@jax.jit
def _row_keys(base: jax.Array, prompt_index: jax.Array, sample_index: jax.Array) -> jax.Array:
    one = lambda p, s: jax.random.fold_in(jax.random.fold_in(base, p), s)  # noqa: E731
    return jax.vmap(one)(prompt_index, sample_index)
