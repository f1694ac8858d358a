"""`sgs-plan`: per-device memory of a model on a mesh, estimated or from real compiles.

Estimate (no compile, any size, instant):
  sgs-plan --preset deepseek-prover-v2-7b --data 1 --fsdp 8 --tensor 1 --seq-len 8192
  sgs-plan --param-dtype float32 --fsdp 8      # the paper preset: fp32 master weights, bf16 compute
  sgs-plan --checkpoint /path/to/hf_checkpoint --fsdp 16 --tensor 4

The three roles of a run, phase by phase (trainers' fp32 state, inference copies, frozen
Guide, KV pool), and whether the busiest phase fits a device's HBM:
  sgs-plan --roles --config configs/sgs.py:paper --fsdp 8 --hbm-gib 95
  sgs-plan --roles --config configs/sgs.py:paper --config.roles.offload_idle=true --hbm-gib 95
  sgs-plan --roles --config configs/sgs.py:paper --config.roles.placement=split --config.roles.guide_devices=4 \
      --fsdp 12 --hbm-gib 95      # split: --data/--fsdp/--tensor lay out the Solver's sub-mesh; each sub-mesh's own peak
  sgs-plan --roles --config configs/sgs.py:paper --config.roles.placement=split --config.roles.conjecturer_devices=4 \
      --fsdp 12 --hbm-gib 95      # the Conjecturer's trainer and sampler on 4 devices of their own

Ahead-of-time compile of a run's real programs for a topology you need not have
(TPU via libtpu's compile-only devices: pip install -e '.[tpu]'; cpu:N simulated devices;
h100:N / h200:N compile with XLA:CPU and read the roofline with that GPU's figures):
  sgs-plan --aot v5p:2x2x2 --config configs/sgs.py:paper
  sgs-plan --aot v5e:4x4 --config configs/sgs.py:paper --config.solver_train.micro_batch_size=16
  sgs-plan --aot v5p:2x2x2 --config configs/sgs.py:paper --num-layers 2 --programs train,decode --json
  sgs-plan --aot v5p:2x2x2 --config configs/sgs.py:paper --programs decode --decode-tokens 2048
prints, per program and per device: memory (arguments, outputs, temporaries, code, peak,
and whether it fits in HBM), FLOPs, HBM bytes and collective bytes per execution (loop
bodies times their trip counts), and a roofline time (max of compute, HBM and ICI time).
"""

from __future__ import annotations

import argparse
import json
import os
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
    p.add_argument("--micro-batch", type=int, help="global sequences per training micro-batch (estimate: 8; --aot: the config's)")
    p.add_argument("--seq-len", type=int, help="tokens per training sequence (estimate: 8192; --aot: the Solver's longest bucket)")
    p.add_argument("--sample-batch", type=int, default=64, help="global concurrent sequences while sampling (estimate only)")
    p.add_argument("--frozen", action="store_true", help="no gradients or optimizer state (the Guide; estimate only)")
    p.add_argument("--hbm-gib", type=float, help="HBM per device in GiB for the estimate and --roles: say whether the plan fits (e.g. 95 for v5p, 141 for H200)")
    p.add_argument("--config", default="configs/sgs.py:paper",
                   help="run config FILE.py[:PRESET] for --roles and --aot; --config.FIELD=VALUE overrides a field (as for sgs-train)")
    roles = p.add_argument_group("the roles of a run (--roles)")
    roles.add_argument("--roles", action="store_true", help="plan the run config's roles phase by phase (numerics from the config)")
    aot = p.add_argument_group("ahead-of-time compile (--aot)")
    aot.add_argument("--aot", metavar="TOPOLOGY", help="compile for KIND:SHAPE: v5p:2x2x2, v5e:4x4, v5p:2x4x4, v6e:4x4, v4:2x2x1, cpu:8, h200:8")
    aot.add_argument("--num-layers", type=int, help="model depth override (e.g. 2 for a quick plan of the full width)")
    aot.add_argument("--programs", default="train,apply,prefill,decode", help="comma-separated subset of train,apply,prefill,decode")
    aot.add_argument("--prompt-len", type=int, default=1024, help="prefill prompt length (rounded up to its bucket)")
    aot.add_argument("--decode-tokens", type=int,
                     help="cached tokens per row on average in the decode chunk (default: the KV pool shared evenly by the slots)")
    aot.add_argument("--slices", type=int, default=1, help="TPU slices (multi-slice over DCN)")
    aot.add_argument("--chip", choices=("v4", "v5e", "v5p", "v6e", "h100", "h200"), help="roofline figures of another chip")
    aot.add_argument("--hlo-dir", help="write each compiled program's optimised HLO text here (NAME.hlo.txt)")
    aot.add_argument("--json", action="store_true", help="print one JSON object per program instead of text")
    return p


def main(argv=None) -> int:
    from sgs_jax.config import override_names, retired_flag_error

    argv = sys.argv[1:] if argv is None else list(argv)
    retired = retired_flag_error(argv)
    if retired is not None:
        print(f"sgs-plan: {retired}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    # Left over: config overrides (`--config.FIELD=VALUE`, `--config.FIELD VALUE`) and nothing else.
    unknown, i = [], 0
    while i < len(rest):
        if not override_names([rest[i]]):
            unknown.append(rest[i])
        elif "=" not in rest[i] and i + 1 < len(rest) and not rest[i + 1].startswith("-"):
            i += 1  # the value of `--config.FIELD VALUE`
        i += 1
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = rest
    for name in ("data", "fsdp", "tensor", "micro_batch", "seq_len", "sample_batch", "num_layers", "prompt_len", "decode_tokens", "slices"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            print(f"sgs-plan: --{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    if args.aot:
        return _aot(args)
    if args.hbm_gib is not None and args.hbm_gib <= 0:
        print("sgs-plan: --hbm-gib must be positive", file=sys.stderr)
        return 2
    hbm = None if args.hbm_gib is None else args.hbm_gib * GIB
    mesh = (args.data, args.fsdp, args.tensor)
    if args.roles:
        return _roles(args, mesh, hbm)
    runtime = dict(dtype=args.dtype, param_dtype=args.param_dtype or args.dtype)
    config = ModelConfig.from_hf_file(args.checkpoint, **runtime) if args.checkpoint else preset(args.preset, **runtime)
    plan = plan_memory(config, mesh, args.micro_batch or 8, args.seq_len or 8192, args.sample_batch, not args.frozen)
    print(f"model: {args.checkpoint or args.preset}  mesh: data={args.data} fsdp={args.fsdp} tensor={args.tensor}")
    print(plan.table())
    if hbm is not None:
        fits = "fits" if plan.total_bytes <= hbm else "DOES NOT FIT"
        print(f"{plan.total_bytes / GIB:.3f} GiB per device of {args.hbm_gib:.1f} GiB HBM: {fits}")
    return 0


def _roles(args, mesh, hbm) -> int:
    """`--roles`: the config's roles on the mesh, for the --preset / --checkpoint architecture."""
    from sgs_jax.config import ConfigError, load_config
    from sgs_jax.sgs.roles import OWN_MESH_FIELDS, memory_plan, own_memory_plans

    try:
        cfg = load_config(args.config, args.overrides)
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
    own = own_memory_plans(cfg, config)
    if not own:
        print(plan.table(hbm))
        return 0
    apart = ", ".join(f"the {role.capitalize()} on {cfg.roles[OWN_MESH_FIELDS[role]]} devices" for role in own)
    print(f"roles.placement=split: {apart} of its own, beside the Solver; each sub-mesh's peak is its own")
    print(f"\n== Solver's sub-mesh: data={args.data} fsdp={args.fsdp} tensor={args.tensor} ==")
    print(plan.table(hbm))
    for role, ((data, fsdp, tensor), role_plan) in own.items():
        print(f"\n== {role.capitalize()}'s sub-mesh: data={data} fsdp={fsdp} tensor={tensor} ==")
        print(role_plan.table(hbm))
    return 0


def _aot(args) -> int:
    from sgs_jax.parallel.aot import parse_topology

    try:
        kind, _, count = parse_topology(args.aot)
    except ValueError as err:
        print(f"sgs-plan: {err}", file=sys.stderr)
        return 2
    if kind in ("cpu", "h100", "h200"):
        # Simulated host devices must be requested before jax starts its CPU backend (importing
        # jax does not start it).
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
    from sgs_jax.config import ConfigError, load_config
    from sgs_jax.parallel.aot import format_report, topology
    from sgs_jax.sgs.plan import plan_programs

    try:
        cfg = load_config(args.config, args.overrides)
        topo = topology(args.aot, num_slices=args.slices, chip=args.chip)
        programs = tuple(p.strip() for p in args.programs.split(",") if p.strip())
        plan = plan_programs(cfg, topo, programs, num_layers=args.num_layers, micro_batch=args.micro_batch,
                             seq_len=args.seq_len, prompt_len=args.prompt_len, decode_tokens=args.decode_tokens, hlo_dir=args.hlo_dir)
    except (ConfigError, ValueError, RuntimeError, KeyError) as err:
        print(f"sgs-plan: {err}", file=sys.stderr)
        return 2
    if args.json:
        for r in plan.reports:
            print(json.dumps(r.to_json()))
        return 0
    from sgs_jax.parallel.aot import GIB

    mesh_text = " ".join(f"{k}={v}" for k, v in plan.mesh.items())
    print(f"model: {plan.model_source}; {plan.model.num_params() / 1e9:.2f}B parameters in {plan.model.param_dtype}, "
          f"compute {plan.model.dtype}, remat {plan.model.remat_policy}, attention {plan.model.attention}")
    print(f"topology: {topo.name} ({topo.num_devices} devices; {topo.chip.name}: {topo.chip.source})")
    print(f"mesh: {mesh_text}; device order: {plan.device_order}")
    print(f"budget per device: {topo.budget_bytes / GIB:.2f} GiB of HBM")
    print("parameters replicated where the mesh does not divide them: " + ("none" if not plan.replicated else "\n  " + "\n  ".join(plan.replicated)))
    for r in plan.reports:
        print(format_report(r))
    if any(r.name == "train" for r in plan.reports):
        items = ", ".join(f"{k} {v / GIB:.2f}" for k, v in plan.held_besides.items())
        total = plan.training_total()
        print(f"training phase per device: micro-step peak + {items} = {total / GIB:.2f} GiB of {topo.budget_bytes / GIB:.2f}"
              f" ({'fits' if total <= topo.budget_bytes else 'DOES NOT FIT'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
