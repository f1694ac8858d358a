"""Training-step throughput: our jitted JAX step against the same loss and optimiser in
PyTorch (`transformers.LlamaForCausalLM`, torch.optim.Adam), on the same small model and
the same batch, in one run.

Both sides: weighted NLL of completion tokens divided by the batch's completion tokens,
gradient accumulation over the same micro-batches, global-norm clip 1.0, Adam (0.9, 0.95),
eps 1e-8, fp32, the same number of CPU threads, the same host allocator (process-wide; as
the CPU launcher runs, large freed blocks kept for reuse unless `SGS_HOST_MALLOC` says
otherwise: the first line printed says which). Each side runs as it would in use: ours pads
micro-batches to the Trainer's length buckets, PyTorch to each micro-batch's longest row.
Both are warmed up the same way (two full optimiser steps on the whole batch: compilation
for us, allocator and kernel caches for PyTorch), then timed alternately, `--repeats`
times `--steps` steps each, and the best of each side is reported. Tokens/s counts real
(unpadded) model input tokens per optimiser step. Ours runs five ways, timed alternately
with the rest: the defaults (`remat_policy="none"`, `attention="auto"`: the native CPU
attention kernels where they build; the headline ratio), `remat_policy="dots"`,
`attention="blockwise"` (the plain-JAX attention the native kernels replace), packed
rows (`pack_length`: micro-batches of PACKED_ROWS rows of up to `--micro` / PACKED_ROWS x
the longest sequence, several sequences side by side: the token budget, and the logits
chunk's size, of a micro-batch of `--micro` full-length rows), and packed rows with
`remat_policy="dots"` (the fastest of these on CPU): settings a run can choose.

Under each table, every round's seconds per step with the cores' round trip before and
after it (`print_rounds`: on a virtual machine, whether the two vCPUs shared a cache then),
then the step's floor: its projection matmuls (forward, input and weight
gradients of every layer's projections and the LM head) timed alone at each side's own
micro-batch shapes, for our defaults, our packed rows with dots, and PyTorch, each step's
time as a multiple of it, and how close to its floor our step must come for 1.5x the
reference (`matmul_floor`); then a roofline: the same matmuls' FLOPs at the fastest rate
measured in the run (any one timed projection, or a 2048^3 product by either library, which
runs near the cores' peak), plus the attention kernels alone at the step's shapes
(`attention_floor`), against the time a step at 1.5x the reference may take, and what that
leaves for everything else.

    python benchmarks/train_step.py [--seq 256 1024] [--steps 3] [--repeats 3] [--batch 8] [--micro 4]
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import tempfile

import jax
import numpy as np
import torch
import transformers

from projections import our_products, projection_shapes, square_products, torch_products
from timing import alternated_best, alternated_rounds, best_of, core_round_trip_ns, host_cpu, host_malloc, round_trip_text

from sgs_jax.models import load_hf, save_hf, tiny
from sgs_jax.models.attention import AttentionMask, attend, select_backend
from sgs_jax.models.build import create_model
from sgs_jax.models.llama import self_attention_mask
from sgs_jax.rl.batching import SequenceExample
from sgs_jax.rl.optimizer import OptimizerConfig
from sgs_jax.rl.train_step import TrainConfig, Trainer


def make_examples(batch: int, seq: int, vocab: int, seed: int = 0) -> list[SequenceExample]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(batch):
        total = int(rng.integers(seq // 2, seq + 1))
        prompt = total // 4
        ids = [int(t) for t in rng.integers(3, vocab, total + 1)]
        out.append(SequenceExample(tuple(ids[:prompt]), tuple(ids[prompt:]), float(i % 2 == 0)))
    return out


def model_config(seq: int):
    """The benchmark's 4M-parameter model (4 layers, hidden 256, 8 query / 4 KV heads)."""
    return tiny(vocab_size=2048, hidden_size=256, intermediate_size=688, num_layers=4, num_heads=8,
                num_kv_heads=4, head_dim=32, max_position_embeddings=seq * 2)


# The square product whose rate is the host's roofline (`projections.square_products`).
SQUARE = 2048

# Rows per packed micro-batch. One row of the whole budget ran 4-7% slower than two on this
# 2-core host (XLA:CPU spreads [1, T] activations over its threads less well).
PACKED_ROWS = 2


def train_config(seq: int, batch: int, micro: int, packed: bool = False) -> TrainConfig:
    """Our side's training config: `batch` sequences per optimiser step, `micro` per
    micro-batch; packed: micro-batches of PACKED_ROWS rows holding micro x seq tokens."""
    optimizer = OptimizerConfig(learning_rate=1e-5)
    if packed:
        rows = min(PACKED_ROWS, micro)
        return TrainConfig(batch_size=batch, micro_batch_size=rows, max_seq_len=seq, pack_length=micro * seq // rows,
                           logits_chunk=TrainConfig.logits_chunk * micro // rows, optimizer=optimizer)
    return TrainConfig(batch_size=batch, micro_batch_size=micro, max_seq_len=seq, optimizer=optimizer)


# Our step's variants: name -> (remat_policy, attention, packed, table label, ratio label);
# "default" gives the headline ratio.
VARIANTS = {
    "default": ("none", "auto", False, "sgs_jax Trainer (JAX, jitted; defaults)", None),
    "dots": ("dots", "auto", False, "  the same, remat_policy=dots", "with remat_policy=dots"),
    "blockwise": ("none", "blockwise", False, "  the same, attention=blockwise", "with attention=blockwise"),
    "packed": ("none", "auto", True, "  the same, packed rows", "packed"),
    "packed_dots": ("dots", "auto", True, "  the same, packed rows and remat_policy=dots", "packed and dots"),
}


def _jax_step(trainer: Trainer, examples) -> None:
    jax.block_until_ready(trainer.step(examples)["loss"])


def torch_step(model, opt, examples, micro: int) -> None:
    opt.zero_grad()
    total = sum(len(e.completion_ids) for e in examples)
    for start in range(0, len(examples), micro):
        chunk = examples[start : start + micro]
        width = max(e.num_inputs + 1 for e in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        loss_mask = torch.zeros((len(chunk), width - 1))
        weights = torch.tensor([e.weight for e in chunk])
        for row, e in enumerate(chunk):
            seq = np.concatenate([e.prompt_ids, e.completion_ids])  # the fields are arrays (SequenceExample converts)
            ids[row, : len(seq)] = torch.from_numpy(seq.astype(np.int64))
            mask[row, : len(seq)] = 1
            loss_mask[row, len(e.prompt_ids) - 1 : len(seq) - 1] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(weights[:, None] * logp * loss_mask).sum() / total
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def torch_slots(examples, micro: int) -> list[int]:
    """Token slots (padding included) of each of the reference's micro-batches: each padded to its longest row."""
    return [len(examples[s : s + micro]) * max(e.num_inputs + 1 for e in examples[s : s + micro])
            for s in range(0, len(examples), micro)]


def model_flops(config, examples) -> float:
    """Model FLOPs of one optimiser step over `examples` (real tokens only, no padding):
    6 x matmul parameters (the layers' projections and the LM head) per token, plus causal
    attention's score and value products, forward and backward (3x the forward's
    2 x T(T+1) x heads x head_dim per layer)."""
    c = config
    tokens = sum(e.num_inputs for e in examples)
    attention = sum(6 * e.num_inputs * (e.num_inputs + 1) * c.num_heads * c.head_dim * c.num_layers for e in examples)
    return 6.0 * matmul_parameters(config) * tokens + attention


def matmul_parameters(config) -> int:
    """Weights that take part in a matmul per token: every projection of every layer and
    the LM head (`projection_shapes`)."""
    return sum(k * n * count for k, n, count in projection_shapes(config))


def run(seq: int, args) -> float:
    """Print one sequence length's table and its matmul floor (`matmul_floor`); returns
    the headline ratio (ours, defaults / reference tokens/s)."""
    config = model_config(seq)
    examples = make_examples(args.batch, seq, config.vocab_size)
    tokens = sum(e.num_inputs for e in examples)
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(create_model(config, seed=0), tmp)
        # Ours under each variant (VARIANTS), the same weights.
        trainers = {name: Trainer(load_hf(tmp, remat_policy=remat, attention=attention), train_config(seq, args.batch, args.micro, packed))
                    for name, (remat, attention, packed, *_) in VARIANTS.items()}
        theirs = transformers.LlamaForCausalLM.from_pretrained(tmp, attn_implementation="sdpa", dtype=torch.float32)
    opt = torch.optim.Adam(theirs.parameters(), lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    sides = {name: functools.partial(_jax_step, trainer, examples) for name, trainer in trainers.items()}
    sides["torch"] = functools.partial(torch_step, theirs, opt, examples, args.micro)

    # Two warm-up steps on the full batch, all sides alike; then alternated timings, the
    # cores' round trip read between rounds (`print_rounds`).
    rounds = alternated_rounds(sides, args.repeats, calls=args.steps, warmup=2, probe=core_round_trip_ns)
    best = best_of(rounds)
    ref_s = best["torch"]
    attention = select_backend("auto", jax.default_backend(), AttentionMask(), np.float32)
    print(f"train step, {config.num_params() / 1e6:.1f}M params, {args.batch} seqs x {seq // 2}-{seq} tokens, "
          f"{args.micro} per micro-batch, {jax.devices()[0].platform}, {torch.get_num_threads()} threads, "
          f"best of {args.repeats} x {args.steps} steps")
    flops = model_flops(config, examples)
    print(f"{'implementation':<48}{'s/step':>10}{'tokens/s':>12}{'model GFLOP/s':>15}{'padding':>9}")
    # Token slots (padding included) of each side's micro-batches.
    slots = {name: [b.input_ids.size for b in trainer.micro_batches(examples)] for name, trainer in trainers.items()}
    slots["torch"] = torch_slots(examples, args.micro)
    # (label, seconds, token slots with padding) per line.
    rows = [(VARIANTS[name][3], best[name], sum(slots[name])) for name in VARIANTS]
    for label, seconds, held in rows + [("transformers + torch.optim.Adam", ref_s, sum(slots["torch"]))]:
        print(f"{label:<48}{seconds:>10.3f}{tokens / seconds:>12.0f}{flops / seconds / 1e9:>15.1f}{1 - tokens / held:>9.0%}")
    others = "; ".join(f"{VARIANTS[name][4]}: {ref_s / best[name]:.2f}" for name in VARIANTS if name != "default")
    print(f"ratio (ours / reference tokens/s): {ref_s / best['default']:.2f}; {others} (default attention here: {attention})")
    print_rounds(rounds)

    # The floor under each step: its projection matmuls alone, at its own micro-batches'
    # shapes (the packed variants share theirs, as do the unpacked ones).
    labels = {"default": "ours (defaults)", "packed_dots": "ours (packed rows, dots)", "torch": "torch"}
    floor, peak = matmul_floor(config, {side: slots[side] for side in labels}, args.repeats)
    print("the step's projection matmuls alone (forward, input and weight gradients; each side's micro-batch shapes): "
          + ", ".join(f"{labels[k]} {floor[k] * 1e3:.0f} ms (the step {best[k] / floor[k]:.2f}x that)" for k in floor))
    target = ref_s / 1.5
    print(f"1.5x the reference needs our step at most {target * 1e3:.0f} ms: "
          f"{target / floor['default']:.2f}x its matmuls (defaults), {target / floor['packed_dots']:.2f}x (packed rows, dots)")
    # The same bound as a roofline: the step's projection matmuls (6 x matmul parameters
    # per token slot) at the fastest rate measured this run, plus attention's kernels alone.
    square = alternated_best(square_products(), args.repeats, calls=3)
    rate, source = max((peak, "the fastest projection"),
                       *((2 * SQUARE**3 / s, f"{side}'s {SQUARE}^3 product") for side, s in square.items()))
    variants = ("default", "packed_dots")
    at_rate = {k: 6 * matmul_parameters(config) * sum(slots[k]) / rate for k in variants}
    attention_s = {k: attention_floor(config, trainers[k].micro_batches(examples), args.repeats) for k in variants}
    print(f"roofline: at the fastest matmul rate of this run ({rate / 1e9:.0f} GFLOP/s, {source}; "
          + ", ".join(f"{side}'s {SQUARE}^3 product {2 * SQUARE**3 / s / 1e9:.0f}" for side, s in square.items())
          + f") those matmuls take {at_rate['default'] * 1e3:.0f} ms (defaults) / {at_rate['packed_dots'] * 1e3:.0f} ms "
          f"(packed rows, dots); attention's kernels alone (forward and backward, every layer) "
          f"{attention_s['default'] * 1e3:.0f} / {attention_s['packed_dots'] * 1e3:.0f} ms; together "
          f"{(at_rate['default'] + attention_s['default']) * 1e3:.0f} / {(at_rate['packed_dots'] + attention_s['packed_dots']) * 1e3:.0f} ms "
          f"of the {target * 1e3:.0f} ms a step at 1.5x the reference may take, leaving "
          f"{(target - at_rate['default'] - attention_s['default']) * 1e3:.0f} / "
          f"{(target - at_rate['packed_dots'] - attention_s['packed_dots']) * 1e3:.0f} ms for the loss, Adam, norms and the rest")
    return ref_s / best["default"]


def print_rounds(rounds) -> None:
    """Each round's seconds per step, with the round trip of a cache line between the
    process's two CPUs read before and after it (`timing.core_round_trip_ns`): on a virtual
    machine whose vCPUs the hypervisor places on cores that share a last-level cache or
    not, it says which placement each round ran in (our step is slower in the second,
    PyTorch's is not: docs/training_benchmark.md)."""
    for i, r in enumerate(rounds, 1):
        sides = ", ".join(f"{name} {seconds:.3f}" for name, seconds in r.seconds.items())
        print(f"  round {i} (cores' round trip {round_trip_text(r.probe_before)} -> {round_trip_text(r.probe_after)}), s/step: {sides}")


def matmul_floor(config, slots: dict[str, list[int]], repeats: int) -> tuple[dict[str, float], float]:
    """Seconds one optimiser step spends in its projection matmuls alone, per side, and
    the best rate (FLOP/s) any one timed projection reached (its forward, input and
    weight gradients together).

    slots: {side: token slots (padding included) of each of its micro-batches}; a side
    named "torch" runs PyTorch's three products of each projection
    (`projections.torch_products`, as `nn.Linear` and its backward compute them), any other
    our own (`projections.our_products`: `llama.project` and its VJP, each product a jitted
    call, on one CPU device), the same calls `matmul.py` times one by one. Each distinct
    projection's three products are timed together (best of `repeats` x 5 calls; ours in
    turn with each other, then torch's: interleaved, a short JAX call right after torch's
    read up to 3x slower) and summed over the step's micro-batches. The step's time over
    this floor is what everything else costs (attention, norms, the loss, Adam, dispatch)."""
    rng = np.random.default_rng(0)
    calls, uses = {}, collections.Counter()
    for side, counts in slots.items():
        for tokens in counts:
            for k, n, count in projection_shapes(config):
                key = (side, tokens, k, n)
                uses[key] += count
                if key in calls:
                    continue
                x, w, dy = (rng.standard_normal(shape, np.float32) for shape in ((tokens, k), (k, n), (tokens, n)))
                products = (torch_products if side == "torch" else our_products)(x, w, dy)
                calls[key] = functools.partial(_in_turn, products)
    best = {}
    for torch_side in (False, True):
        best.update(alternated_best({key: fn for key, fn in calls.items() if (key[0] == "torch") == torch_side}, repeats, calls=5))
    floor = dict.fromkeys(slots, 0.0)
    for key, count in uses.items():
        floor[key[0]] += count * best[key]
    peak = max(6 * tokens * k * n / best[(side, tokens, k, n)] for side, tokens, k, n in calls)
    return floor, peak


def attention_floor(config, micro_batches, repeats: int) -> float:
    """Seconds one optimiser step spends in attention alone: the backend the step's `auto`
    picks, forward and backward as each layer runs it, at each of `micro_batches`' shapes
    and masks (`llama.self_attention_mask` of right-padded rows, as the Trainer runs them),
    best of `repeats` x 5 calls, summed over the micro-batches, times the layers."""
    rng = np.random.default_rng(0)
    heads = (config.num_heads, config.num_kv_heads, config.num_kv_heads, config.num_heads)
    calls = {}
    for i, mb in enumerate(micro_batches):
        b, t = mb.shape
        q, k, v, d_out = (jax.device_put(rng.standard_normal((b, t, h, config.head_dim), np.float32)) for h in heads)
        segments = None if mb.segment_ids is None else jax.device_put(mb.segment_ids)
        mask = self_attention_mask(jax.device_put(mb.attention_mask), right_padded=True, segment_ids=segments)
        grad = jax.jit(jax.grad(lambda q, k, v, mask, d_out: (attend(q, k, v, mask) * d_out).sum(), argnums=(0, 1, 2)))
        calls[i] = functools.partial(lambda grad, *args: jax.block_until_ready(grad(*args)), grad, q, k, v, mask, d_out)
    return config.num_layers * sum(alternated_best(calls, repeats, calls=5).values())


def _in_turn(calls) -> None:
    """Make each of `calls` once, in order."""
    for call in calls:
        call()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[256, 1024], help="longest sequence, tokens (one table each)")
    ap.add_argument("--steps", type=int, default=3, help="optimiser steps per timing")
    ap.add_argument("--repeats", type=int, default=3, help="timings per side; the best is reported")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro", type=int, default=4)
    args = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)  # XLA's CPU client also uses every core
    print(host_malloc(may_restart=argv is None))
    print(host_cpu())
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for seq in args.seq:
        run(seq, args)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
