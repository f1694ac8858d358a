"""The device programs: an empty decode state, prefill-into-pages, and a decode chunk.

All three are pure functions of (graphdef, parameter state, decode state, ...) meant to be
jitted with the decode state donated. Shapes are static per (slots, pool pages, page size,
page-table width, prompt bucket, prefill batch, work-list size); parameters and sampling
values are ordinary arguments, so fresh weights or another temperature reuse the same
compiled program. The host (`sampling.scheduler`) owns the page table: it decides which
pages each row holds and sends the table with every chunk.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from sgs_jax.models.config import ModelConfig
from sgs_jax.models.kv_cache import KVCache
from sgs_jax.models.paged_attention import build_work, new_pool, shard_specs
from sgs_jax.models.paged_cache import POOL_AXES, PagedBatch, PagedKVCache, prompt_pages, write_pages
from sgs_jax.parallel.rules import constrain, multi_device_mesh
from sgs_jax.sampling.distribution import next_tokens


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """Everything the decode loop carries, one row per slot (plus the shared pool).

    pool: the paged KV pool. cached [S] int32: tokens of the row in the pool (its prompt
    minus the last token, then one per step). pending [S] int32: the token to feed next
    (the last prompt token, then each sample). generated [S] int32: tokens generated so
    far. limit [S] int32: the row's cap. done [S] bool: finished or empty (such rows are
    frozen: they write nothing). rng [S, 2] uint32: per-row base PRNG key; step t draws
    with fold_in(rng, t).
    """

    pool: PagedKVCache
    cached: jax.Array
    pending: jax.Array
    generated: jax.Array
    limit: jax.Array
    done: jax.Array
    rng: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ChunkOutput:
    """What the host reads back after a chunk (one `device_get`).

    tokens, logprobs, entropies [S, chunk]: a slot's first count[s] entries are its new
    tokens; count [S] int32; done [S] bool (after the chunk); steps: int32 scalar."""

    tokens: jax.Array
    logprobs: jax.Array
    entropies: jax.Array
    count: jax.Array
    done: jax.Array
    steps: jax.Array


def pin_state(state: DecodeState) -> DecodeState:
    """Sharding constraints on the decode state (rows and pool pages over data/fsdp, KV heads
    over tensor); a no-op outside `activation_sharding`."""
    row = lambda x: constrain(x, ("batch",))  # noqa: E731
    pool = PagedKVCache(constrain(state.pool.keys, POOL_AXES), constrain(state.pool.values, POOL_AXES))
    return DecodeState(pool, row(state.cached), row(state.pending), row(state.generated), row(state.limit), row(state.done),
                       constrain(state.rng, ("batch", None)))


def _all_slots_empty(pool: PagedKVCache, slots: int) -> DecodeState:
    zeros = jnp.zeros((slots,), jnp.int32)
    return pin_state(DecodeState(pool, zeros, zeros, zeros, zeros, jnp.ones((slots,), bool), jnp.zeros((slots, 2), jnp.uint32)))


def empty_state(config: ModelConfig, slots: int, num_pages: int, page_size: int, backend: str) -> DecodeState:
    """All slots empty (done); a new pool of `num_pages` pages in the compute dtype, as
    `backend` needs it (`new_pool`: zeros, or unwritten for the native kernel)."""
    return _all_slots_empty(new_pool(config, num_pages, page_size, backend), slots)


def reuse_pool(state: DecodeState) -> DecodeState:
    """`state`'s pool, unchanged, with every slot empty: a new call's state without
    allocating the pool again. Safe because no attention reads a pool position its row has
    not written: the stale pages are masked out."""
    return _all_slots_empty(state.pool, state.cached.shape[0])


def _write_prompt_pages(pool: PagedKVCache, chunk_keys, chunk_values, source, dest) -> PagedKVCache:
    """`write_pages` per batch shard: source/dest [shards, E] (row d: shard d's entries,
    local page ids); the chunks are the same on every shard."""

    def local(pk, pv, ck, cv, src, dst):
        return write_pages(pk, pv, ck, cv, src[0], dst[0])

    current = multi_device_mesh()
    if current is None:
        return PagedKVCache(*local(pool.keys, pool.values, chunk_keys, chunk_values, source, dest))
    mesh, rules = current
    P = jax.sharding.PartitionSpec
    rows, heads = shard_specs(mesh, rules, source.shape[0], pool.num_pages, pool.keys.shape[0], pool.keys.shape[0])
    spec = P(heads, None, rows, None, None)
    chunk = P(heads, None, None, None, None)
    keys, values = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, chunk, chunk, P(rows, None), P(rows, None)),
                                 out_specs=(spec, spec), check_vma=False)(pool.keys, pool.values, chunk_keys, chunk_values, source, dest)
    return PagedKVCache(keys, values)


def insert_prompts(graphdef, params, state: DecodeState, prompt_ids, prompt_mask, source, dest, refill, cached, pending, limit, rng) -> DecodeState:
    """Prefill U prompts once, write their pages, and start the refilled slots.

    prompt_ids/prompt_mask [U, T]: each prompt minus its last token, right-padded to T (a
    multiple of the page size). source/dest [shards, E] int32: which prefill chunk goes to
    which local page of each batch shard (`paged_cache.write_pages`; the host points the k
    samples of a prompt at its full pages and gives each its own copy of a partial last
    page). refill [S] bool: slots to (re)start; cached [S]: their prompt length minus one;
    pending [S]: their last prompt token; limit [S]; rng [S, 2]. Other slots, and pages not
    in dest, are untouched.
    """
    model = nnx.merge(graphdef, params)
    num_prompts, length = prompt_ids.shape
    small = KVCache.create(model.config, num_prompts, length, dtype=state.pool.keys.dtype)
    _, small = model.forward_cached(prompt_ids, small, prompt_mask)  # logits unused: XLA drops the head
    page_size = state.pool.page_size
    pool = _write_prompt_pages(state.pool, prompt_pages(small.keys, page_size), prompt_pages(small.values, page_size), source, dest)
    pick = lambda new, old: jnp.where(refill.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)  # noqa: E731
    return pin_state(DecodeState(
        pool=pool,
        cached=pick(cached, state.cached),
        pending=pick(pending, state.pending),
        generated=pick(jnp.zeros_like(state.generated), state.generated),
        limit=pick(limit, state.limit),
        done=pick(jnp.zeros_like(state.done), state.done),
        rng=pick(rng, state.rng),
    ))


def decode_chunk(graphdef, params, state: DecodeState, page_table, num_pages, kill, stop_ids, temperature, top_k, top_p, exit_new,
                 *, mode: str, chunk_steps: int, work_size: int, backend: str):
    """Up to `chunk_steps` decode steps inside one `lax.while_loop`.

    page_table [S, max_pages] int32, num_pages [S] int32: the pages each row holds (the host
    allocated enough for the whole chunk). kill [S] bool: rows the host took back
    (preempted): done before the first step. Stops early when every slot is done or when
    `exit_new` of the rows the host planned as live (num_pages > 0, not killed) are done, so
    the host can refill their slots. That count includes rows that finished in the chunk
    before this one, which the host had not read yet when it dispatched this one: a chunk
    queued behind one that ended early for a refill then ends at once, instead of running
    its steps with those slots idle. stop_ids [n]
    int32; temperature, top_k, top_p scalars; work_size: ragged work-list entries per batch
    shard (gather backend; >= the pages live rows hold); backend: the decode attention
    (`models.paged_attention.PAGED_BACKENDS`). Returns (state, ChunkOutput).
    """
    model = nnx.merge(graphdef, params)
    slots = state.done.shape[0]
    work = build_work(page_table, num_pages, work_size, state.pool.page_size) if backend == "gather" else None
    start_done = state.done | kill
    planned_live = (num_pages > 0) & ~kill  # a live row holds at least one page (the scheduler grows it first)
    state = dataclasses.replace(state, done=start_done)
    out = ChunkOutput(
        tokens=jnp.zeros((slots, chunk_steps), jnp.int32),
        logprobs=jnp.zeros((slots, chunk_steps), jnp.float32),
        entropies=jnp.zeros((slots, chunk_steps), jnp.float32),
        count=jnp.zeros((slots,), jnp.int32),
        done=start_done,
        steps=jnp.int32(0),
    )

    def cond(carry):
        st, o = carry
        num_done = jnp.sum(st.done)
        finished_unseen = jnp.sum(st.done & planned_live)
        return (o.steps < chunk_steps) & (num_done < slots) & (finished_unseen < exit_new)

    def body(carry):
        st, o = carry
        active = ~st.done
        batch = PagedBatch(page_table, st.cached, active, work, backend)
        logits, pool = model.forward_paged(st.pending, st.pool, batch)
        keys = jax.vmap(jax.random.fold_in)(st.rng, st.generated)
        tok, logp, ent = next_tokens(logits, keys, temperature, top_k, top_p, mode=mode)
        tok = jnp.where(active, tok, st.pending)
        step = active.astype(jnp.int32)
        generated = st.generated + step
        stopped = jnp.any(tok[:, None] == stop_ids[None, :], axis=-1)
        done = st.done | (active & (stopped | (generated >= st.limit)))
        o = ChunkOutput(
            tokens=o.tokens.at[:, o.steps].set(tok),
            logprobs=o.logprobs.at[:, o.steps].set(logp),
            entropies=o.entropies.at[:, o.steps].set(ent),
            count=o.count + step,
            done=done,
            steps=o.steps + 1,
        )
        st = pin_state(DecodeState(pool, st.cached + step, tok, generated, st.limit, done, st.rng))
        return st, o

    state, out = jax.lax.while_loop(cond, body, (state, out))
    return pin_state(state), out

