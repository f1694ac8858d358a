"""Sampler throughput against `transformers` `generate` (torch CPU), and padding waste.

Both sample (temperature 1, top-p 1) from the same random Llama checkpoint, on the same
prompts, batch and lengths, with early stopping off so both generate exactly the same
number of tokens. Printed in one run:
- throughput: generated tokens/s of ours and of the reference, and their ratio
  (issue goal: >= 3x at batch 64 with k = 8, i.e. 8 prompts x 8 samples);
- padding waste on a mixed-length workload (per-prompt caps drawn uniformly between 10%
  and 100% of the cap, more rows than slots): the share of slot-steps that did no work
  with continuous batching, and what static batches of the same rows would waste.

    python benchmarks/sampler.py                       # 4 layers, hidden 256
    python benchmarks/sampler.py --new-tokens 64 --mixed-prompts 16   # quicker
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
import transformers

from sgs_jax.models import load_hf
from sgs_jax.sampling import Sampler, SamplingParams


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--prompts", type=int, default=8, help="prompts in the throughput batch")
    p.add_argument("--k", type=int, default=8, help="samples per prompt")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--mixed-prompts", type=int, default=32, help="prompts in the mixed-length workload")
    p.add_argument("--cap", type=int, default=256, help="max new tokens in the mixed-length workload")
    p.add_argument("--chunk-steps", type=int, default=16)
    p.add_argument("--min-window", type=int, default=64, help="smallest decode attention window (Sampler option)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return p.parse_args()


def make_checkpoint(args, directory: str) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 8 / 3) // 8 * 8,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config).float().eval()
    model.save_pretrained(directory)
    return model


def reference_tokens_per_s(hf, prompts: np.ndarray, k: int, new_tokens: int) -> float:
    ids = torch.as_tensor(prompts, dtype=torch.long)
    kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=k,
                  max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    with torch.no_grad():
        hf.generate(ids[:1], **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        start = time.perf_counter()
        out = hf.generate(ids, **kwargs)
        elapsed = time.perf_counter() - start
    generated = (out.shape[1] - ids.shape[1]) * out.shape[0]
    assert generated == len(prompts) * k * new_tokens
    return generated / elapsed


def ours_tokens_per_s(sampler, model, prompts: np.ndarray, k: int, new_tokens: int) -> float:
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, max_total_len=4096, num_samples=k, stop_token_ids=())
    sampler.generate(model, prompts.tolist(), params)  # compile
    start = time.perf_counter()
    out = sampler.generate(model, prompts.tolist(), params)
    elapsed = time.perf_counter() - start
    generated = sum(len(c.token_ids) for row in out for c in row)
    assert generated == len(prompts) * k * new_tokens
    return generated / elapsed


def static_batching_waste(lengths: list[int], slots: int) -> float:
    """Waste if rows ran in fixed batches of `slots`, each until its longest row ends."""
    steps = sum(max(lengths[i : i + slots]) * slots for i in range(0, len(lengths), slots))
    return 1 - sum(lengths) / steps


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as directory:
        hf = make_checkpoint(args, directory)
        model = load_hf(directory)
    slots = args.prompts * args.k
    sampler = Sampler(model.config, max_batch=slots, prompt_buckets=(32, 64, 128, 256),
                      chunk_steps=args.chunk_steps, min_window=args.min_window)
    prompts = rng.integers(3, args.vocab, size=(args.prompts, args.prompt_len))
    prompts[:, 0] = 1
    ours = ours_tokens_per_s(sampler, model, prompts, args.k, args.new_tokens)
    ref = reference_tokens_per_s(hf, prompts, args.k, args.new_tokens)

    caps = rng.integers(max(1, args.cap // 10), args.cap + 1, size=args.mixed_prompts).tolist()
    mixed_prompts = [[1] + rng.integers(3, args.vocab, size=int(n)).tolist() for n in rng.integers(8, 120, size=args.mixed_prompts)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.cap, max_total_len=4096, num_samples=args.k, stop_token_ids=())
    sampler.generate(model, mixed_prompts, params, max_new_tokens_per_prompt=caps)  # compile the shapes it needs
    sampler.generate(model, mixed_prompts, params, max_new_tokens_per_prompt=caps)
    stats = sampler.last_stats
    row_lengths = [c for c in caps for _ in range(args.k)]

    print(f"model: {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; fp32 on CPU; torch threads {args.threads}; "
          f"chunk {args.chunk_steps} steps, min window {args.min_window}")
    print(f"throughput: {args.prompts} prompts x k={args.k} = {slots} rows, prompt {args.prompt_len}, {args.new_tokens} new tokens each")
    print(f"{'':28s}{'tokens/s':>12s}")
    print(f"{'sgs_jax Sampler':28s}{ours:12.1f}")
    print(f"{'transformers generate':28s}{ref:12.1f}")
    print(f"{'ratio (ours / reference)':28s}{ours / ref:12.2f}")
    print(f"mixed lengths: {args.mixed_prompts} prompts x k={args.k} = {len(row_lengths)} rows on {stats.num_slots} slots, "
          f"caps uniform in [{args.cap // 10}, {args.cap}]")
    print(f"{'decode padding waste (ours, continuous batching)':52s}{stats.decode_waste:8.1%}")
    print(f"{'decode padding waste (static batches, same rows)':52s}{static_batching_waste(row_lengths, stats.num_slots):8.1%}")
    print(f"{'prefill padding (bucketed positions not real)':52s}{1 - stats.prefill_real_tokens / stats.prefill_tokens:8.1%}")
    print(f"{'tokens/s on the mixed workload':52s}{stats.tokens_per_s:8.1f}")


if __name__ == "__main__":
    main()
