"""`sgs-eval`: best-of-n evaluation of a Solver on a target set, pass@k for every k <= n.

    sgs-eval --run runs/sgs_testbed --iteration 10 --n 8 --out reports/eval_it10
    sgs-eval --checkpoint sgs_jax/testbed/data/models/base --config configs/sgs.py:testbed --n 8 --out reports/eval_base
    sgs-eval --checkpoint /models/DeepSeek-Prover-V2-7B --config configs/sgs.py:paper --n 32 \
        --targets /data/D_3k_prover_dataset.json --option lean_project_dir=/opt/lean --out reports/dspv2

The Solver is a run's (its weights after `--iteration` completed iterations, restored from
the run's checkpoints; 0 = the base model; default the newest checkpoint) or any Hugging
Face checkpoint directory. Prompt, sampling settings, proof extraction and verification are
those of training, taken from the run's `config.json` (or from `--config` for a bare
checkpoint). Writes OUT/per_target.jsonl (one line per target: id, n, c, pass@k for every
k <= n, the verified proofs), OUT/summary.json and OUT/pass_at_k.md, and prints the table.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import configs
from sgs_jax.checkpoint import CheckpointRestoreError
from sgs_jax.cli.verify import parse_option_pairs
from sgs_jax.config import ConfigError, load_config
from sgs_jax.models.hf_io import CheckpointError
from sgs_jax.models.tokenizer import TokenizerError, load_tokenizer
from sgs_jax.parallel.host_memory import configure_host_malloc
from sgs_jax.sgs.saved_roles import RunDirError, load_role, load_run_config
from sgs_jax.sgs.target_set import TargetFileError

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(configs.__file__)), "sgs.py") + ":testbed"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sgs-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    solver = p.add_mutually_exclusive_group(required=True)
    solver.add_argument("--run", help="run directory: evaluate its Solver")
    solver.add_argument("--checkpoint", help="Hugging Face checkpoint directory (with its tokenizer) to evaluate as the Solver")
    p.add_argument("--iteration", type=int, help="with --run: the Solver after this many iterations (0 = base; default: newest checkpoint)")
    p.add_argument("--config", help=f"with --checkpoint: FILE.py[:PRESET] giving targets, verifier and sampling (default: the testbed preset, {DEFAULT_CONFIG})")
    p.add_argument("--n", type=int, default=8, help="samples per target (pass@k is reported for every k <= n)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--targets", help="testbed | hub | hub:OWNER/NAME | PATH to a D3k-format JSON (default: the config's)")
    p.add_argument("--limit", type=int, help="evaluate only the first N targets (default: the config's targets.limit)")
    p.add_argument("--backend", help="verification backend: prop | lean | remote (default: the config's)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="verifier option (JSON value or string); the config's options are kept unless --backend changes the backend")
    p.add_argument("--seed", type=int, help="sampling seed (default: the config's run.seed)")
    p.add_argument("--max-batch", type=int, help="sampler slots (default: the config's sampling.max_batch)")
    p.add_argument("--mesh", metavar="one|DATA,FSDP,TENSOR", help="device mesh: `one` = the first device (default: the config's mesh)")
    p.add_argument("--log-level", default="WARNING", help="Python logging level")
    return p


def resolve_config(args: argparse.Namespace):
    """The config that sets everything but the Solver's weights, with the CLI's changes applied."""
    if args.run is not None:
        if args.config:
            raise ConfigError("--config goes with --checkpoint; a run is evaluated with its own config.json")
        cfg = load_run_config(args.run)
    else:
        if args.iteration is not None:
            raise ConfigError("--iteration goes with --run")
        cfg = load_config(args.config or DEFAULT_CONFIG)
    if args.targets:
        source, _, hub_id = args.targets.partition(":")
        if args.targets == "testbed" or source == "hub":
            cfg.targets.source = source
            cfg.targets.hub_id = hub_id or cfg.targets.hub_id
        else:
            cfg.targets.source, cfg.targets.path = "file", args.targets
    if args.limit is not None:
        if args.limit < 0:
            raise ConfigError(f"--limit must be >= 0, got {args.limit}")
        cfg.targets.limit = args.limit
    if args.backend and args.backend != cfg.verify.backend:
        cfg.verify.backend = args.backend
        cfg.verify.options = {}  # the other backend's options would not apply
    options = dict(cfg.verify.options)
    options.update(parse_option_pairs(args.option))
    cfg.verify.options = options
    if args.seed is not None:
        cfg.run.seed = args.seed
    if args.max_batch is not None:
        if args.max_batch < 1:
            raise ConfigError(f"--max-batch must be positive, got {args.max_batch}")
        cfg.sampling.max_batch = args.max_batch
    if args.n < 1:
        raise ConfigError(f"--n must be positive, got {args.n}")
    return cfg


def parse_mesh(spec: str):
    """`one` -> a mesh of the first local device; `D,F,T` -> a (data, fsdp, tensor) mesh of all devices."""
    import jax

    from sgs_jax.parallel.mesh import make_mesh

    if spec == "one":
        return make_mesh(1, 1, 1, devices=jax.local_devices()[:1])
    try:
        data, fsdp, tensor = (int(x) for x in spec.split(","))
    except ValueError:
        raise ConfigError(f"--mesh must be `one` or DATA,FSDP,TENSOR (e.g. 1,-1,1), got {spec!r}") from None
    return make_mesh(data, fsdp, tensor)


def run(args: argparse.Namespace) -> dict:
    """Load, sample, verify, write; returns the summary record."""
    from sgs_jax.parallel.mesh import mesh_from_config
    from sgs_jax.sampling import Sampler
    from sgs_jax.sgs import bootstrap, evaluation
    from sgs_jax.sgs.phases import PhaseContext
    from sgs_jax.verify import make_backend

    cfg = resolve_config(args)
    mesh = parse_mesh(args.mesh) if args.mesh else mesh_from_config(cfg.mesh)
    targets = bootstrap.load_target_set(cfg).targets
    if args.run is not None:
        model, iteration = load_role(args.run, "solver", args.iteration, mesh)
        tokenizer = bootstrap.load_role_tokenizer(cfg)
        title = f"Solver of {args.run} after iteration {iteration}"
        source = {"run": os.path.abspath(args.run), "iteration": iteration}
    else:
        tokenizer = load_tokenizer(args.checkpoint)
        model = bootstrap.load_model(cfg, args.checkpoint, mesh)
        title = f"Solver {args.checkpoint}"
        source = {"checkpoint": os.path.abspath(args.checkpoint)}
    verifier = make_backend(cfg.verify.backend, **dict(cfg.verify.options))
    sampler = Sampler.from_config(cfg, model.config, mesh)
    ctx = PhaseContext.from_config(cfg, sampler, tokenizer, verifier, bootstrap.load_templates(cfg))
    print(f"[sgs-eval] {title}: {len(targets)} targets x {args.n} samples, verifier {cfg.verify.backend}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        result = evaluation.evaluate_solver(ctx, model, targets, args.n, cfg.sampling.solver_max_total_len, cfg.run.seed, cfg.sampling.max_batch)
    finally:
        verifier.close()
    info = {
        **source,
        "backend": cfg.verify.backend,
        "seed": cfg.run.seed,
        "temperature": cfg.sampling.temperature,
        "top_p": cfg.sampling.top_p,
        "top_k": cfg.sampling.top_k,
        "solver_max_total_len": cfg.sampling.solver_max_total_len,
        "seconds": time.perf_counter() - start,
    }
    paths = evaluation.write_evaluation(result, args.out, title, info)
    print(evaluation.markdown_table(result, title))
    print(f"[sgs-eval] wrote {', '.join(paths.values())}", file=sys.stderr)
    return evaluation.summary(result, info)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        configure_host_malloc(may_restart=argv is None)  # before JAX starts its CPU client
        run(args)
    except (ConfigError, RunDirError, CheckpointError, CheckpointRestoreError, TokenizerError, TargetFileError, OSError, ValueError, TypeError) as err:
        print(f"sgs-eval: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
