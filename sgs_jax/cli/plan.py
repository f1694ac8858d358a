"""`sgs-plan`: print the per-device memory plan of a model on a mesh (no allocation).

  sgs-plan --preset deepseek-prover-v2-7b --data 1 --fsdp 8 --tensor 1 --seq-len 8192
  sgs-plan --param-dtype float32 --fsdp 8      # the paper preset: fp32 master weights, bf16 compute
  sgs-plan --checkpoint /path/to/hf_checkpoint --fsdp 16 --tensor 4

The three roles of a run, phase by phase (trainers' fp32 state, inference copies, frozen
Guide, KV pool), and whether the busiest phase fits a device's HBM:
  sgs-plan --roles --config configs/sgs.py:paper --fsdp 8 --hbm-gib 95
  sgs-plan --roles --config configs/sgs.py:paper --set roles.offload_idle=True --hbm-gib 95
"""

from __future__ import annotations

import argparse
import sys

from sgs_jax.models.config import PRESETS, ModelConfig, preset
from sgs_jax.parallel.memory import GIB, plan_memory


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sgs-plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", default="deepseek-prover-v2-7b", choices=sorted(PRESETS), help="model preset")
    src.add_argument("--checkpoint", help="Hugging Face checkpoint directory (reads config.json only)")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (activations, KV cache)")
    p.add_argument("--param-dtype", help="stored parameter dtype (default: --dtype; float32 = fp32 master weights)")
    p.add_argument("--data", type=int, default=1, help="data-parallel mesh axis size")
    p.add_argument("--fsdp", type=int, default=8, help="FSDP mesh axis size")
    p.add_argument("--tensor", type=int, default=1, help="tensor-parallel mesh axis size")
    p.add_argument("--micro-batch", type=int, default=8, help="global sequences per training micro-batch")
    p.add_argument("--seq-len", type=int, default=8192, help="tokens per sequence")
    p.add_argument("--sample-batch", type=int, default=64, help="global concurrent sequences while sampling")
    p.add_argument("--frozen", action="store_true", help="no gradients or optimizer state (the Guide)")
    p.add_argument("--hbm-gib", type=float, help="HBM per device in GiB: say whether the plan fits (e.g. 95 for v5p, 141 for H200)")
    roles = p.add_argument_group("the roles of a run (--roles)")
    roles.add_argument("--roles", action="store_true", help="plan the run config's roles phase by phase (numerics from the config)")
    roles.add_argument("--config", default="configs/sgs.py:paper", help="run config FILE.py[:PRESET]")
    roles.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (repeatable)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("data", "fsdp", "tensor", "micro_batch", "seq_len", "sample_batch"):
        if getattr(args, name) <= 0:
            print(f"sgs-plan: --{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    if args.hbm_gib is not None and args.hbm_gib <= 0:
        print("sgs-plan: --hbm-gib must be positive", file=sys.stderr)
        return 2
    hbm = None if args.hbm_gib is None else args.hbm_gib * GIB
    mesh = (args.data, args.fsdp, args.tensor)
    if args.roles:
        return _roles(args, mesh, hbm)
    runtime = dict(dtype=args.dtype, param_dtype=args.param_dtype or args.dtype)
    config = ModelConfig.from_hf_file(args.checkpoint, **runtime) if args.checkpoint else preset(args.preset, **runtime)
    plan = plan_memory(config, mesh, args.micro_batch, args.seq_len, args.sample_batch, not args.frozen)
    print(f"model: {args.checkpoint or args.preset}  mesh: data={args.data} fsdp={args.fsdp} tensor={args.tensor}")
    print(plan.table())
    if hbm is not None:
        fits = "fits" if plan.total_bytes <= hbm else "DOES NOT FIT"
        print(f"{plan.total_bytes / GIB:.3f} GiB per device of {args.hbm_gib:.1f} GiB HBM: {fits}")
    return 0


def _roles(args, mesh, hbm) -> int:
    """`--roles`: the config's roles on the mesh, for the --preset / --checkpoint architecture."""
    from sgs_jax.config import ConfigError, load_config
    from sgs_jax.sgs.roles import memory_plan

    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as err:
        print(f"sgs-plan: {err}", file=sys.stderr)
        return 2
    runtime = dict(dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype)
    config = ModelConfig.from_hf_file(args.checkpoint, **runtime) if args.checkpoint else preset(args.preset, **runtime)
    plan = memory_plan(cfg, config, mesh)
    print(f"model: {args.checkpoint or args.preset} ({config.param_dtype} masters, {config.dtype} compute)  config: {args.config}"
          f"  mesh: data={args.data} fsdp={args.fsdp} tensor={args.tensor}")
    print(f"sampling weights: {cfg.sampling.weights_dtype}, {cfg.sampling.weights_layout} layout; keep_inference_weights="
          f"{cfg.sampling.keep_inference_weights}; offload_idle={cfg.roles.offload_idle}")
    print(plan.table(hbm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
