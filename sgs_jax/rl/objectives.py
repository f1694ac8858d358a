"""Solver and Conjecturer losses (method.md §4 step 9 and §5) as pure jnp functions.

Every loss is a function of per-token log-probabilities `logprobs` [batch, tokens] of the
generated tokens under the model being trained, a `mask` [batch, tokens] (1 on generated
tokens, 0 on prompt and padding) and a per-sequence weight or advantage [batch]. Each
returns `(loss, metrics)`; all are jit-able (with `normalization` static) and
differentiable w.r.t. `logprobs`. Values at masked positions are never read, so padding
may hold anything, -inf or NaN included.

Normalisations (the factor each sequence's token sum is multiplied by):
- "batch_tokens" (default, the official code): 1 / (masked tokens in the batch).
- "sequence" (the paper's Eq. 4): 1 / (|y_i| * number of non-empty sequences).
- "group_tokens" (official CISPO): 1 / (tokens of the sequence's group * number of
  groups); needs `group_ids` [batch]. The number of groups is `num_groups` when given
  (the trainer passes the constant groups per optimiser batch, method.md §5), else the
  non-empty groups present.
With micro-batching, compute `sequence_scale` once on the whole optimiser batch and pass
each micro-batch its slice as `scale`: the micro-batch losses then sum to the full loss.

Packed rows (`sgs_jax.rl.batching.pack_micro_batches`: several sequences side by side in a
row) pass `segment_ids` [batch, tokens] (sequences numbered 1, 2, ... within a row, 0 for
padding) and the per-sequence factors per token: `weights` and `scale` [batch, tokens],
each token carrying its sequence's value; `scale` must then be given. Each sequence's
masked tokens must form one run (its completion), which is how the sequence metrics tell
sequences apart. The loss is the same sum, taken token by token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NORMALIZATIONS = ("batch_tokens", "sequence", "group_tokens")


def sequence_scale(
    mask: jax.Array,
    normalization: str = "batch_tokens",
    group_ids: jax.Array | None = None,
    dtype=jnp.float32,
    num_groups: int | None = None,
) -> jax.Array:
    """Per-sequence normaliser [batch] in `dtype` (see the module docstring). Empty
    denominators count as 1, so an all-masked batch gives a zero loss, never NaN.

    mask: [batch, tokens], bool or 0/1. group_ids: [batch] integers, any values
    (sequences with equal ids form a group); required for "group_tokens" only.
    num_groups: the group count "group_tokens" divides by (None: the non-empty groups
    in `mask`); "group_tokens" only. A NumPy `mask` is computed in NumPy (host-side
    callers such as `rl.batching.batch_scale` compile nothing per batch shape).
    """
    xp = np if isinstance(mask, np.ndarray) else jnp
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {normalization!r}; expected one of {NORMALIZATIONS}")
    if (group_ids is None) == (normalization == "group_tokens"):
        raise ValueError("group_ids is required for 'group_tokens' and only for it")
    if num_groups is not None and (normalization != "group_tokens" or num_groups < 1):
        raise ValueError(f"num_groups must be >= 1 and is for 'group_tokens' only, got {num_groups!r}")
    tokens = xp.sum(mask > 0, axis=-1).astype(dtype)  # [batch]
    nonempty = (tokens > 0).astype(dtype)
    if normalization == "batch_tokens":
        return xp.full(tokens.shape, 1.0 / xp.maximum(xp.sum(tokens), 1.0), dtype)
    if normalization == "sequence":
        return 1.0 / (xp.maximum(tokens, 1.0) * xp.maximum(xp.sum(nonempty), 1.0))
    # [batch, batch] membership instead of segment sums: any id values, and batch is small.
    # Elementwise sums, not matmuls, so that accelerators cannot round the counts.
    group_ids = xp.asarray(group_ids)
    same_group = (group_ids[:, None] == group_ids[None, :]).astype(dtype)
    group_tokens = xp.sum(same_group * tokens[None, :], axis=1)
    group_sequences = xp.sum(same_group * nonempty[None, :], axis=1)
    if num_groups is None:
        # Each non-empty sequence adds 1 / (non-empty sequences of its group): sums to #groups.
        num_groups = xp.sum(nonempty / xp.maximum(group_sequences, 1.0))
    return 1.0 / (xp.maximum(group_tokens, 1.0) * xp.maximum(num_groups, 1.0))


def _prepare(logprobs, mask, per_sequence, normalization, group_ids, scale, segment_ids):
    dtype = jnp.promote_types(logprobs.dtype, jnp.float32)
    valid = mask > 0
    lp = jnp.where(valid, logprobs.astype(dtype), 0.0)
    if scale is None:
        if segment_ids is not None:
            raise ValueError("packed rows (segment_ids) need the per-token scale of the whole batch")
        scale = sequence_scale(mask, normalization, group_ids, dtype)
    factors = jnp.asarray(per_sequence, dtype), jnp.asarray(scale, dtype)
    expected = logprobs.shape if segment_ids is not None else logprobs.shape[:1]
    if any(f.shape != expected for f in factors):
        shapes = [f.shape for f in factors]
        raise ValueError(f"weights and scale must be shaped {expected} (packed rows: per token), got {shapes}")
    return lp, valid, valid.astype(dtype), *factors


def _weighted_total(coefficient, per_token):
    """sum_i coefficient_i * sum_t per_token_it, with the coefficient per sequence [batch]
    or per token [batch, tokens] (packed rows)."""
    if coefficient.ndim == 1:
        return jnp.sum(coefficient * jnp.sum(per_token, axis=-1))
    return jnp.sum(coefficient * per_token)


def _sequences(valid, weights, segment_ids):
    """(number of non-empty sequences, sum of their weights). Packed rows: a sequence is
    counted at the first token of its run of masked tokens."""
    if segment_ids is None:
        nonempty = jnp.any(valid, axis=-1).astype(weights.dtype)
    else:
        before = lambda x, fill: jnp.pad(x[:, :-1], ((0, 0), (1, 0)), constant_values=fill)  # noqa: E731
        nonempty = (valid & (~before(valid, False) | (segment_ids != before(segment_ids, -1)))).astype(weights.dtype)
    return jnp.sum(nonempty), jnp.sum(weights * nonempty)


def reinforce_half_loss(
    logprobs: jax.Array,
    mask: jax.Array,
    weights: jax.Array,
    normalization: str = "batch_tokens",
    group_ids: jax.Array | None = None,
    scale: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """REINFORCE½ (method.md §5): the weighted NLL of generated tokens,
    -sum_i scale_i * w_i * sum_t mask_it * logprobs_it. Also the Conjecturer's loss.

    logprobs, mask: [batch, tokens]; weights: [batch] (from
    `sgs_jax.sgs.rewards`: 1, 0 for `try`, the length penalty, or the Conjecturer
    reward); scale: optional [batch] override of `sequence_scale`; packed rows: see the
    module docstring. Metrics: token_count, sequence_count, mean_weight (over non-empty
    sequences), nll_per_token (unweighted, nats).
    """
    lp, valid, m, w, scale = _prepare(logprobs, mask, weights, normalization, group_ids, scale, segment_ids)
    loss = -_weighted_total(scale * w, lp)  # masked entries of lp are already 0
    tokens = jnp.sum(m)
    sequences, weight_sum = _sequences(valid, w, segment_ids)
    metrics = {
        "token_count": tokens,
        "sequence_count": sequences,
        "mean_weight": weight_sum / jnp.maximum(sequences, 1.0),
        "nll_per_token": -jnp.sum(lp) / jnp.maximum(tokens, 1.0),
    }
    return loss, jax.lax.stop_gradient(metrics)


def expert_iteration_loss(
    logprobs: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None = None,
    normalization: str = "batch_tokens",
    group_ids: jax.Array | None = None,
    scale: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Expert Iteration (method.md §5): NLL of buffered correct proofs, weight 1 unless
    `weights` [batch] says otherwise. Shapes and metrics as `reinforce_half_loss`."""
    if weights is None:
        shape = logprobs.shape if segment_ids is not None else logprobs.shape[:1]
        weights = jnp.ones(shape, jnp.promote_types(logprobs.dtype, jnp.float32))
    return reinforce_half_loss(logprobs, mask, weights, normalization, group_ids, scale, segment_ids)


def cispo_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    mask: jax.Array,
    advantages: jax.Array,
    eps_low: float = 1.0,
    eps_high: float = 3.0,
    normalization: str = "batch_tokens",
    group_ids: jax.Array | None = None,
    scale: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """CISPO (method.md §5): -sum_i scale_i * A_i * sum_t mask * sg(w_it) * logprobs_it,
    w = clip(exp(logprobs - old_logprobs), 1 - eps_low, 1 + eps_high).

    logprobs, old_logprobs (the sampler's), mask: [batch, tokens]; advantages: [batch];
    packed rows: see the module docstring. Metrics (over masked tokens):
    clip_fraction_low / _high (ratio below / above the range), clip_fraction (both),
    mean_importance_weight (clipped w), mean_ratio (unclipped), token_count.
    """
    lp, valid, m, adv, scale = _prepare(logprobs, mask, advantages, normalization, group_ids, scale, segment_ids)
    old = jnp.where(valid, old_logprobs.astype(lp.dtype), 0.0)
    ratio = jax.lax.stop_gradient(jnp.exp(lp - old))  # 1 at masked positions
    weight = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = -_weighted_total(scale * adv, weight * lp)
    tokens = jnp.sum(m)
    per_token = lambda x: jnp.sum(x * m) / jnp.maximum(tokens, 1.0)  # noqa: E731
    low = (ratio < 1.0 - eps_low).astype(m.dtype)
    high = (ratio > 1.0 + eps_high).astype(m.dtype)
    metrics = {
        "token_count": tokens,
        "clip_fraction_low": per_token(low),
        "clip_fraction_high": per_token(high),
        "clip_fraction": per_token(low + high),
        "mean_importance_weight": per_token(weight),
        "mean_ratio": per_token(ratio),
    }
    return loss, jax.lax.stop_gradient(metrics)
