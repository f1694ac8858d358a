"""The full 7B paper preset's training micro-step compiled deviceless for TPU slices.

For each topology: one 8K-token sequence per chip per micro-batch (micro-batch = chips),
the project's own `TrainPrograms.accumulate` compiled by libtpu for compile-only devices,
and from the compiled program: peak HBM per chip, temporaries, the training phase with all
three roles resident (Solver Adam state, Conjecturer parameters + Adam, Guide parameters),
roofline time (max of compute, HBM and ICI at peak rates, loop bodies times their trip
counts), roofline-implied MFU (6 x non-embedding parameters x tokens over peak x roofline
time) and the deviceless compile time on this machine.

    python benchmarks/aot_plan.py [--topologies v5p:2x2x2,v5e:4x4] [--layers 30] [--seq 8192]

A full-depth compile takes minutes of CPU. On a checkout without `sgs_jax/sgs/plan.py`
(an older commit, for a before/after table: copy `sgs_jax/parallel/aot.py` and
`hlo_cost.py` into it) the same micro-step inputs are built from `TrainPrograms`' own
shardings.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re
import time

import jax
import jax.numpy as jnp

from sgs_jax.parallel.aot import GIB, compile_timed, report, topology

# The run config whose `paper` preset is planned, found from any working directory.
PAPER_CONFIG = pathlib.Path(__file__).resolve().parent.parent / "configs" / "sgs.py"
GOALS = "goals: v5e-16 micro-step peak < 15 GiB; v5p-8 training phase fits with all three roles; MFU >= 50% on v5p; compile < 120 s"


def _plan_current(name: str, layers: int, seq: int):
    from sgs_jax.config import load_config
    from sgs_jax.sgs.plan import plan_programs

    topo = topology(name)
    cfg = load_config(f"{PAPER_CONFIG}:paper", [])
    plan = plan_programs(cfg, topo, ("train",), num_layers=layers, micro_batch=topo.num_devices, seq_len=seq)
    return plan.by_name("train"), plan.training_total(), topo


def _plan_old_checkout(name: str, layers: int, seq: int):
    """The same compile for a checkout that predates sgs_jax.sgs.plan."""
    from sgs_jax.models.build import abstract_model
    from sgs_jax.models.config import deepseek_prover_v2_7b
    from sgs_jax.parallel import make_mesh
    from sgs_jax.rl.batching import MicroBatch
    from sgs_jax.rl.train_step import TrainConfig, TrainPrograms

    topo = topology(name)
    n = topo.num_devices
    mesh = make_mesh(1, n, 1, devices=topo.devices)
    config = deepseek_prover_v2_7b(param_dtype="float32", remat_policy="full").replace(num_layers=layers)
    graphdef, abstract = abstract_model(config)
    progs = TrainPrograms(graphdef, abstract, TrainConfig(micro_batch_size=n, max_seq_len=seq), mesh)
    structs = lambda tree, sh: jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sh)  # noqa: E731
    params = structs(abstract, progs.param_shardings)
    acc = structs(jax.eval_shape(progs._zeros, abstract), (progs.param_shardings, {k: progs.replicated for k in progs.metric_names}))
    rows = lambda dtype: jax.ShapeDtypeStruct((n, seq), dtype)  # noqa: E731
    vec = jax.ShapeDtypeStruct((n,), jnp.float32)
    batch = structs(MicroBatch(rows(jnp.int32), rows(bool), rows(jnp.int32), rows(jnp.float32), rows(jnp.float32), vec, vec),
                    progs.batch_shardings)
    compiled, wall, cpu = compile_timed(lambda: progs.accumulate.lower(params, acc, batch))
    matmul_params = config.num_params() - config.vocab_size * config.hidden_size
    r = report("train", compiled, topo, dict(mesh.shape), f"micro-batch {n} x {seq}", wall, compile_cpu_s=cpu,
               tokens=n * seq, useful_flops=6.0 * matmul_params * seq)
    return r, float("nan"), topo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topologies", default="v5p:2x2x2,v5e:4x4")
    ap.add_argument("--layers", type=int, default=30, help="model depth (30 = DeepSeek-Prover-V2-7B)")
    ap.add_argument("--seq", type=int, default=8192, help="tokens per sequence")
    args = ap.parse_args()
    plan = _plan_current if importlib.util.find_spec("sgs_jax.sgs.plan") else _plan_old_checkout
    print(f"7B paper preset ({args.layers} layers), training micro-step, one {args.seq}-token sequence per chip; {GOALS}")
    header = f"{'topology':<10} {'peak GiB':>9} {'temp GiB':>9} {'3 roles GiB':>12} {'budget':>7} {'roofline s':>11} {'bound':>8} {'MFU':>6} {'compile s':>10} {'CPU s':>6}"
    print(header)
    for name in args.topologies.split(","):
        start = time.perf_counter()
        try:
            r, total, topo = plan(name, args.layers, args.seq)
        except Exception as err:  # noqa: BLE001 - an out-of-memory compile is a result: report it
            found = re.search(r"HLO temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)", str(err))
            why = f"out of HBM: {found.group(1)} GiB of temporaries, {found.group(2)} available" if found else f"failed: {str(err)[:200]}"
            print(f"{name:<10} {why} (compile {time.perf_counter() - start:.0f} s)")
            continue
        roles = f"{total / GIB:>12.2f}" if total == total else f"{'n/a':>12}"  # NaN: an old checkout cannot say
        print(f"{name:<10} {r.peak_bytes / GIB:>9.2f} {r.temp_bytes / GIB:>9.2f} {roles} {topo.budget_bytes / GIB:>7.2f}"
              f" {r.roofline_s:>11.3f} {r.bound:>8} {r.mfu:>6.1%} {r.compile_s:>10.0f} {r.compile_cpu_s:>6.0f}")
        coll = ", ".join(f"{k} {v / GIB:.2f}" for k, v in r.collective_bytes.items() if v)
        print(f"{'':<10} compute {r.compute_s:.3f} s, HBM {r.memory_s:.3f} s, ICI {r.ici_s:.3f} s, host {r.host_s:.3f} s ({r.host_bytes / GIB:.2f} GiB); {r.flops / 1e12:.0f} TFLOP/chip (XLA's own count, loop bodies once: {r.xla_flops / 1e12:.0f});"
              f" collectives GiB/chip: {coll}; notes: {'; '.join(r.notes) or '-'}")


if __name__ == "__main__":
    main()
