"""Attention forward + backward on CPU: our backends against PyTorch's
`scaled_dot_product_attention` (same shapes, causal + padding mask, same threads), in one run.

The shapes are the training benchmark's (benchmarks/train_step.py): 4 rows, 8 query heads
over 4 KV heads, head dim 32, fp32; one row half padding. Each figure is the best of
`--repeats` timed calls after a warm-up call, the backends and torch timed in turn; `auto`
on CPU is the fastest correct backend.

    python benchmarks/attention.py [--seq 256 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
import torch

from timing import alternated_best, host_cpu, host_malloc, round_trip_line

from sgs_jax.models import attention

BATCH, HEADS, KV_HEADS, DIM = 4, 8, 4, 32


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    print(host_malloc(may_restart=argv is None))
    print(host_cpu())
    print(round_trip_line("before"))
    print(f"attention fwd+bwd, {BATCH} rows x {HEADS} heads ({KV_HEADS} KV) x head dim {DIM}, fp32, "
          f"{torch.get_num_threads()} threads, best of {args.repeats}; load {os.getloadavg()[0]:.1f}")
    print(f"{'T':>6} {'backend':<32}{'ms':>10}{'vs torch':>10}")
    for t in args.seq:
        rng = np.random.default_rng(0)
        q, k, v = (rng.normal(size=(BATCH, t, h, DIM)).astype(np.float32) for h in (HEADS, KV_HEADS, KV_HEADS))
        valid = np.ones((BATCH, t), bool)
        valid[1, t // 2 :] = False
        mask = attention.AttentionMask(kv_valid=jnp.asarray(valid))

        tq, tk, tv = (torch.tensor(x).transpose(1, 2).contiguous() for x in (q, k, v))
        tk, tv = (x.repeat_interleave(HEADS // KV_HEADS, 1).requires_grad_() for x in (tk, tv))
        tq.requires_grad_()
        tmask = torch.tensor(valid)[:, None, None, :] & torch.tril(torch.ones(t, t, dtype=torch.bool))

        def torch_step():
            out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask)
            (out * out).sum().backward()

        sides = {"torch scaled_dot_product_attention": torch_step}
        jq, jk, jv = map(jnp.asarray, (q, k, v))
        for name in ("reference", "xla", "blockwise", "native"):
            fn = attention.BACKENDS[name]
            grad = jax.jit(jax.grad(lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v, mask) ** 2), argnums=(0, 1, 2)))
            sides[name] = lambda grad=grad: jax.block_until_ready(grad(jq, jk, jv))
        best = alternated_best(sides, args.repeats)
        ref_s = best["torch scaled_dot_product_attention"]
        for name, seconds in best.items():
            print(f"{t:>6} {name:<32}{seconds * 1e3:>10.1f}{ref_s / seconds:>10.2f}")
    print(round_trip_line("after"))


if __name__ == "__main__":
    main()
