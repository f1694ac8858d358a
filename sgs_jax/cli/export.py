"""`sgs-export`: write a role of a saved iteration of a run as a Hugging Face checkpoint.

    sgs-export --run runs/sgs_testbed --role solver --out exports/solver_it10
    sgs-export --run runs/sgs_paper --role conjecturer --iteration 200 --dtype bfloat16 --out exports/conj_200

Roles: `solver`, `conjecturer` (the trained one; the base model for a frozen Conjecturer;
the Solver's weights under parameter sharing) and `guide` (the run's frozen Guide,
re-saved). `--iteration N` is the checkpoint after N completed iterations (0 = the starting
weights; default: the newest). The output is a standard `LlamaForCausalLM` directory
(config.json, safetensors, tokenizer files with the chat template) that
`transformers.AutoModelForCausalLM.from_pretrained` and vLLM load, and that `sgs-eval
--checkpoint`, `sgs-generate` and `model.checkpoint` take.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from sgs_jax.checkpoint import CheckpointRestoreError
from sgs_jax.models import Llama, abstract_model
from sgs_jax.models.hf_io import CheckpointError
from sgs_jax.models.tokenizer import TokenizerError
from sgs_jax.sgs.saved_roles import ROLES, RunDirError, load_role, load_run_config

EXPORT_INFO = "sgs_export.json"  # what was exported, written next to the weights


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sgs-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run directory")
    p.add_argument("--role", default="solver", choices=ROLES, help="which role's weights")
    p.add_argument("--iteration", type=int, help="after this many iterations (0 = starting weights; default: newest checkpoint)")
    p.add_argument("--out", required=True, help="output directory (created; must be empty unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out (its weight files are removed first)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="stored dtype of the export (default: the run's param_dtype)")
    p.add_argument("--max-shard-gib", type=float, default=4.0, help="largest safetensors file before sharding")
    p.add_argument("--log-level", default="WARNING", help="Python logging level")
    return p


def cast_model(model: Llama, dtype: str) -> Llama:
    """`model` with its parameters (and compute dtype) in `dtype`."""
    config = model.config.replace(dtype=dtype, param_dtype=dtype)
    graphdef, _ = abstract_model(config)
    state = jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, nnx.state(model)
    )
    return nnx.merge(graphdef, state)


def _prepare_out(out: str, overwrite: bool) -> None:
    """Refuse a non-empty `out` unless `overwrite`; then drop old weight files, so a
    smaller export never sits beside the shards or index of a larger one."""
    if not os.path.isdir(out) or not os.listdir(out):
        return
    if not overwrite:
        raise ValueError(f"{out} is not empty; pass --overwrite to replace what is there")
    for name in os.listdir(out):
        if name.endswith(".safetensors") or name == "model.safetensors.index.json":
            os.remove(os.path.join(out, name))


def export(args: argparse.Namespace) -> dict:
    """Restore, optionally cast, save; returns the export record (also written to OUT)."""
    from sgs_jax.models import save_hf
    from sgs_jax.parallel.mesh import mesh_from_config
    from sgs_jax.sgs import bootstrap

    cfg = load_run_config(args.run)
    if args.max_shard_gib <= 0:
        raise ValueError(f"--max-shard-gib must be positive, got {args.max_shard_gib}")
    _prepare_out(args.out, args.overwrite)
    mesh = mesh_from_config(cfg.mesh)
    tokenizer = bootstrap.load_role_tokenizer(cfg)
    model, iteration = load_role(args.run, args.role, args.iteration, mesh)
    if args.dtype and args.dtype != model.config.param_dtype:
        model = cast_model(model, args.dtype)
    save_hf(model, args.out, max_shard_bytes=int(args.max_shard_gib * (1 << 30)), tokenizer=tokenizer)
    record = {
        "run": os.path.abspath(args.run),
        "experiment": cfg.experiment,
        "role": args.role,
        "iteration": iteration,
        "dtype": model.config.param_dtype,
        "base_checkpoint": cfg.model.checkpoint,
    }
    if jax.process_index() == 0:
        with open(os.path.join(args.out, EXPORT_INFO), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    return record


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        record = export(args)
    except (RunDirError, CheckpointError, CheckpointRestoreError, TokenizerError, OSError, ValueError) as err:
        print(f"sgs-export: {err}", file=sys.stderr)
        return 2
    print(f"[sgs-export] {record['role']} of {args.run} after iteration {record['iteration']} ({record['dtype']}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
