"""Per-token log-probabilities of given target tokens, with the vocabulary projection
chunked over the sequence so the [T, vocab] logits never exist whole.

At 8K tokens and a 102,400 vocabulary one row of fp32 logits is 3.3 GB. Here the hidden
states [B, T, E] are cut into chunks of `chunk_size` positions; each chunk's logits are
made, reduced to log p(target) and dropped. Each chunk is rematerialised
(`jax.checkpoint`), so the backward pass keeps only the hidden states, not the logits.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def chunked_target_logprobs(
    logits_fn: Callable[[jax.Array], jax.Array],
    hidden: jax.Array,
    targets: jax.Array,
    chunk_size: int = 1024,
) -> jax.Array:
    """log softmax(logits_fn(hidden))[..., target] as [B, T] float32.

    logits_fn: [B, C, E] -> [B, C, V] (fp32 logits). hidden: [B, T, E]; targets: [B, T]
    int. T need not be a multiple of chunk_size (the tail is padded, then cut off).
    """
    b, t, e = hidden.shape
    chunk = max(1, min(chunk_size, t))
    num_chunks = -(-t // chunk)
    if num_chunks == 1:  # short sequences: no loop, no remat
        return _target_logprobs(logits_fn, hidden, targets)
    pad = num_chunks * chunk - t
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # [num_chunks, B, C, ...]: lax.map runs the chunks one after another.
    h_chunks = hidden.reshape(b, num_chunks, chunk, e).swapaxes(0, 1)
    t_chunks = targets.reshape(b, num_chunks, chunk).swapaxes(0, 1)

    one_chunk = jax.checkpoint(lambda args: _target_logprobs(logits_fn, *args))
    logprobs = jax.lax.map(one_chunk, (h_chunks, t_chunks))  # [num_chunks, B, C]
    return logprobs.swapaxes(0, 1).reshape(b, num_chunks * chunk)[:, :t]


def _target_logprobs(logits_fn, hidden, targets):
    logits = logits_fn(hidden).astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def token_logprobs(
    model, input_ids: jax.Array, attention_mask: jax.Array, targets: jax.Array, chunk_size: int = 1024,
    right_padded: bool = False, segment_ids: jax.Array | None = None, layer_grad_acc=None,
) -> jax.Array:
    """[B, T] float32 log p(targets[b, t] | input_ids[b, :t+1]) under `model` (a `Llama`).

    input_ids, targets: [B, T] int; attention_mask: [B, T] (real input tokens). Values at
    padding positions are meaningless; mask them in the loss. right_padded: every row's
    real tokens come first (as `MicroBatch` rows do), so attention needs no padding mask
    (see `Llama.hidden_states`, as for `segment_ids`: packed rows, and `layer_grad_acc`:
    the Trainer's in-place gradient accumulation).
    """
    hidden = model.hidden_states(
        input_ids, attention_mask, right_padded=right_padded, segment_ids=segment_ids, layer_grad_acc=layer_grad_acc
    )
    return chunked_target_logprobs(model.logits_from_hidden, hidden, targets, chunk_size)
