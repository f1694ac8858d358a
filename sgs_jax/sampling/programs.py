"""The device programs: an empty decode state, prefill-and-insert, and a decode chunk.

All three are pure functions of (graphdef, parameter state, decode state, ...) meant to be
jitted with the decode state donated. Shapes are static per (slots, cache length, prompt
bucket, prefill batch); parameters and sampling values are ordinary arguments, so fresh
weights or another temperature reuse the same compiled program.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from sgs_jax.models.config import ModelConfig
from sgs_jax.models.kv_cache import KV_AXES, KVCache
from sgs_jax.parallel.rules import constrain
from sgs_jax.sampling.distribution import next_tokens


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """Everything the decode loop carries, one row per slot.

    cache: the KV cache, holding each row's prompt minus its last token, then generation.
    pending [S] int32: the token to feed next (the last prompt token, then each sample).
    generated [S] int32: tokens generated so far. limit [S] int32: the row's cap.
    done [S] bool: finished or empty (such rows are frozen: masked, never written).
    rng [S, 2] uint32: per-row base PRNG key; step t draws with fold_in(rng, t).
    """

    cache: KVCache
    pending: jax.Array
    generated: jax.Array
    limit: jax.Array
    done: jax.Array
    rng: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ChunkOutput:
    """Per-step outputs of one decode chunk, [S, chunk] each (entries past a row's end unused)."""

    tokens: jax.Array
    logprobs: jax.Array
    entropies: jax.Array


def pin_state(state: DecodeState) -> DecodeState:
    """Sharding constraints on the decode state (batch over data/fsdp, KV heads over tensor);
    a no-op outside `activation_sharding`."""
    cache = KVCache(
        keys=constrain(state.cache.keys, KV_AXES),
        values=constrain(state.cache.values, KV_AXES),
        valid=constrain(state.cache.valid, ("batch", "cache_seq")),
        end=constrain(state.cache.end, ("batch",)),
    )
    row = lambda x: constrain(x, ("batch",))  # noqa: E731
    return DecodeState(cache, row(state.pending), row(state.generated), row(state.limit), row(state.done), constrain(state.rng, ("batch", None)))


def empty_state(config: ModelConfig, slots: int, cache_len: int) -> DecodeState:
    """All slots empty (done); cache of `cache_len` slots per row in the compute dtype."""
    zeros = jnp.zeros((slots,), jnp.int32)
    return pin_state(
        DecodeState(
            cache=KVCache.create(config, slots, cache_len),
            pending=zeros,
            generated=zeros,
            limit=zeros,
            done=jnp.ones((slots,), bool),
            rng=jnp.zeros((slots, 2), jnp.uint32),
        )
    )


def insert_prompts(graphdef, params, state: DecodeState, prompt_ids, prompt_mask, source, refill, pending, limit, rng) -> DecodeState:
    """Prefill U prompts once and start them in the refilled slots.

    prompt_ids/prompt_mask [U, P]: each prompt minus its last token, right-padded to the
    bucket P. source [S] int32: which of the U prefills slot s copies (k slots may share
    one: the k samples of a prompt). refill [S] bool: slots to (re)start. pending [S]: the
    last prompt token per refilled slot; limit [S]; rng [S, 2]. Other slots are untouched.
    """
    model = nnx.merge(graphdef, params)
    num_prompts, bucket = prompt_ids.shape
    small = KVCache.create(model.config, num_prompts, bucket, dtype=state.cache.keys.dtype)
    _, small = model.forward_cached(prompt_ids, small, prompt_mask)  # logits unused: XLA drops the head
    slots = state.cache.batch_size
    # Rows not refilled scatter to index `slots`, which mode="drop" discards.
    dest = jnp.where(refill, jnp.arange(slots), slots)[:, None]
    cols = jnp.arange(bucket)[None, :]
    # All layers at once: keys/values are [layers, rows, slots, ...].
    put = lambda big, part: big.at[:, dest, cols].set(part[:, source], mode="drop")  # noqa: E731
    valid_rows = jnp.pad(small.valid[source], ((0, 0), (0, state.cache.max_len - bucket)))
    cache = KVCache(
        keys=put(state.cache.keys, small.keys),
        values=put(state.cache.values, small.values),
        valid=jnp.where(refill[:, None], valid_rows, state.cache.valid),
        end=jnp.where(refill, small.end[source], state.cache.end),
    )
    pick = lambda new, old: jnp.where(refill.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)  # noqa: E731
    return pin_state(
        DecodeState(
            cache=cache,
            pending=pick(pending, state.pending),
            generated=pick(jnp.zeros_like(state.generated), state.generated),
            limit=pick(limit, state.limit),
            done=pick(jnp.zeros_like(state.done), state.done),
            rng=pick(rng, state.rng),
        )
    )


def decode_chunk(graphdef, params, state: DecodeState, stop_ids, temperature, top_k, top_p, exit_when_done, *, greedy: bool, filtered: bool, chunk_steps: int, window: int):
    """Up to `chunk_steps` decode steps inside one `lax.while_loop`.

    Stops early when every slot is done or when at least `exit_when_done` slots are done
    (so the host can refill them). stop_ids [n] int32; temperature, top_k, top_p scalars.
    The loop runs on the first `window` cache slots only (the host guarantees every live
    row fits in them for the whole chunk): each step's attention and cache writes cost
    O(window), not O(cache length). Returns (state, ChunkOutput [S, chunk_steps], steps
    taken: int32 scalar).
    """
    model = nnx.merge(graphdef, params)
    slots = state.done.shape[0]
    full = state.cache
    state = dataclasses.replace(state, cache=_window(full, window))
    out = ChunkOutput(
        tokens=jnp.zeros((slots, chunk_steps), jnp.int32),
        logprobs=jnp.zeros((slots, chunk_steps), jnp.float32),
        entropies=jnp.zeros((slots, chunk_steps), jnp.float32),
    )

    def cond(carry):
        step, st, _ = carry
        num_done = jnp.sum(st.done)
        return (step < chunk_steps) & (num_done < slots) & (num_done < exit_when_done)

    def body(carry):
        step, st, o = carry
        active = ~st.done
        logits, cache = model.forward_cached(st.pending[:, None], st.cache, attention_mask=active[:, None])
        keys = jax.vmap(jax.random.fold_in)(st.rng, st.generated)
        tok, logp, ent = next_tokens(logits[:, 0], keys, temperature, top_k, top_p, greedy=greedy, filtered=filtered)
        tok = jnp.where(active, tok, st.pending)
        generated = st.generated + active.astype(jnp.int32)
        stopped = jnp.any(tok[:, None] == stop_ids[None, :], axis=-1)
        done = st.done | (active & (stopped | (generated >= st.limit)))
        o = ChunkOutput(
            tokens=o.tokens.at[:, step].set(tok),
            logprobs=o.logprobs.at[:, step].set(logp),
            entropies=o.entropies.at[:, step].set(ent),
        )
        st = pin_state(DecodeState(cache, tok, generated, st.limit, done, st.rng))
        return step + 1, st, o

    steps, state, out = jax.lax.while_loop(cond, body, (jnp.int32(0), state, out))
    return pin_state(dataclasses.replace(state, cache=_unwindow(full, state.cache))), out, steps


def _window(cache: KVCache, window: int) -> KVCache:
    """The first `window` slots of every row (end pointers unchanged)."""
    if window == cache.max_len:
        return cache
    return KVCache(cache.keys[:, :, :window], cache.values[:, :, :window], cache.valid[:, :window], cache.end)


def _unwindow(full: KVCache, part: KVCache) -> KVCache:
    """`full` with its first slots replaced by the window `part`."""
    if part.max_len == full.max_len:
        return part
    put = lambda big, small: jax.lax.dynamic_update_slice(big, small, (0,) * big.ndim)  # noqa: E731
    return KVCache(put(full.keys, part.keys), put(full.values, part.values), put(full.valid, part.valid), part.end)
