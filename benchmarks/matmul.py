"""Each projection matmul of the training benchmark's model alone: ours (XLA:CPU, through
`llama.project` and its VJP, jitted) against PyTorch's (`nn.Linear`'s products), in GFLOP/s
and as a ratio, measured in the same run (both sides' calls from `projections.py`).

For every distinct projection shape of `train_step.py`'s model (query, key/value, output,
gate/up, down, LM head) at `--tokens` token rows: the forward x @ W, the input gradient
dy @ W^T and the weight gradient x^T @ dy (it contracts the token axis), each timed alone,
best of `--repeats` rounds of 10 calls. Our calls are timed in turn with each other, then
torch's (a short JAX call right after a torch call can read slower: see `train_step.matmul_floor`).
Both sides use every core. This is the per-shape view of the floor `train_step.py` prints
under each table.

    python benchmarks/matmul.py [--tokens 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from projections import PRODUCTS, our_products, projection_shapes, torch_products
from timing import alternated_best, host_cpu, host_malloc, round_trip_line
from train_step import model_config


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024, help="token rows (the 256-token step's micro-batch: 4 x 256)")
    ap.add_argument("--repeats", type=int, default=5, help="timings per call; the best is reported")
    args = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)  # XLA's CPU client also uses every core
    print(host_malloc(may_restart=argv is None))
    print(host_cpu())
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(round_trip_line("before"))
    rng = np.random.default_rng(0)
    shapes = sorted({(k, n) for k, n, _ in projection_shapes(model_config(256))})
    sides = {"ours": {}, "torch": {}}
    for k, n in shapes:
        x, w, dy = (rng.standard_normal(s, np.float32) for s in ((args.tokens, k), (k, n), (args.tokens, n)))
        for side, make in (("ours", our_products), ("torch", torch_products)):
            for product, fn in zip(PRODUCTS, make(x, w, dy)):
                sides[side][(k, n, product)] = fn
    best = {side: alternated_best(calls, args.repeats, calls=10) for side, calls in sides.items()}
    print(f"projection matmuls alone, {args.tokens} token rows, {torch.get_num_threads()} threads, GFLOP/s")
    print(f"{'in x out':>12}  {'product':<16} {'ours':>7} {'torch':>7}  ratio")
    for (k, n, product), ours in best["ours"].items():
        flops = 2.0 * args.tokens * k * n
        theirs = best["torch"][(k, n, product)]
        print(f"{f'{k} x {n}':>12}  {product:<16} {flops / ours / 1e9:7.1f} {flops / theirs / 1e9:7.1f}  {theirs / ours:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(round_trip_line("after"))


if __name__ == "__main__":
    main()
