"""Sampler throughput against `transformers` `generate` (torch CPU), and how cost scales.

Every figure is generated tokens/s, best of `--repeats` timed runs after one warm-up run
on the same full batch, in one process (ratios are measured in one run). The sides of a
ratio are timed in turn, one run each per round (`timing.alternated_best`), so a burst of
load on a shared host slows a round of both rather than all of one side. Both engines
sample (temperature 1, top-p 1) from the same random Llama checkpoint with early stopping
off, so they generate exactly the same number of tokens; torch gets `--threads` threads
and XLA:CPU its default pool on a machine of that many cores (note `uptime`: the machine
may be shared). Cases:

  batch     8 prompts x k = 8 = 64 rows, 32-token prompts, 128 new tokens (4 layers,
            hidden 256, vocab 8,192) vs `generate` (dynamic cache); goal >= 3x. The Sampler
            runs with its CPU default decode attention (the native kernel where it builds)
            and, timed in the same rounds, with the XLA gather backend and as an SGS
            phase calls it (inside `Sampler.keep_pool`: the KV pool allocated once, not
            per call; the headline ratio allocates its pool in every call: for the native
            kernel left unwritten, for the gather zeroed)
  long      1,024 new tokens for 8 rows (8 layers, hidden 512, vocab 32,000) vs `generate`
            with its static cache
  capacity  the batch case at a KV capacity of 512 and of 8,192 tokens per row
            (max_total_len, and a pool of slots x that), the calls of one phase (pool
            kept, `Sampler.keep_pool`): should be within 10%; also with the pool
            allocated per call
  dense     the batch case against a plain dense-cache XLA decode of the same model in
            the same process (one jitted `lax.fori_loop` of `forward_cached` steps over a
            160-token cache with `jax.random.categorical`): how much of the Sampler's time
            is paging, chunking and the host loop rather than the model
  straggler 504 short rows (128 new tokens) through 64 slots, with one long row (1,025
            new tokens) among them vs without it, the two timed alternately: the short
            rows' tokens/s should drop by at most 10%. Also printed: each round's own
            ratio (the host's run-to-run spread), and the ratios of decode steps and of
            pages held x steps (deterministic: what the long row adds, apart from noise)

    python benchmarks/sampler.py                      # every case
    python benchmarks/sampler.py --cases batch,capacity --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from timing import alternated_best, host_cpu, host_malloc

from sgs_jax.models import load_hf
from sgs_jax.sampling import Sampler, SamplingParams

CASES = ("batch", "long", "capacity", "straggler", "dense")


@dataclasses.dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    vocab: int
    heads: int = 4


BATCH_MODEL = ModelShape(layers=4, hidden=256, vocab=8192)
LONG_MODEL = ModelShape(layers=8, hidden=512, vocab=32000, heads=8)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {CASES}")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per figure (the best is reported)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--chunk-steps", type=int, default=16)
    p.add_argument("--page-size", type=int, default=16)
    args = p.parse_args()
    args.cases = [c for c in args.cases.split(",") if c]
    unknown = set(args.cases) - set(CASES)
    if unknown:
        p.error(f"unknown cases {sorted(unknown)}")
    return args


def make_checkpoint(shape: ModelShape, directory: str) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=int(shape.hidden * 8 / 3) // 8 * 8,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
        max_position_embeddings=16384, bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config).float().eval()
    model.save_pretrained(directory)
    return model


def prompts_for(rng, count: int, length: int, vocab: int) -> np.ndarray:
    ids = rng.integers(3, vocab, size=(count, length))
    ids[:, 0] = 1
    return ids


def reference_side(hf, prompts: np.ndarray, k: int, new_tokens: int, **extra):
    """(run, tokens generated per run): `transformers` generate on all prompts x k."""
    ids = torch.as_tensor(prompts, dtype=torch.long)
    kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=k,
                  max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0, **extra)

    def run():
        with torch.no_grad():
            out = hf.generate(ids, **kwargs)
        assert (out.shape[1] - ids.shape[1]) * out.shape[0] == len(prompts) * k * new_tokens

    return run, len(prompts) * k * new_tokens


def ours_side(sampler, model, prompts, params, **kwargs):
    """(run, tokens generated per run): the Sampler's `generate` on the prompts."""

    def run():
        out = sampler.generate(model, prompts, params, **kwargs)
        assert int(out.lengths.sum()) == expected
        return out

    expected = sum(kwargs.get("max_new_tokens_per_prompt", [params.max_new_tokens] * len(prompts))) * params.num_samples
    return run, expected


def tokens_per_s(sides: dict, repeats: int) -> dict[str, float]:
    """{name: tokens/s} of sides {name: (run, tokens per run)}, timed alternately."""
    best = alternated_best({name: run for name, (run, _) in sides.items()}, repeats)
    return {name: tokens / best[name] for name, (_, tokens) in sides.items()}


def batch_sampler(model, page_size: int, chunk_steps: int, paged_attention: str = "auto") -> Sampler:
    """The batch case's Sampler: 64 slots, a pool of 64 x 512 tokens, `paged_attention`."""
    return Sampler(model.config, max_batch=64, kv_pool_tokens=64 * 512, page_size=page_size, chunk_steps=chunk_steps,
                   paged_attention=paged_attention)


def batch_case(model, rng, page_size: int, chunk_steps: int) -> tuple[Sampler, np.ndarray, SamplingParams]:
    """The batch case: its Sampler (`batch_sampler`, the default decode attention), prompts
    (8 x 32 tokens) and params (k = 8, 128 new tokens)."""
    prompts = prompts_for(rng, 8, 32, BATCH_MODEL.vocab)
    params = SamplingParams(temperature=1.0, max_new_tokens=128, max_total_len=512, num_samples=8, stop_token_ids=())
    return batch_sampler(model, page_size, chunk_steps), prompts, params


def batch_case_side(args, model, rng):
    """The batch case's prompts and the Sampler's side on them."""
    sampler, prompts, params = batch_case(model, rng, args.page_size, args.chunk_steps)
    return prompts, ours_side(sampler, model, prompts.tolist(), params)


def case_batch(args, hf, model, rng) -> list[str]:
    sampler, prompts, params = batch_case(model, rng, args.page_size, args.chunk_steps)
    gather = batch_sampler(model, args.page_size, args.chunk_steps, paged_attention="gather")
    kept = batch_sampler(model, args.page_size, args.chunk_steps)
    sides = {"ours": ours_side(sampler, model, prompts.tolist(), params), "gather": ours_side(gather, model, prompts.tolist(), params),
             "kept": ours_side(kept, model, prompts.tolist(), params), "ref": reference_side(hf, prompts, 8, 128)}
    with kept.keep_pool():  # as an SGS phase calls it: the pool allocated once, by the warm-up call
        figures = tokens_per_s(sides, args.repeats)
    ours, ref = figures["ours"], figures["ref"]
    return [f"batch: 8 prompts x k=8 = 64 rows, 32-token prompts, 128 new tokens ({describe(BATCH_MODEL)})",
            row(f"sgs_jax Sampler ({sampler.attention_backend} decode attention)", ours),
            row("sgs_jax Sampler (XLA gather decode attention)", figures["gather"]),
            row("sgs_jax Sampler, a phase's calls (pool kept)", figures["kept"]),
            row("transformers generate", ref), row("ratio (ours / reference)", ours / ref, "x"),
            row("ratio (ours / ours with the gather)", ours / figures["gather"], "x"),
            row("ratio (a phase's calls / reference)", figures["kept"] / ref, "x")]


def dense_side(model, prompts: np.ndarray, k: int, new_tokens: int):
    """(run, tokens per run) of a dense-cache decode loop: all rows prefilled at once, then one
    `forward_cached` step per token inside one jit (no pages, no host loop)."""
    from flax import nnx

    from sgs_jax.models.kv_cache import KVCache

    graphdef, state = nnx.split(model)
    ids = jnp.asarray(np.repeat(prompts, k, axis=0), jnp.int32)

    @jax.jit
    def decode(state, ids, key):
        m = nnx.merge(graphdef, state)
        logits, cache = m.forward_cached(ids, KVCache.create(m.config, ids.shape[0], ids.shape[1] + new_tokens))
        first = jax.random.categorical(key, logits[:, -1])

        def step(_, carry):
            token, cache, key, checksum = carry
            key, sub = jax.random.split(key)
            logits, cache = m.forward_cached(token[:, None], cache)
            token = jax.random.categorical(sub, logits[:, -1])
            return token, cache, key, checksum + token.sum()

        return jax.lax.fori_loop(0, new_tokens - 1, step, (first, cache, key, jnp.int32(0)))[3]

    return lambda: decode(state, ids, jax.random.key(1)).block_until_ready(), ids.shape[0] * new_tokens


def case_dense(args, model, rng) -> list[str]:
    prompts, side = batch_case_side(args, model, rng)
    figures = tokens_per_s({"ours": side, "dense": dense_side(model, prompts, 8, 128)}, args.repeats)
    ours, dense = figures["ours"], figures["dense"]
    return ["dense: the batch case against a dense-cache XLA decode loop of the same model",
            row("sgs_jax Sampler", ours), row("dense-cache fori_loop", dense), row("ratio (ours / dense loop)", ours / dense, "x")]


def case_long(args, rng) -> list[str]:
    with tempfile.TemporaryDirectory() as directory:
        hf = make_checkpoint(LONG_MODEL, directory)
        model = load_hf(directory)
    prompts = prompts_for(rng, 2, 32, LONG_MODEL.vocab)
    params = SamplingParams(temperature=1.0, max_new_tokens=1024, max_total_len=2048, num_samples=4, stop_token_ids=())
    sampler = Sampler(model.config, max_batch=8, kv_pool_tokens=8 * 1088, page_size=args.page_size, chunk_steps=args.chunk_steps)
    figures = tokens_per_s({"ours": ours_side(sampler, model, prompts.tolist(), params),
                            "ref": reference_side(hf, prompts, 4, 1024, cache_implementation="static")}, args.repeats)
    ours, ref = figures["ours"], figures["ref"]
    return [f"long: 2 prompts x k=4 = 8 rows, 1,024 new tokens ({describe(LONG_MODEL)})",
            row("sgs_jax Sampler", ours), row("transformers generate (static cache)", ref), row("ratio (ours / reference)", ours / ref, "x")]


def allocate_pool(sampler: Sampler, pages: int) -> None:
    """Allocate an empty 64-slot decode state of `pages` pages, as a call does (zeroed, or
    left unwritten for the native kernel: `models.paged_attention.new_pool`)."""
    jax.block_until_ready(sampler._empty(64, pages, sampler.page_size))


def case_capacity(args, model, rng) -> list[str]:
    prompts = prompts_for(rng, 8, 32, BATCH_MODEL.vocab).tolist()
    figures, allocations = {}, {}
    # (max_total_len, pool tokens per slot): the goal's two cases as a phase runs them (its
    # calls inside `keep_pool`, so only the first allocates the pool), the same calls each
    # allocating their pool, and the long cap with the small pool (the page table's width
    # apart from the pool's size). The kept and the allocating calls are timed as two
    # groups, each alternated within itself, so 4 GB allocations do not land between the
    # kept calls.
    for how in ("kept", "fresh"):
        with contextlib.ExitStack() as kept_pools:
            sides = {}
            for capacity, pool in ((512, 512), (8192, 8192), (8192, 512)):
                params = SamplingParams(temperature=1.0, max_new_tokens=128, max_total_len=capacity, num_samples=8, stop_token_ids=())
                sampler = Sampler(model.config, max_batch=64, kv_pool_tokens=64 * pool, page_size=args.page_size, chunk_steps=args.chunk_steps)
                if how == "kept":
                    kept_pools.enter_context(sampler.keep_pool())
                sides[capacity, pool, how] = ours_side(sampler, model, prompts, params)
                pages = sampler.pool_shape(64, capacity - 1)[1] * sampler.shards
                allocations[pool] = functools.partial(allocate_pool, sampler, pages)
            figures.update(tokens_per_s(sides, args.repeats))
    alloc = alternated_best(allocations, args.repeats)
    how_made = "left unwritten" if sampler.attention_backend == "native" else "zeroed"
    kept = lambda c, p: figures[c, p, "kept"]  # noqa: E731
    fresh = lambda c, p: figures[c, p, "fresh"]  # noqa: E731
    return ["capacity: the batch case with a KV capacity of 512 vs 8,192 tokens per row (pool = 64 x capacity)",
            row("capacity 512, a phase's calls (pool kept)", kept(512, 512)), row("capacity 8,192, a phase's calls (pool kept)", kept(8192, 8192)),
            row("ratio (8,192 / 512), pool kept", kept(8192, 8192) / kept(512, 512), "x"),
            row("capacity 512, pool allocated per call", fresh(512, 512)), row("capacity 8,192, pool allocated per call", fresh(8192, 8192)),
            row("ratio (8,192 / 512), pool allocated per call", fresh(8192, 8192) / fresh(512, 512), "x"),
            row("capacity 8,192, pool 64 x 512 tokens (kept)", kept(8192, 512)),
            row(f"pool allocation ({how_made}), 64 x 512 tokens", alloc[512] * 1e3, "ms"),
            row(f"pool allocation ({how_made}), 64 x 8,192 tokens", alloc[8192] * 1e3, "ms")]


def case_straggler(args, model, rng) -> list[str]:
    short, slots, new = 504, 64, 128
    prompts = prompts_for(rng, short + 1, 32, BATCH_MODEL.vocab).tolist()
    params = SamplingParams(temperature=1.0, max_new_tokens=new, max_total_len=2048, num_samples=1, stop_token_ids=())
    sampler = Sampler(model.config, max_batch=slots, kv_pool_tokens=slots * 2048, page_size=args.page_size, chunk_steps=args.chunk_steps)
    caps = {cap: [cap] + [new] * short for cap in (new, 8 * new + 1)}  # prompt 0: the (possibly) long row, admitted first

    def run(cap):
        start, marks = time.perf_counter(), []
        sampler.generate(model, prompts, params, max_new_tokens_per_prompt=caps[cap],
                         on_prompt_done=lambda p, _: marks.append(time.perf_counter() - start) if p else None)
        return max(marks)  # when the last short row finished

    work = {}
    for cap in caps:  # warm-up (compiles every work-list size either case meets)
        run(cap)
        work[cap] = sampler.last_stats  # page counts are the same in every run
    rounds = {cap: [] for cap in caps}
    for _ in range(args.repeats):  # alternate, so both cases see the same machine load
        for cap in caps:
            rounds[cap].append(run(cap))
    figures = {cap: short * new / min(seconds) for cap, seconds in rounds.items()}
    # Each round's own ratio, to show this host's run-to-run spread beside the best-of ratio.
    per_round = ", ".join(f"{a / b:.2f}" for a, b in zip(rounds[new], rounds[8 * new + 1]))
    without, with_long = work[new], work[8 * new + 1]
    lines = [f"straggler: {short} rows of {new} new tokens through {slots} slots, with one more row of {new} or {8 * new + 1} "
             f"({sampler.attention_backend} decode attention)",
             row("short rows' tokens/s, no long row", figures[new]), row("short rows' tokens/s, one long row", figures[8 * new + 1]),
             row("ratio (with / without)", figures[8 * new + 1] / figures[new], "x"),
             f"  each round's ratio (with / without): {per_round}",
             row("decode steps, ratio (without / with)", without.decode_steps / with_long.decode_steps, "x"),
             row("pages held x steps, ratio (without / with)", without.held_page_steps / with_long.held_page_steps, "x")]
    if with_long.work_page_steps:  # the gather backend's padded work list (the native kernel reads the held pages)
        lines += [row("work-list pages x steps, ratio (without / with)", without.work_page_steps / with_long.work_page_steps, "x"),
                  row("work-list padding, without / with", without.attention_padding, f"/ {with_long.attention_padding:.2f}")]
    return lines


def describe(shape: ModelShape) -> str:
    return f"{shape.layers} layers, hidden {shape.hidden}, vocab {shape.vocab:,}, fp32"


def row(name: str, value: float, unit: str = "tokens/s") -> str:
    return f"  {name:52s}{value:10.2f} {unit}"


def report(lines: list[str]) -> None:
    """Print one case's lines as soon as it is measured (a long run shows what it has)."""
    print("\n".join(lines), flush=True)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    report([host_malloc(may_restart=True), host_cpu()])
    rng = np.random.default_rng(0)
    report([f"CPU cores {os.cpu_count()}, torch threads {args.threads}, load average {os.getloadavg()[0]:.1f} at start; "
            f"chunk {args.chunk_steps} steps, pages of {args.page_size} tokens; best of {args.repeats} after a warm-up"])
    if {"batch", "capacity", "straggler", "dense"} & set(args.cases):
        with tempfile.TemporaryDirectory() as directory:
            hf = make_checkpoint(BATCH_MODEL, directory)
            model = load_hf(directory)
        if "batch" in args.cases:
            report(case_batch(args, hf, model, rng))
        if "capacity" in args.cases:
            report(case_capacity(args, model, rng))
        if "straggler" in args.cases:
            report(case_straggler(args, model, rng))
        if "dense" in args.cases:
            report(case_dense(args, model, rng))
    if "long" in args.cases:
        report(case_long(args, rng))
    report([f"load average {os.getloadavg()[0]:.1f} at the end"])


if __name__ == "__main__":
    main()
