"""`sgs-export`: write a role of a saved iteration of a run as a Hugging Face checkpoint.

    sgs-export --run runs/sgs_testbed --role solver --out exports/solver_it10
    sgs-export --run runs/sgs_paper --role conjecturer --iteration 200 --dtype bfloat16 --out exports/conj_200

Roles: `solver`, `conjecturer` (the trained one; the base model for a frozen Conjecturer;
the Solver's weights under parameter sharing) and `guide` (the run's frozen Guide,
re-saved). `--iteration N` is the checkpoint after N completed iterations (0 = the starting
weights; default: the newest). The output is a standard `LlamaForCausalLM` directory
(config.json, safetensors, tokenizer files with the chat template) that
`transformers.AutoModelForCausalLM.from_pretrained` and vLLM load, and that `sgs-eval
--checkpoint`, `sgs-generate` and `model.checkpoint` take. It is written beside OUT and
renamed into place when complete: a killed export never leaves a half checkpoint in OUT.
A run can also export its Solver as it goes (`run.export_every`).
"""

from __future__ import annotations

import argparse
import logging
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from sgs_jax.checkpoint import CheckpointRestoreError
from sgs_jax.models import Llama, abstract_model
from sgs_jax.models.hf_io import CheckpointError
from sgs_jax.models.tokenizer import TokenizerError
from sgs_jax.sgs.saved_roles import ROLES, RunDirError, check_export_dir, export_record, load_role, load_run_config, write_export


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sgs-export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run directory")
    p.add_argument("--role", default="solver", choices=ROLES, help="which role's weights")
    p.add_argument("--iteration", type=int, help="after this many iterations (0 = starting weights; default: newest checkpoint)")
    p.add_argument("--out", required=True, help="output directory (created; must be empty unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out (the whole directory)")
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


def export(args: argparse.Namespace) -> dict:
    """Restore, optionally cast, save; returns the export record (also written to OUT)."""
    from sgs_jax.parallel.mesh import mesh_from_config
    from sgs_jax.sgs import bootstrap

    cfg = load_run_config(args.run)
    if args.max_shard_gib <= 0:
        raise ValueError(f"--max-shard-gib must be positive, got {args.max_shard_gib}")
    check_export_dir(args.out, args.overwrite)  # before the restore: a refusal costs nothing
    mesh = mesh_from_config(cfg.mesh)
    tokenizer = bootstrap.load_role_tokenizer(cfg)
    model, iteration = load_role(args.run, args.role, args.iteration, mesh)
    if args.dtype and args.dtype != model.config.param_dtype:
        model = cast_model(model, args.dtype)
    record = export_record(cfg, args.run, args.role, iteration, model.config.param_dtype)
    write_export(model, tokenizer, args.out, record, max_shard_bytes=int(args.max_shard_gib * (1 << 30)),
                 overwrite=args.overwrite)
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
