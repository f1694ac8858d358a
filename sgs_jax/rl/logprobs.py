"""Per-token log-probabilities of given target tokens, the LM head run a chunk of positions
at a time so the [T, vocab] logits never exist whole.

At 8K tokens and a 102,400 vocabulary one row of fp32 logits is 3.3 GB. `chunk_size`
bounds the positions per row whose logits exist at once: rows up to that long run whole
(autodiff keeps their logits for the backward); longer rows run in chunks, each
rematerialised (`jax.checkpoint`), so the backward keeps only the hidden states.

A loss reads log p(target) at completion tokens only, while a training row also holds its
prompt and padding (about a third of the slots in the training benchmark). Given the
loss positions, on one CPU device (`parallel.rules.one_cpu_device`, where the products
run at the cores' rate and skipped FLOPs are time saved) `loss_position_logprobs` moves
each row's loss positions to its front and runs the LM head only on the chunks they fill.
On meshes the chunked path stays: its static loop lets GSPMD reduce-scatter the head's
gradient inside TPU's windowed einsums, where the data-dependent loop all-gathered the head
and all-reduced its gradient on every chunk (docs/training_benchmark.md).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from sgs_jax.parallel.rules import one_cpu_device

# Positions per row of a chunk when `loss_position_logprobs` keeps the softmax: the
# granularity at which a row's prompt and padding are skipped. On the CPU benchmark 64
# beat a quarter of the row by 0.9% at 256 tokens and tied it at 1,024, where 16 chunks
# of 64 cost no more than 4 of 256 (docs/training_benchmark.md).
KEPT_CHUNK = 64


def token_logprobs(
    model, input_ids: jax.Array, attention_mask: jax.Array, targets: jax.Array, chunk_size: int = 1024,
    right_padded: bool = False, segment_ids: jax.Array | None = None, layer_grad_acc=None,
    loss_mask: jax.Array | None = None,
) -> jax.Array:
    """[B, T] float32 log p(targets[b, t] | input_ids[b, :t+1]) under `model` (a `Llama`).

    input_ids, targets: [B, T] int; attention_mask: [B, T] (real input tokens). Values at
    padding positions are meaningless; mask them in the loss. right_padded: every row's
    real tokens come first (as `MicroBatch` rows do), so attention needs no padding mask
    (see `Llama.hidden_states`, as for `segment_ids`: packed rows, and `layer_grad_acc`:
    the Trainer's in-place gradient accumulation). chunk_size: see the module docstring.
    loss_mask: [B, T] bool, the positions a loss reads; the others then hold 0 and, on one
    CPU device, cost LM-head FLOPs only in chunks shared with loss positions
    (`loss_position_logprobs`).
    """
    hidden = model.hidden_states(
        input_ids, attention_mask, right_padded=right_padded, segment_ids=segment_ids, layer_grad_acc=layer_grad_acc
    )
    if loss_mask is None:
        return chunked_target_logprobs(model.logits_from_hidden, hidden, targets, chunk_size)
    if one_cpu_device():
        return loss_position_logprobs(hidden, model.lm_head_weights(), targets, loss_mask, chunk_size)
    return jnp.where(loss_mask, chunked_target_logprobs(model.logits_from_hidden, hidden, targets, chunk_size), 0.0)


def chunked_target_logprobs(
    logits_fn: Callable[[jax.Array], jax.Array],
    hidden: jax.Array,
    targets: jax.Array,
    chunk_size: int = 1024,
) -> jax.Array:
    """log softmax(logits_fn(hidden))[..., target] as [B, T] float32, at every position.

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


def loss_position_logprobs(
    hidden: jax.Array,
    head: jax.Array,
    targets: jax.Array,
    loss_mask: jax.Array,
    chunk_size: int = 1024,
    kept_chunk: int = KEPT_CHUNK,
) -> jax.Array:
    """log softmax(hidden @ head)[..., target] as [B, T] float32 where `loss_mask` is set,
    0 elsewhere, with the LM head run only on chunks that hold a loss position.

    hidden: [B, T, E] final-normed hidden states; head: [E, V], the LM head in compute
    dtype (logits are `hidden @ head` in that dtype, then fp32, as
    `Llama.logits_from_hidden` makes them); targets, loss_mask: [B, T] int / bool.
    Each row's loss positions are moved to its front (a counting permutation along T),
    then chunks of positions of every row go through the head, as many as the row with the
    most loss positions fills. Rows up to chunk_size positions keep their softmax for the
    backward ([B, T, V] fp32, as autodiff of the whole row would) and run in chunks of
    kept_chunk positions; longer rows run in chunks of chunk_size and the backward
    recomputes each chunk's logits. Differentiable in hidden and head (a custom VJP: the
    number of chunks run depends on the mask). For one device: see the module docstring.
    """
    t = hidden.shape[1]
    keep = t <= chunk_size
    chunk = max(1, min(kept_chunk, t) if keep else chunk_size)
    return _loss_position_logprobs(hidden, head, targets.astype(jnp.int32), loss_mask.astype(bool), chunk, keep)


def sort_loss_positions_first(loss_mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dest, perm, count) for loss_mask [B, T] bool: dest[b, t] is position t's slot once
    each row holds its loss positions first (in order, then the others in order), perm the
    inverse (perm[b, dest[b, t]] = t), count [B] the loss positions per row. All int32."""
    mask = loss_mask.astype(jnp.int32)
    count = mask.sum(axis=1)
    dest = jnp.where(mask > 0, jnp.cumsum(mask, axis=1), count[:, None] + jnp.cumsum(1 - mask, axis=1)) - 1
    b, t = mask.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    perm = jnp.zeros_like(dest).at[jnp.arange(b)[:, None], dest].set(positions, unique_indices=True)
    return dest, perm, count


def _chunks_loop(num_chunks: jax.Array, max_chunks: int, body, state: tuple) -> tuple:
    """`state = body(i, state)` for chunks i = 0 .. num_chunks - 1 (traced). The static
    bound is part of the loop condition too, so a cost model reads an upper trip count
    (`parallel.hlo_cost`)."""
    def cond(carry):
        return (carry[0] < num_chunks) & (carry[0] < max_chunks)

    def step(carry):
        return (carry[0] + 1, *body(carry[0], carry[1:]))

    return jax.lax.while_loop(cond, step, (jnp.int32(0), *state))[1:]


def _chunk(x: jax.Array, i, size: int) -> jax.Array:
    return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=1)


def _put_chunk(x: jax.Array, part: jax.Array, i, size: int) -> jax.Array:
    return jax.lax.dynamic_update_slice_in_dim(x, part, i * size, axis=1)


def _logits(h: jax.Array, head: jax.Array) -> jax.Array:
    return jnp.tensordot(h, head, axes=1).astype(jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _loss_position_logprobs(hidden, head, targets, loss_mask, chunk, keep):
    return _loss_position_logprobs_fwd(hidden, head, targets, loss_mask, chunk, keep)[0]


def _loss_position_logprobs_fwd(hidden, head, targets, loss_mask, chunk, keep):
    b, t, _ = hidden.shape
    max_chunks = -(-t // chunk)
    length = max_chunks * chunk  # the sorted rows, padded to whole chunks
    dest, perm, count = sort_loss_positions_first(loss_mask)
    sorted_hidden = jnp.pad(jnp.take_along_axis(hidden, perm[..., None], axis=1), ((0, 0), (0, length - t), (0, 0)))
    sorted_targets = jnp.pad(jnp.take_along_axis(targets, perm, axis=1), ((0, 0), (0, length - t)))
    num_chunks = (jnp.max(count) + chunk - 1) // chunk

    def body(i, state):
        logprobs, lse_all, probs_all = state
        logits = _logits(_chunk(sorted_hidden, i, chunk), head)  # [B, C, V]
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, _chunk(sorted_targets, i, chunk)[..., None], axis=-1)[..., 0]
        if keep:  # the softmax is all the backward reads of the logits
            probs_all = _put_chunk(probs_all, jnp.exp(logits - lse[..., None]), i, chunk)
        return _put_chunk(logprobs, picked - lse, i, chunk), _put_chunk(lse_all, lse, i, chunk), probs_all

    zeros = jnp.zeros((b, length), jnp.float32)
    probs = jnp.zeros((b, length, head.shape[1]), jnp.float32) if keep else jnp.zeros((), jnp.float32)
    sorted_logprobs, lse, probs = _chunks_loop(num_chunks, max_chunks, body, (zeros, zeros, probs))
    logprobs = jnp.where(loss_mask, jnp.take_along_axis(sorted_logprobs[:, :t], dest, axis=1), 0.0)
    return logprobs, (sorted_hidden, head, sorted_targets, loss_mask, dest, perm, num_chunks, lse, probs)


def _loss_position_logprobs_bwd(chunk, keep, residuals, g):
    sorted_hidden, head, sorted_targets, loss_mask, dest, perm, num_chunks, lse, probs = residuals
    b, length, e = sorted_hidden.shape
    t = dest.shape[1]
    vocab = jnp.arange(head.shape[1], dtype=jnp.int32)
    sorted_g = jnp.take_along_axis(jnp.where(loss_mask, g, 0.0).astype(jnp.float32), perm, axis=1)
    sorted_g = jnp.pad(sorted_g, ((0, 0), (0, length - t)))

    def body(i, state):
        sorted_dhidden, dhead = state
        h = _chunk(sorted_hidden, i, chunk)
        p = _chunk(probs, i, chunk) if keep else jnp.exp(_logits(h, head) - _chunk(lse, i, chunk)[..., None])
        onehot = _chunk(sorted_targets, i, chunk)[..., None] == vocab
        # d/dlogits of g * (logits[target] - logsumexp(logits)), in the head's dtype.
        dlogits = (_chunk(sorted_g, i, chunk)[..., None] * (onehot - p)).astype(head.dtype)
        dh = jax.lax.dot_general(dlogits, head, (((2,), (1,)), ((), ())))  # dlogits @ head^T: [B, C, E]
        # h^T @ dlogits over the chunk's B x C positions as laid out (no transposed copy).
        dhead = dhead + jax.lax.dot_general(
            h.reshape(b * chunk, e), dlogits.reshape(b * chunk, -1), (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
        return _put_chunk(sorted_dhidden, dh.astype(sorted_hidden.dtype), i, chunk), dhead

    state = (jnp.zeros_like(sorted_hidden), jnp.zeros(head.shape, jnp.float32))
    sorted_dhidden, dhead = _chunks_loop(num_chunks, length // chunk, body, state)
    dhidden = jnp.take_along_axis(sorted_dhidden[:, :t], dest[..., None], axis=1)
    return dhidden, dhead.astype(head.dtype), None, None


_loss_position_logprobs.defvjp(_loss_position_logprobs_fwd, _loss_position_logprobs_bwd)
