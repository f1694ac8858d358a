"""`sgs-plan`: print the per-device memory plan of a model on a mesh (no allocation).

  sgs-plan --preset deepseek-prover-v2-7b --data 1 --fsdp 8 --tensor 1 --seq-len 8192
  sgs-plan --param-dtype float32 --fsdp 8      # the paper preset: fp32 master weights, bf16 compute
  sgs-plan --checkpoint /path/to/hf_checkpoint --fsdp 16 --tensor 4
"""

from __future__ import annotations

import argparse
import sys

from sgs_jax.models.config import PRESETS, ModelConfig, preset
from sgs_jax.parallel.memory import plan_memory


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
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("data", "fsdp", "tensor", "micro_batch", "seq_len", "sample_batch"):
        if getattr(args, name) <= 0:
            print(f"sgs-plan: --{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    runtime = dict(dtype=args.dtype, param_dtype=args.param_dtype or args.dtype)
    config = ModelConfig.from_hf_file(args.checkpoint, **runtime) if args.checkpoint else preset(args.preset, **runtime)
    plan = plan_memory(config, (args.data, args.fsdp, args.tensor), args.micro_batch, args.seq_len, args.sample_batch, not args.frozen)
    print(f"model: {args.checkpoint or args.preset}  mesh: data={args.data} fsdp={args.fsdp} tensor={args.tensor}")
    print(plan.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
