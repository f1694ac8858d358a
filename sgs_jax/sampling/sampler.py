"""`Sampler`: batched generation with a KV cache and continuous batching over fixed slots.

    sampler = Sampler(config, mesh=None, max_batch=64)
    completions = sampler.generate(model_or_params, prompts, SamplingParams(num_samples=8))

The host loop: take waiting (prompt, sample) rows into free slots (one prefill per prompt,
shared by its k samples), run a jitted decode chunk (a `lax.while_loop` of up to
`chunk_steps` steps over the donated decode state, returning early when all rows are
done or enough slots have freed for the next prompt group), read the chunk's tokens back,
repeat. Parameters are an argument of every program, so new weights (another role, or the
Solver after a training step) reuse the compiled programs.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sgs_jax.models.build import abstract_model
from sgs_jax.models.config import ModelConfig
from sgs_jax.models.tokenizer import decode
from sgs_jax.parallel.rules import activation_sharding, path_names, state_shardings
from sgs_jax.sampling import programs
from sgs_jax.sampling.distribution import row_keys
from sgs_jax.sampling.params import Completion, GenerationStats, SamplingParams
from sgs_jax.sampling.scheduler import Row, SlotScheduler
from sgs_jax.sampling.shapes import (
    DEFAULT_PROMPT_BUCKETS,
    PromptError,
    bucket_for,
    cache_length,
    power_of_two_at_least,
    prompt_problem,
)

ProgressFn = Callable[[int, int], None]  # (finished rows, total rows)
PromptDoneFn = Callable[[int, list], None]  # (prompt index, its num_samples Completions)


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
    training-only remat policy (the cached forward never rematerialises)."""
    if not isinstance(config, ModelConfig):
        return None
    return dataclasses.replace(config, bos_token_id=None, eos_token_id=None, pad_token_id=None, remat_policy="none")


class Sampler:
    """Compiled sampling programs for one architecture; weights come with each call.

    model_config: the architecture (all roles that share it can share this Sampler).
    mesh: optional (data, fsdp, tensor) mesh; slots shard over data/fsdp, heads over tensor.
    max_batch: decode slots (rows in flight); a call with fewer rows uses the next power of two.
    prompt_buckets: prefill lengths prompts are right-padded to.
    chunk_steps: decode steps per jitted chunk before the host may refill slots.
    prefill_batch: prompts per prefill call when a refill starts several prompts (a single
        prompt is prefilled alone), so each prompt bucket compiles two prefill programs.
    min_window: smallest attention window of a decode chunk. Chunks attend over the first
        W cache slots, W a power of two covering the live rows (>= min_window, <= the cache
        length): short rollouts do not pay for the full cache, at one decode program per W.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        mesh: Mesh | None = None,
        max_batch: int = 64,
        prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
        chunk_steps: int = 16,
        prefill_batch: int = 8,
        min_window: int = 256,
    ):
        if min(max_batch, chunk_steps, prefill_batch) < 1:
            raise ValueError(f"max_batch, chunk_steps and prefill_batch must be >= 1, got {max_batch}, {chunk_steps}, {prefill_batch}")
        if not prompt_buckets or list(prompt_buckets) != sorted(set(prompt_buckets)) or prompt_buckets[0] < 1:
            raise ValueError(f"prompt_buckets must be increasing positive lengths, got {prompt_buckets}")
        # Training-only settings never reach the sampling programs.
        model_config = model_config.replace(remat_policy="none")
        self.config = model_config
        self.mesh = mesh
        self.max_batch = max_batch
        self.prompt_buckets = tuple(prompt_buckets)
        self.chunk_steps = chunk_steps
        self.prefill_batch = prefill_batch
        self.min_window = min_window
        graphdef, abstract = abstract_model(model_config)
        self._signature = _leaf_signature(abstract)
        self._param_shardings = None if mesh is None else state_shardings(abstract, mesh)
        self._empty = jax.jit(_under_mesh(functools.partial(programs.empty_state, model_config), mesh), static_argnums=(0, 1))
        self._insert = jax.jit(_under_mesh(functools.partial(programs.insert_prompts, graphdef), mesh), donate_argnums=(1,))
        self._decode = jax.jit(
            _under_mesh(functools.partial(programs.decode_chunk, graphdef), mesh),
            static_argnames=("greedy", "filtered", "chunk_steps", "window"),
            donate_argnums=(1,),
        )
        self.last_stats: Optional[GenerationStats] = None

    # ---- public ---------------------------------------------------------------------------
    def generate(
        self,
        model_or_params,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        tokenizer=None,
        max_new_tokens_per_prompt: Sequence[int] | None = None,
        progress: ProgressFn | None = None,
        on_prompt_done: PromptDoneFn | None = None,
    ) -> list[list[Completion]]:
        """Sample `params.num_samples` completions for every prompt (token ids).

        model_or_params: a `Llama` or its `nnx.State` (this Sampler's architecture).
        max_new_tokens_per_prompt: optional per-prompt caps replacing params.max_new_tokens.
        on_prompt_done: called with (prompt index, its completions) as soon as every sample
        of that prompt has finished, in finishing order (so callers can write results as
        they come).
        Returns completions[prompt][sample]. Raises `PromptError` (listing every bad prompt)
        before any work when a prompt is empty, out of vocabulary or has no room under
        max_total_len; `validate_prompts` lets callers filter first.
        """
        start = time.perf_counter()
        self.last_stats = None
        weights = self._weights(model_or_params)
        prompts = [list(p) for p in prompts]
        problems = self.validate_prompts(prompts, params)
        if problems:
            raise PromptError(problems)
        caps = self._caps(len(prompts), params, max_new_tokens_per_prompt)
        if not prompts:
            return []
        k = params.num_samples
        limits = [min(cap, params.max_total_len - len(p)) for cap, p in zip(caps, prompts)]
        rows = [Row(i, j, limits[i], len(prompts[i])) for i in range(len(prompts)) for j in range(k)]
        num_slots = power_of_two_at_least(len(rows), self.max_batch)
        longest_prefill = bucket_for(max(len(p) - 1 for p in prompts), self.prompt_buckets)
        cache_len = cache_length(longest_prefill, max(caps), params.max_total_len)
        stop_ids = params.resolved_stop_ids(self.config.eos_token_ids)
        keys = np.asarray(row_keys(params.seed, jnp.asarray([r.prompt_index for r in rows]), jnp.asarray([r.sample_index for r in rows])))
        sched = SlotScheduler(num_slots, rows, k, stop_ids)
        # Padded with -1 (never generated) to a fixed size, so stop sets share a program.
        stop_array = np.full(max(4, power_of_two_at_least(len(stop_ids), 1 << 30)), -1, np.int32)
        stop_array[: len(stop_ids)] = stop_ids
        sampling_args = (
            jnp.asarray(stop_array),
            jnp.float32(max(params.temperature, 1e-6)),
            jnp.int32(params.top_k),
            jnp.float32(params.top_p),
        )
        counters = dict(max_window=0, decode_steps=0, slot_steps=0, generated_tokens=0, prefill_tokens=0, prefill_real_tokens=0, refills=0, chunks=0)
        state = self._empty(num_slots, cache_len)
        table: list[list[Completion | None]] = [[None] * k for _ in range(len(prompts))]
        remaining = [k] * len(prompts)
        while not sched.all_done:
            placed = sched.take_refill()
            if placed:
                state = self._refill(weights, state, prompts, sched, placed, keys, counters)
            window = self._window(sched.cache_extent(), cache_len)
            counters["max_window"] = max(counters["max_window"], window)
            state, out, steps = self._decode(
                weights, state, *sampling_args, jnp.int32(sched.exit_threshold()),
                greedy=params.greedy, filtered=params.filtered, chunk_steps=self.chunk_steps, window=window,
            )
            out, generated, done, steps = jax.device_get((out, state.generated, state.done, steps))
            seen = len(sched.finished)
            counters["generated_tokens"] += sched.absorb(out.tokens, out.logprobs, out.entropies, generated, done)
            for fin in sched.finished[seen:]:
                p = fin.row.prompt_index
                table[p][fin.row.sample_index] = _completion(fin, tokenizer)
                remaining[p] -= 1
                if remaining[p] == 0 and on_prompt_done is not None:
                    on_prompt_done(p, list(table[p]))
            counters["decode_steps"] += int(steps)
            counters["slot_steps"] += int(steps) * num_slots
            counters["chunks"] += 1
            if progress is not None:
                progress(len(sched.finished), len(rows))
        self.last_stats = GenerationStats(num_slots=num_slots, cache_len=cache_len, wall_s=time.perf_counter() - start, **counters)
        return table  # type: ignore[return-value]  # every entry is filled once all rows finished

    def validate_prompts(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> dict[int, str]:
        """{prompt index: reason} for every prompt that cannot be generated from."""
        found = {}
        for i, prompt in enumerate(prompts):
            why = prompt_problem(prompt, params.max_total_len, self.config.vocab_size)
            if why:
                found[i] = why
        return found

    # ---- internals ------------------------------------------------------------------------
    def _window(self, extent: int, cache_len: int) -> int:
        """Cache slots the next chunk attends over: a power of two >= min_window that holds
        every live row for chunk_steps more tokens, at most the cache length."""
        return min(cache_len, max(self.min_window, power_of_two_at_least(extent + self.chunk_steps, 1 << 30)))

    def _weights(self, model_or_params):
        if isinstance(model_or_params, nnx.Module):
            if _numerics(getattr(model_or_params, "config", None)) != _numerics(self.config):
                raise ValueError("the model's config differs from this Sampler's (beyond token ids); build a Sampler for it")
            params = nnx.state(model_or_params)
        else:
            params = model_or_params
        try:
            signature = _leaf_signature(params)
        except AttributeError as err:
            raise TypeError(f"expected a Llama or its nnx.State, got {type(model_or_params).__name__}") from err
        if signature != self._signature:
            raise ValueError("the parameters do not match this Sampler's model config (names or shapes differ)")
        if self._param_shardings is not None:
            params = jax.device_put(params, self._param_shardings)
        return params

    @staticmethod
    def _caps(num_prompts: int, params: SamplingParams, per_prompt: Sequence[int] | None) -> list[int]:
        if per_prompt is None:
            return [params.max_new_tokens] * num_prompts
        caps = [int(c) for c in per_prompt]
        if len(caps) != num_prompts or min(caps, default=1) < 1:
            raise ValueError("max_new_tokens_per_prompt needs one cap >= 1 per prompt")
        return caps

    def _refill(self, weights, state, prompts, sched: SlotScheduler, placed, keys, counters):
        """Start the `placed` (slot, row index) rows: each distinct prompt is prefilled once,
        in prefill batches of 1 or `prefill_batch` prompts (two shapes per prompt bucket)."""
        by_prompt: dict[int, list[tuple[int, int]]] = {}
        for slot, index in placed:
            by_prompt.setdefault(sched.rows[index].prompt_index, []).append((slot, index))
        groups = list(by_prompt.items())
        counters["refills"] += 1
        per_call = min(self.prefill_batch, sched.num_slots)
        for first in range(0, len(groups), per_call):
            state = self._prefill_group(weights, state, prompts, sched, groups[first : first + per_call], keys, counters)
        return state

    def _prefill_group(self, weights, state, prompts, sched: SlotScheduler, groups, keys, counters):
        num_slots = sched.num_slots
        prefixes = [prompts[p][:-1] for p, _ in groups]
        bucket = bucket_for(max(1, max(len(x) for x in prefixes)), self.prompt_buckets)
        batch = 1 if len(groups) == 1 else min(self.prefill_batch, num_slots)
        ids = np.zeros((batch, bucket), np.int32)
        mask = np.zeros((batch, bucket), bool)
        source = np.zeros(num_slots, np.int32)
        refill = np.zeros(num_slots, bool)
        pending = np.zeros(num_slots, np.int32)
        limit = np.zeros(num_slots, np.int32)
        rng = np.zeros((num_slots, 2), np.uint32)
        for u, ((prompt_index, rows), prefix) in enumerate(zip(groups, prefixes)):
            ids[u, : len(prefix)] = prefix
            mask[u, : len(prefix)] = True
            for slot, index in rows:
                source[slot] = u
                refill[slot] = True
                pending[slot] = prompts[prompt_index][-1]
                limit[slot] = sched.rows[index].limit
                rng[slot] = keys[index]
        counters["prefill_tokens"] += batch * bucket
        counters["prefill_real_tokens"] += sum(len(x) for x in prefixes)
        return self._insert(weights, state, ids, mask, source, refill, pending, limit, rng)


def _completion(fin, tokenizer) -> Completion:
    """The `Completion` of one finished row (text decoded when a tokenizer is given)."""
    r = fin.row
    text = decode(tokenizer, fin.token_ids) if tokenizer is not None else None
    return Completion(fin.token_ids, fin.logprobs, fin.entropies, fin.finish_reason, r.prompt_index, r.sample_index, text)
