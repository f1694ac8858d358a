"""`sgs-train`: run SGS (or an ablation) end to end from a config.

  sgs-train --config configs/sgs.py:testbed                 # CPU testbed, minutes
  sgs-train --config configs/sgs.py:paper --workdir gs://…  # DeepSeek-Prover-V2-7B on D3k
  sgs-train --config configs/no_guide.py:testbed --set run.iterations=3 --set sgs.proofs_per_problem=4

Rerunning the same command resumes from the last completed iteration.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from sgs_jax.config import ConfigError, apply_override, load_config, validate


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sgs-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="FILE.py[:PRESET], e.g. configs/sgs.py:testbed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (repeatable)")
    p.add_argument("--workdir", help="run directory (overrides run.workdir)")
    p.add_argument("--iterations", type=int, help="total iterations (overrides run.iterations)")
    p.add_argument("--coordinator", help="multi-process: coordinator address host:port")
    p.add_argument("--num-processes", type=int, help="multi-process: number of processes")
    p.add_argument("--process-id", type=int, help="multi-process: this process's index")
    p.add_argument("--log-level", default="WARNING", help="Python logging level")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = load_config(args.config, args.set)
        if args.workdir:
            apply_override(cfg, f"run.workdir={args.workdir!r}")
        if args.iterations is not None:
            apply_override(cfg, f"run.iterations={args.iterations}")
        validate(cfg)
    except ConfigError as err:
        print(f"sgs-train: {err}", file=sys.stderr)
        return 2
    from sgs_jax.parallel import maybe_initialize_distributed

    maybe_initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    from sgs_jax.sgs.run import SGSRun

    print(f"[sgs] {cfg.experiment}: {args.config}, run directory {cfg.run.workdir}", flush=True)
    run = SGSRun(cfg)
    try:
        summary = run.run()
    finally:
        run.close()
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
