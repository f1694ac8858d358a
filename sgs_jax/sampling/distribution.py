"""The next-token distribution: temperature, top-k, top-p, sampling, log-probs, entropy.

Pure functions over fp32 logits [B, V]. Order of the warps (as `transformers` and vLLM):
temperature, then top-k, then top-p on the top-k-renormalised distribution. Tokens tied
with the last kept logit are kept too (a threshold, not a sorted-index cut).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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


def next_tokens(logits: jax.Array, keys: jax.Array, temperature, top_k, top_p, *, greedy: bool, filtered: bool):
    """Choose one token per row and score it.

    logits [B, V] fp32; keys [B, 2] uint32, one PRNG key per row (unused when greedy).
    Returns (tokens [B] int32, logprobs [B] fp32, entropies [B] fp32): the log-prob under
    the sampling distribution (for greedy, the temperature-1 log-softmax) and the
    temperature-1 entropy (see `Completion`).
    """
    logits = logits.astype(jnp.float32)
    ent = entropy(logits)
    if greedy:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        sampling = logits
    else:
        sampling = filter_logits(logits, temperature, top_k, top_p) if filtered else logits / temperature
        tokens = jax.vmap(jax.random.categorical)(keys, sampling).astype(jnp.int32)
    logp = jax.nn.log_softmax(sampling, axis=-1)
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, chosen, ent


def row_keys(seed: int, prompt_index: jax.Array, sample_index: jax.Array) -> jax.Array:
    """Per-row base keys [R, 2] from (seed, prompt index [R], sample index [R]); step t of a
    row draws with fold_in(base, t), so a row's stream depends on nothing else."""
    base = jax.random.PRNGKey(seed)
    one = lambda p, s: jax.random.fold_in(jax.random.fold_in(base, p), s)  # noqa: E731
    return jax.vmap(one)(prompt_index, sample_index)
