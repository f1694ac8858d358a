"""CPU decode attention alone: the native paged kernel and the XLA gather backend against
the host's memory read bandwidth, in one run.

The shapes are the sampler benchmark's batch case (benchmarks/sampler.py): 64 rows, 4 KV
heads of dim 64 (MHA), 4 layers, pages of 16 tokens, a pool of 64 x 512 tokens, fp32. Each
row caches `--mean` tokens on average (uniform within +-64); its pages are random pool
pages, as rows that grew at different times hold. One timed call runs `paged_decode` (write
the new token, attend) for all 4 layers, as one decode step does.

The reference is a roofline, not another engine: the live keys and values of a step must
each be read once, so the step cannot beat (their bytes / the read bandwidth). The
bandwidth is measured in the same run as an XLA `sum` over a 512 MB array (larger than
any cache). Each figure is the best of `--repeats` calls after a warm-up, the sides timed
in turn.

    python benchmarks/paged_attention.py [--mean 96] [--repeats 30]
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from timing import alternated_best, host_cpu, host_malloc

from sgs_jax.models import native
from sgs_jax.models.paged_attention import paged_decode
from sgs_jax.models.paged_cache import PagedBatch, ragged_work

ROWS, KV_HEADS, DIM, LAYERS, PAGE = 64, 4, 64, 4, 16
POOL_PAGES, MAX_PAGES = ROWS * 512 // PAGE, 512 // PAGE
STREAM_BYTES = 512 * 2**20


def problem(mean: int, seed: int = 0):
    """(q, k, v, pool, page_table, cached): one decode step's inputs."""
    rng = np.random.default_rng(seed)
    cached = rng.integers(max(mean - 64, 1), mean + 65, ROWS).astype(np.int32)
    table = rng.permutation(POOL_PAGES)[: ROWS * MAX_PAGES].reshape(ROWS, MAX_PAGES).astype(np.int32)
    pool = tuple(jnp.asarray(rng.standard_normal((KV_HEADS, LAYERS, POOL_PAGES, PAGE, DIM), np.float32)) for _ in range(2))
    q, k, v = (jnp.asarray(rng.standard_normal((ROWS, KV_HEADS, DIM), np.float32)) for _ in range(3))
    return q, k, v, pool, table, cached


def step_fn(backend: str, table: np.ndarray, cached: np.ndarray):
    """A jitted fn(q, k, v, pool) -> (out, pool) running `backend` for every layer."""
    active = jnp.ones(ROWS, bool)
    num_pages = jnp.asarray(cached // PAGE + 1)
    work = ragged_work(jnp.asarray(table), num_pages, int(num_pages.sum()), PAGE) if backend == "gather" else None
    batch = PagedBatch(jnp.asarray(table), jnp.asarray(cached), active, work, backend)

    @functools.partial(jax.jit, donate_argnums=3)  # the pool is updated in place, as in decode
    def step(q, k, v, pool):
        def layer_step(carry, layer):  # a scan over layers carrying the pool, as the model's
            total, pool = carry
            out, pool = paged_decode(q, k, v, pool, layer, batch)
            return (total + out, pool), None

        (total, pool), _ = jax.lax.scan(layer_step, (jnp.zeros_like(q), pool), jnp.arange(LAYERS, dtype=jnp.int32))
        return total, pool

    return step


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mean", type=int, default=96, help="mean cached tokens per row")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    print(host_malloc(may_restart=argv is None))
    print(host_cpu())
    q, k, v, pool, table, cached = problem(args.mean)
    live_bytes = int((cached + 1).sum()) * KV_HEADS * DIM * 4 * 2 * LAYERS
    stream = jnp.ones((STREAM_BYTES // 4,), jnp.float32)
    read_all = jax.jit(jnp.sum)
    sides = {"stream": lambda: read_all(stream).block_until_ready()}
    backends = ["native", "gather"] if native.paged_attention_target() else ["gather"]
    state = {"pool": pool}

    def run(fn):
        out, state["pool"] = fn(q, k, v, state["pool"])
        jax.block_until_ready(out)

    steps = {backend: step_fn(backend, table, cached) for backend in backends}
    outputs = {}
    for backend, fn in steps.items():  # the backends must agree before their times mean anything
        outputs[backend], state["pool"] = fn(q, k, v, state["pool"])
    mismatch = max(float(jnp.max(jnp.abs(out - outputs["gather"]))) for out in outputs.values())
    if mismatch > 1e-4:
        raise SystemExit(f"the backends disagree: max |difference| {mismatch:.2e}")
    for backend, fn in steps.items():
        sides[backend] = functools.partial(run, fn)
    best = alternated_best(sides, args.repeats)
    bandwidth = STREAM_BYTES / best["stream"]
    floor = live_bytes / bandwidth
    print(f"decode attention, {LAYERS} layers x {ROWS} rows x {args.mean} cached tokens on average "
          f"(KV heads {KV_HEADS}, dim {DIM}, pages of {PAGE}, fp32): {live_bytes / 1e6:.1f} MB of live keys and values")
    print(f"  backends agree: max |difference| {mismatch:.1e}")
    print(f"  read bandwidth (XLA sum over {STREAM_BYTES >> 20} MB)         {bandwidth / 1e9:8.1f} GB/s")
    print(f"  roofline: live bytes / bandwidth                  {floor * 1e3:8.3f} ms")
    for backend in backends:
        print(f"  {backend:<8} per step                             {best[backend] * 1e3:8.3f} ms"
              f"  ({live_bytes / best[backend] / 1e9:.1f} GB/s, roofline / time {floor / best[backend]:.2f})")


if __name__ == "__main__":
    main()
