"""`Sampler`: batched generation over a paged KV pool with continuous batching.

    sampler = Sampler(config, mesh=None, max_batch=64, kv_pool_tokens=65536, page_size=16)
    out = sampler.generate(weights, prompts, SamplingParams(num_samples=8))   # Completions

The host loop: start waiting (prompt, sample) rows in free slots (one prefill per prompt
and batch shard, its pages shared by the k samples), give live rows KV pages for the next
chunk, dispatch a jitted decode chunk (a `lax.while_loop` of up to `chunk_steps` steps over
the donated decode state), and only then read the previous chunk's outputs (one
`device_get`): the device always has the next chunk queued while the host absorbs the last.
A refill is queued behind the chunk in flight (its slots were free in that chunk too), so
it never waits for a read either. Parameters are an argument of every program; weights
already on the Sampler's mesh are used in the dtype and layout they arrive in (nothing is
cast or moved per call): new weights of the same form reuse the compiled programs; another
form compiles once more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sgs_jax.models.build import abstract_model
from sgs_jax.models.config import ModelConfig
from sgs_jax.models.paged_attention import PAGED_BACKENDS, select_paged_backend
from sgs_jax.models.tokenizer import decode
from sgs_jax.parallel.global_arrays import host_read, to_global
from sgs_jax.parallel.rules import activation_sharding, batch_shards, check_batch, path_names, state_shardings
from sgs_jax.sampling import programs
from sgs_jax.sampling.distribution import row_keys, sampling_mode
from sgs_jax.sampling.pages import PageAllocator
from sgs_jax.sampling.params import Completions, GenerationStats, SamplingParams
from sgs_jax.sampling.scheduler import ChunkPlan, Refill, SlotScheduler, pages_for, pool_pages_per_shard
from sgs_jax.sampling.shapes import DEFAULT_PROMPT_BUCKETS, PromptError, bucket_for, power_of_two_at_least, prompt_problem

ProgressFn = Callable[[int, int], None]  # (finished rows, total rows)
PromptDoneFn = Callable[[int, Completions], None]  # (prompt index, its num_samples rows)
_STOP_SLOTS = 4  # stop-id array length (more stop ids: the next power of two)


def _under_mesh(fn, mesh: Mesh | None):
    """`fn` traced inside `activation_sharding(mesh)` (so the model's constraints apply)."""
    if mesh is None:
        return fn

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with activation_sharding(mesh):
            return fn(*args, **kwargs)

    return wrapped


def _leaf_signature(tree) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    return [(path_names(p), tuple(x.shape)) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _numerics(config: ModelConfig | None):
    """The config without what does not change sampling: special-token ids, and the
    training-only settings (remat: the cached forward never rematerialises; the parameter
    dtype: weights are used in the dtype they arrive in)."""
    if not isinstance(config, ModelConfig):
        return None
    return dataclasses.replace(config, bos_token_id=None, eos_token_id=None, pad_token_id=None, remat_policy="none",
                               param_dtype=config.dtype)


def _on_mesh(params, mesh: Mesh) -> bool:
    """Whether every leaf is already a device array laid out on `mesh` (the caller chose its
    dtype and layout, e.g. the inference form: kept as it is)."""
    return all(
        isinstance(x, jax.Array) and isinstance(x.sharding, jax.sharding.NamedSharding) and x.sharding.mesh == mesh
        and x.sharding.memory_kind in (None, "device")
        for x in jax.tree_util.tree_leaves(params)
    )


class Sampler:
    """Compiled sampling programs for one architecture; weights come with each call.

    model_config: the architecture (all roles that share it can share this Sampler).
    mesh: optional (data, fsdp, tensor) mesh; slots and KV pages split over data/fsdp,
        KV heads over tensor.
    max_batch: decode slots (rows in flight), a multiple of the mesh's data x fsdp devices;
        every call uses all of them (fewer rows leave slots idle), so the compiled programs
        do not depend on a call's row count.
    kv_pool_tokens: KV pool capacity in tokens (all slots share it; `sampling.kv_pool_tokens`);
        None sizes the pool per call to every slot's worst case (never preempts).
    page_size: tokens per KV page (`sampling.page_size`).
    prompt_buckets: prefill lengths prompts are right-padded to.
    chunk_steps: decode steps per jitted chunk before the host may refill slots.
    prefill_batch: prompts per prefill call when a refill starts several prompts (a single
        prompt is prefilled alone), so each prompt bucket compiles two prefill programs.
    paged_attention: the decode attention over the pool (`sampling.paged_attention`): auto
        (the platform's kernel: Pallas on TPU and GPU, the native C++ kernel on CPU where it
        builds, else the XLA gather) or one of `models.paged_attention.PAGED_BACKENDS`.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        mesh: Mesh | None = None,
        max_batch: int = 64,
        kv_pool_tokens: int | None = None,
        page_size: int = 16,
        prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
        chunk_steps: int = 16,
        prefill_batch: int = 8,
        paged_attention: str = "auto",
    ):
        if min(max_batch, chunk_steps, prefill_batch, page_size) < 1:
            raise ValueError(f"max_batch, chunk_steps, prefill_batch and page_size must be >= 1, got {max_batch}, {chunk_steps}, "
                             f"{prefill_batch}, {page_size}")
        if not prompt_buckets or list(prompt_buckets) != sorted(set(prompt_buckets)) or prompt_buckets[0] < 1:
            raise ValueError(f"prompt_buckets must be increasing positive lengths, got {prompt_buckets}")
        if mesh is not None:
            check_batch(max_batch, mesh, "max_batch (sampler slots)")
        self.shards = 1 if mesh is None else batch_shards(mesh)
        if kv_pool_tokens is not None and kv_pool_tokens < page_size * self.shards:
            raise ValueError(f"sampling.kv_pool_tokens = {kv_pool_tokens} holds less than one page of {page_size} tokens per batch "
                             f"shard ({self.shards})")
        # Training-only settings never reach the sampling programs.
        model_config = model_config.replace(remat_policy="none")
        self.config = model_config
        self.mesh = mesh
        self.max_batch = max_batch
        self.kv_pool_tokens = kv_pool_tokens
        self.page_size = page_size
        self.prompt_buckets = tuple(prompt_buckets)
        self.chunk_steps = chunk_steps
        self.prefill_batch = prefill_batch
        platform = np.ravel(mesh.devices)[0].platform if mesh is not None else jax.default_backend()
        if paged_attention not in ("auto", *PAGED_BACKENDS):
            raise ValueError(f"paged_attention must be auto or one of {PAGED_BACKENDS}, got {paged_attention!r}")
        self.attention_backend = select_paged_backend(model_config.attention if paged_attention == "auto" else paged_attention, platform)
        graphdef, abstract = abstract_model(model_config)
        self._abstract_params = abstract
        self._param_shardings = state_shardings(abstract, mesh) if mesh is not None else None
        self._signature = _leaf_signature(abstract)
        self._empty = jax.jit(_under_mesh(functools.partial(programs.empty_state, model_config, backend=self.attention_backend), mesh),
                             static_argnums=(0, 1, 2))
        self._reuse = jax.jit(_under_mesh(programs.reuse_pool, mesh), donate_argnums=(0,))
        self._kept_state: programs.DecodeState | None = None  # the last call's state, inside `keep_pool`
        self._keep_depth = 0
        self._insert = jax.jit(_under_mesh(functools.partial(programs.insert_prompts, graphdef), mesh), donate_argnums=(1,))
        self._decode = jax.jit(
            _under_mesh(functools.partial(programs.decode_chunk, graphdef), mesh),
            static_argnames=("mode", "chunk_steps", "work_size", "backend"),
            donate_argnums=(1,),
        )
        self.last_stats: Optional[GenerationStats] = None

    @classmethod
    def from_config(cls, cfg, model_config: ModelConfig, mesh: Mesh | None = None, **overrides) -> "Sampler":
        """The Sampler of a run: slots, pool and page size from `cfg.sampling`."""
        s = cfg.sampling
        settings = dict(max_batch=s.max_batch, kv_pool_tokens=s.kv_pool_tokens, page_size=s.page_size,
                        paged_attention=s.paged_attention)
        return cls(model_config, mesh=mesh, **{**settings, **overrides})

    # ---- public ---------------------------------------------------------------------------
    def generate(
        self,
        weights,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        tokenizer=None,
        max_new_tokens_per_prompt: Sequence[int] | None = None,
        progress: ProgressFn | None = None,
        on_prompt_done: PromptDoneFn | None = None,
    ) -> Completions:
        """Sample `params.num_samples` completions for every prompt (token ids).

        weights: a `Llama` or its `nnx.State` (this Sampler's architecture); arrays already
        on this Sampler's mesh keep their dtype and layout (e.g. the bf16 inference form,
        `sgs.roles`), others are placed by the training rules. max_new_tokens_per_prompt: optional per-prompt
        caps replacing params.max_new_tokens. on_prompt_done: called with (prompt index,
        that prompt's rows as `Completions`) as soon as all its samples finished, in
        finishing order (so callers can write results as they come).
        Returns `Completions`, rows prompt-major. Raises `PromptError` (listing every bad
        prompt) before any work when a prompt is empty, out of vocabulary or has no room
        under max_total_len; `validate_prompts` lets callers filter first.
        """
        start = time.perf_counter()
        self.last_stats = None
        weights = self._weights(weights)
        problems = self.validate_prompts(prompts, params)
        if problems:
            raise PromptError(problems)
        prompts = [np.asarray(p, np.int32) for p in prompts]
        caps = self._caps(len(prompts), params, max_new_tokens_per_prompt)
        if not prompts:
            return Completions.empty()
        k = params.num_samples
        lens = np.asarray([len(p) for p in prompts], np.int32)
        limits = np.minimum(np.asarray(caps, np.int32), params.max_total_len - lens)
        prompt_index = np.repeat(np.arange(len(prompts), dtype=np.int32), k)
        sample_index = np.tile(np.arange(k, dtype=np.int32), len(prompts))
        # Shapes from the Sampler and the call's length cap only, never from its row count or
        # prompt lengths: every call of a role runs the same compiled programs.
        num_slots = self.max_batch
        max_pages, pages_per_shard = self.pool_shape(num_slots, params.max_total_len - 1)
        sched = SlotScheduler(num_slots, prompt_index, sample_index, limits[prompt_index], lens[prompt_index], k,
                              params.resolved_stop_ids(self.config.eos_token_ids),
                              PageAllocator(self.shards, pages_per_shard), self.page_size, max_pages, self.chunk_steps)
        keys = row_keys(params.seed, prompt_index, sample_index)
        sampling_args = self._sampling_args(params)
        mode = sampling_mode(params.temperature, params.top_k, params.top_p)
        counters = dict(decode_steps=0, slot_steps=0, generated_tokens=0, prefill_tokens=0, prefill_real_tokens=0, refills=0, chunks=0,
                        held_page_steps=0, work_page_steps=0)
        texts: list[str | None] = [None] * len(prompt_index)
        remaining = np.full(len(prompts), k)
        state = self._start_state(num_slots, pages_per_shard * self.shards)
        in_flight: list[tuple[ChunkPlan, programs.ChunkOutput]] = []
        while not sched.all_done:
            refill = sched.take_refill(len(in_flight))
            if refill.placements:
                state = self._refill(weights, state, prompts, sched, refill, keys, counters)
            dispatched = sched.has_live
            if dispatched:
                plan = sched.plan_chunk(len(in_flight))
                state, out = self._decode(
                    weights, state, jnp.asarray(plan.page_table), jnp.asarray(plan.num_pages), jnp.asarray(plan.kill),
                    *sampling_args, jnp.int32(plan.exit_new), **self._decode_statics(mode, plan.work_size),
                )
                in_flight.append((plan, out))
            if in_flight and (len(in_flight) > 1 or not dispatched):
                plan, out = in_flight.pop(0)
                # The one read-back of a chunk (the next one is already queued); on several
                # hosts it gathers the slots of the others.
                host = host_read(out)
                finished = sched.absorb(plan, host.tokens, host.logprobs, host.entropies, host.count, host.done)
                counters["decode_steps"] += int(host.steps)
                counters["slot_steps"] += int(host.steps) * num_slots
                counters["chunks"] += 1
                counters["held_page_steps"] += int(host.steps) * int(plan.num_pages.sum())
                if self.attention_backend == "gather":
                    counters["work_page_steps"] += int(host.steps) * plan.work_size * self.shards
                self._finish_rows(sched, finished, tokenizer, texts, remaining, on_prompt_done)
                if progress is not None:
                    progress(int(sched.finished.sum()), len(prompt_index))
        if self._keep_depth:
            self._kept_state = state
        counters["generated_tokens"] = int(sched.lengths.sum())  # preempted rows' discarded tokens not counted
        self.last_stats = GenerationStats(
            num_slots=num_slots, pool_pages=pages_per_shard * self.shards, page_size=self.page_size,
            peak_pages=sched.allocator.peak_used, preemptions=sched.preemptions, wall_s=time.perf_counter() - start, **counters,
        )
        return self._completions(sched, texts if tokenizer is not None else None)

    @contextlib.contextmanager
    def keep_pool(self):
        """Within this block the KV pool outlives each `generate` call: the next call of the
        same pool shape reuses it instead of allocating it again. A new pool costs its
        zero-fill (at 64 slots x 8,192 fp32 tokens more than a short call's decoding), or for
        the native kernel, which starts from an unwritten pool, the first touch of each page
        its rows write (about 4% of the benchmark's batch call). The pool
        stays held until the outermost block exits, so wrap one phase's calls, never the
        training that follows them. Reentrant; results are bit-identical with or without it.
        """
        self._keep_depth += 1
        try:
            yield self
        finally:
            self._keep_depth -= 1
            if not self._keep_depth:
                self._kept_state = None

    def _start_state(self, num_slots: int, num_pages: int) -> programs.DecodeState:
        """Every slot empty over a pool of `num_pages` pages: the kept pool when it has that
        shape (`keep_pool`), else a new pool (`programs.empty_state`)."""
        kept, self._kept_state = self._kept_state, None  # a failed call must not leave a donated state behind
        if kept is not None and kept.pool.num_pages == num_pages and kept.cached.shape[0] == num_slots:
            return self._reuse(kept)
        return self._empty(num_slots, num_pages, self.page_size)

    def validate_prompts(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> dict[int, str]:
        """{prompt index: reason} for every prompt that cannot be generated from."""
        found = {}
        for i, prompt in enumerate(prompts):
            why = prompt_problem(prompt, params.max_total_len, self.config.vocab_size)
            if why:
                found[i] = why
        return found

    def pool_shape(self, num_slots: int, max_cached: int) -> tuple[int, int]:
        """(page-table width, pool pages per batch shard) of a call whose longest row caches
        `max_cached` tokens: the table a power of two of pages that holds it; the pool
        kv_pool_tokens (or, when None, every slot's worst case) rounded up to whole pages
        per shard."""
        max_pages = power_of_two_at_least(int(pages_for(max_cached, self.page_size)), 1 << 30)
        pool_tokens = self.kv_pool_tokens or num_slots * max_pages * self.page_size
        return max_pages, pool_pages_per_shard(pool_tokens, self.page_size, self.shards)

    # ---- ahead-of-time lowering (sgs-plan) ----------------------------------------------
    def abstract_weights(self, dtype=None, rules=None):
        """Shape structs of this Sampler's parameters in `dtype` (default: the config's
        param_dtype) laid out on the mesh by `rules` (default: the training rules), i.e.
        the form `generate` would receive (e.g. `INFERENCE_RULES` and bfloat16)."""
        shardings = (state_shardings(self._abstract_params, self.mesh, rules) if self.mesh is not None
                     else jax.tree_util.tree_map(lambda _: None, self._abstract_params))
        return jax.tree_util.tree_map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype or x.dtype), sharding=sh),
                                      self._abstract_params, shardings)

    def abstract_state(self, num_slots: int, num_pages: int) -> programs.DecodeState:
        """Shape structs of the decode state `generate` starts from, with its shardings."""
        lowered = self._empty.lower(num_slots, num_pages, self.page_size)
        shardings = lowered.compile().output_shardings
        return jax.tree_util.tree_map(lambda info, sh: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sh),
                                      lowered.out_info, shardings)

    def lower_prefill(self, weights, num_slots: int, num_pages: int, prompt_bucket: int, num_prompts: int):
        """The prefill-and-insert program `generate` runs for `num_prompts` prompts (1 or
        prefill_batch) of bucket length `prompt_bucket` into a pool of `num_pages` pages,
        lowered without arrays (`weights`: shape structs, as for `lower_decode`)."""
        s, length = num_slots, -(-prompt_bucket // self.page_size) * self.page_size
        entries = num_prompts * (length // self.page_size) + s // self.shards
        i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
        flag = jax.ShapeDtypeStruct((s,), bool)
        return self._insert.lower(
            weights, self.abstract_state(s, num_pages), i32(num_prompts, length), jax.ShapeDtypeStruct((num_prompts, length), bool),
            i32(self.shards, entries), i32(self.shards, entries), flag, i32(s), i32(s), i32(s), jax.ShapeDtypeStruct((s, 2), jnp.uint32),
        )

    def lower_decode(self, weights, num_slots: int, num_pages: int, max_pages: int, work_size: int = 1, mode: str = "plain"):
        """The decode chunk `generate` runs, lowered without arrays: `weights` are shape
        structs (with shardings) in the form `generate` would receive; num_pages: the whole
        pool; max_pages: page-table width; work_size: ragged work entries per shard (gather
        backend only)."""
        s = num_slots
        i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
        f32 = jax.ShapeDtypeStruct((), jnp.float32)
        return self._decode.lower(
            weights, self.abstract_state(s, num_pages), i32(s, max_pages), i32(s), jax.ShapeDtypeStruct((s,), bool),
            i32(_STOP_SLOTS), f32, i32(), f32, i32(), **self._decode_statics(mode, work_size),
        )

    def _decode_statics(self, mode: str, work_size: int) -> dict:
        """The decode chunk's static arguments (its program key): the work-list size counts
        only for the gather backend, so other backends compile one program for every size."""
        return dict(mode=mode, chunk_steps=self.chunk_steps, work_size=work_size if self.attention_backend == "gather" else 1,
                    backend=self.attention_backend)

    # ---- internals ------------------------------------------------------------------------
    def _sampling_args(self, params: SamplingParams):
        stop_ids = params.resolved_stop_ids(self.config.eos_token_ids)
        # Padded with -1 (never generated) to a fixed size, so stop sets share a program.
        stop_array = np.full(max(_STOP_SLOTS, power_of_two_at_least(len(stop_ids), 1 << 30)), -1, np.int32)
        stop_array[: len(stop_ids)] = stop_ids
        return (jnp.asarray(stop_array), jnp.float32(max(params.temperature, 1e-6)), jnp.int32(params.top_k), jnp.float32(params.top_p))

    def _weights(self, weights):
        if isinstance(weights, nnx.Module):
            if _numerics(getattr(weights, "config", None)) != _numerics(self.config):
                raise ValueError("the model's config differs from this Sampler's (beyond token ids); build a Sampler for it")
            weights = nnx.state(weights)
        try:
            signature = _leaf_signature(weights)
        except AttributeError as err:
            raise TypeError(f"expected a Llama or its nnx.State, got {type(weights).__name__}") from err
        if signature != self._signature:
            raise ValueError("the parameters do not match this Sampler's model config (names or shapes differ)")
        if self._param_shardings is not None and not _on_mesh(weights, self.mesh):
            weights = jax.device_put(weights, self._param_shardings)
        return weights

    @staticmethod
    def _caps(num_prompts: int, params: SamplingParams, per_prompt: Sequence[int] | None) -> list[int]:
        if per_prompt is None:
            return [params.max_new_tokens] * num_prompts
        caps = [int(c) for c in per_prompt]
        if len(caps) != num_prompts or min(caps, default=1) < 1:
            raise ValueError("max_new_tokens_per_prompt needs one cap >= 1 per prompt")
        return caps

    def _refill(self, weights, state, prompts, sched: SlotScheduler, refill: Refill, keys, counters):
        """Start the refill's rows: each prompt prefilled once per call, in prefill batches of
        1 or `prefill_batch` prompts (two shapes per prompt bucket)."""
        order = list(dict.fromkeys(int(sched.prompt_index[row]) for _, row in refill.placements))
        per_call = min(self.prefill_batch, sched.num_slots)
        counters["refills"] += 1
        for first in range(0, len(order), per_call):
            batch = order[first : first + per_call]
            chosen = set(batch)
            placements = [(s, r) for s, r in refill.placements if int(sched.prompt_index[r]) in chosen]
            writes = [w for w in refill.writes if w.prompt_index in chosen]
            state = self._prefill(weights, state, prompts, sched, batch, placements, writes, keys, counters)
        return state

    def _prefill(self, weights, state, prompts, sched: SlotScheduler, batch, placements, writes, keys, counters):
        prefixes = [prompts[p][:-1] for p in batch]
        page = self.page_size
        length = -(-bucket_for(max(1, max(len(x) for x in prefixes)), self.prompt_buckets) // page) * page
        width = 1 if len(batch) == 1 else min(self.prefill_batch, sched.num_slots)
        chunks = length // page
        ids = np.zeros((width, length), np.int32)
        mask = np.zeros((width, length), bool)
        for u, prefix in enumerate(prefixes):
            ids[u, : len(prefix)] = prefix
            mask[u, : len(prefix)] = True
        entries = width * chunks + sched.slots_per_shard
        source = np.zeros((self.shards, entries), np.int32)
        dest = np.full((self.shards, entries), sched.allocator.pages_per_shard, np.int32)  # out of range: no write
        filled = np.zeros(self.shards, np.int64)
        slot_of = {p: u for u, p in enumerate(batch)}
        for w in writes:
            e = filled[w.shard]
            source[w.shard, e] = slot_of[w.prompt_index] * chunks + w.chunk
            dest[w.shard, e] = w.page
            filled[w.shard] += 1
        s = sched.num_slots
        refill = np.zeros(s, bool)
        cached = np.zeros(s, np.int32)
        pending = np.zeros(s, np.int32)
        limit = np.zeros(s, np.int32)
        rng = np.zeros((s, 2), np.uint32)
        for slot, row in placements:
            p = int(sched.prompt_index[row])
            refill[slot] = True
            cached[slot] = len(prompts[p]) - 1
            pending[slot] = prompts[p][-1]
            limit[slot] = sched.limit[row]
            rng[slot] = keys[row]
        counters["prefill_tokens"] += width * length
        counters["prefill_real_tokens"] += sum(len(x) for x in prefixes)
        if self.mesh is not None:  # global arrays: each process places only its own slots' rows
            whole = NamedSharding(self.mesh, PartitionSpec())
            slots, rng_rows = state.pending.sharding, state.rng.sharding
            ids, mask, source, dest, refill, cached, pending, limit, rng = to_global(
                (ids, mask, source, dest, refill, cached, pending, limit, rng),
                (whole, whole, whole, whole, slots, slots, slots, slots, rng_rows))
        return self._insert(weights, state, ids, mask, source, dest, refill, cached, pending, limit, rng)

    def _finish_rows(self, sched: SlotScheduler, rows, tokenizer, texts, remaining, on_prompt_done) -> None:
        for row in rows:
            if tokenizer is not None:
                texts[row] = decode(tokenizer, sched.tokens[row, : sched.lengths[row]].tolist())
            p = int(sched.prompt_index[row])
            remaining[p] -= 1
            if remaining[p] == 0 and on_prompt_done is not None:
                done_rows = np.flatnonzero(sched.prompt_index == p)
                on_prompt_done(p, self._completions(sched, texts if tokenizer is not None else None, done_rows))

    @staticmethod
    def _completions(sched: SlotScheduler, texts, rows=None) -> Completions:
        rows = np.arange(len(sched.lengths)) if rows is None else rows
        width = int(sched.lengths[rows].max(initial=0))
        return Completions(
            sched.prompt_index[rows], sched.sample_index[rows], sched.lengths[rows], sched.tokens[rows, :width],
            sched.logprobs[rows, :width], sched.entropies[rows, :width], sched.stopped[rows],
            None if texts is None else tuple(texts[i] for i in rows),
        )
