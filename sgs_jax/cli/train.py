"""`sgs-train`: run SGS (or an ablation) end to end from a config.

  sgs-train --config configs/sgs.py:testbed                 # CPU testbed, minutes
  sgs-train --config configs/sgs.py:paper --workdir /data/runs/sgs_paper
  sgs-train --config configs/no_guide.py:testbed --set run.iterations=3 --set sgs.proofs_per_problem=4

Rerunning the same command resumes from the last good checkpoint (docs/runs.md). A run
directory keeps its config: resuming with a different one is refused, naming each
differing field, unless the change is allowed, e.g. to extend a run:

  sgs-train --config configs/sgs.py:testbed --iterations 20 --allow-config-change run.iterations

Exit status: 0 done, 1 a run error (disk full, diverged weights, no restorable
checkpoint, verifier unavailable; one line on stderr), 2 a bad or changed config (nothing created on disk),
128 + N stopped by signal N (SIGTERM 143, SIGINT 130), after saying where it will resume.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from sgs_jax.config import ConfigError, apply_override, load_config, validate

PROG = "sgs-train"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="FILE.py[:PRESET], e.g. configs/sgs.py:testbed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (repeatable)")
    p.add_argument("--workdir", help="run directory (overrides run.workdir)")
    p.add_argument("--iterations", type=int, help="total iterations (overrides run.iterations)")
    p.add_argument("--allow-config-change", default="", metavar="FIELD,...",
                   help="fields that may differ from the run directory's recorded config when resuming "
                        "(only ones that change no result, e.g. run.iterations)")
    p.add_argument("--coordinator", help="multi-process: coordinator address host:port")
    p.add_argument("--num-processes", type=int, help="multi-process: number of processes")
    p.add_argument("--process-id", type=int, help="multi-process: this process's index")
    p.add_argument("--log-level", default="WARNING", help="Python logging level")
    return p


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return code


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    allow = [f.strip() for f in args.allow_config_change.split(",") if f.strip()]
    try:
        cfg = load_config(args.config, args.set)
        if args.workdir:
            apply_override(cfg, f"run.workdir={args.workdir!r}")
        if args.iterations is not None:
            apply_override(cfg, f"run.iterations={args.iterations}")
        validate(cfg)
    except ConfigError as err:
        return _fail(str(err), 2)
    from sgs_jax.parallel import maybe_initialize_distributed

    maybe_initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    from sgs_jax.checkpoint import CheckpointRestoreError, NonFiniteWeightsError, storage_errno
    from sgs_jax.sgs.run import SGSRun
    from sgs_jax.sgs.stopping import GracefulStop, StopRequested
    from sgs_jax.verify import VerifierUnavailable

    print(f"[sgs] {cfg.experiment}: {args.config}, run directory {cfg.run.workdir}", flush=True)
    run = None
    resume_hint = "rerun the same command to resume"
    stop = GracefulStop(where=lambda: run.resume_point() if run is not None else resume_hint, prog=PROG)
    with stop:
        try:
            run = SGSRun(cfg, allow_config_change=allow, stop=stop)
            summary = run.run()
        except StopRequested as err:
            if run is None:
                return _fail(f"stopped by {err.name} while starting; {resume_hint}", err.exit_code)
            return _fail(f"stopped by {err.name} {run.position()}; {run.resume_point()}", err.exit_code)
        except ConfigError as err:
            return _fail(str(err), 2)
        except OSError as err:
            if storage_errno(err) is None:
                raise
            where = run.resume_point() if run is not None else resume_hint
            return _fail(f"cannot write {err.filename or cfg.run.workdir}: {err.strerror or err}; "
                         f"free space (or make it writable) and {where}", 1)
        except (CheckpointRestoreError, NonFiniteWeightsError) as err:
            return _fail(str(err), 1)
        except VerifierUnavailable as err:  # e.g. the Lean server refused the API key
            where = run.resume_point() if run is not None else resume_hint
            return _fail(f"the verifier is unavailable: {err}; {where}", 1)
        finally:
            if run is not None:
                run.close()
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
