"""`sgs-train`: run SGS (or an ablation) end to end from a config.

  sgs-train --config configs/sgs.py:testbed                 # CPU testbed, minutes
  sgs-train --config configs/sgs.py:paper --config.run.workdir=/data/runs/sgs_paper
  sgs-train --config configs/no_guide.py:testbed --config.run.iterations=3 --config.sgs.proofs_per_problem=4

Flags are absl flags; `--config FILE.py[:PRESET]` and its `--config.FIELD=VALUE`
overrides are ml_collections config flags: each value is parsed by its field's type
(`--config.sgs.use_guide=false`, `--config.verify.options.url=http://host:8000`), an
unknown field or a mistyped value is refused with its name, and the whole config is
validated before any work. The resolved config is written to the run directory.

Rerunning the same command resumes from the last good checkpoint (docs/runs.md). A run
directory keeps its config: resuming with a different one is refused, naming each
differing field, unless the change is allowed, e.g. to extend a run:

  sgs-train --config configs/sgs.py:testbed --config.run.iterations=20 --allow-config-change run.iterations

Multi-host: the same command on every host; on a TPU VM pod or under SLURM JAX finds the
other processes itself, elsewhere pass --coordinator HOST:PORT --num-processes N
--process-id I (docs/multihost.md; launch/ has the launchers).

Exit status: 0 done, 1 a run error (disk full, diverged weights, no restorable
checkpoint, verifier unavailable; one line on stderr), 2 a bad or changed config or a
half-set multi-process launch (nothing created on disk),
128 + N stopped by signal N (SIGTERM 143, SIGINT 130), after saying where it will resume.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings

from absl import flags

from sgs_jax.config import ConfigError, parse_config_flags
from sgs_jax.sgs.progress import MODES, RunProgress

PROG = "sgs-train"


def define_flags(flag_values: flags.FlagValues) -> None:
    """sgs-train's own flags (the config flags come with `parse_config_flags`)."""
    flags.DEFINE_string("allow-config-change", "", "fields that may differ from the run directory's recorded config "
                        "when resuming, comma-separated (only ones that change no result, e.g. run.iterations)",
                        flag_values=flag_values)
    flags.DEFINE_enum("progress", "auto", MODES, "phase bars (bar), plain lines (lines), nothing (off), or auto: "
                      "bars on a terminal, lines otherwise", flag_values=flag_values)
    flags.DEFINE_string("coordinator", None, "multi-process: process 0's coordinator address host:port (else "
                        "$JAX_COORDINATOR_ADDRESS; none of the three on a TPU VM pod or under SLURM: detected)",
                        flag_values=flag_values)
    flags.DEFINE_integer("num-processes", None, "multi-process: number of processes (else $SGS_NUM_PROCESSES)",
                         flag_values=flag_values)
    flags.DEFINE_integer("process-id", None, "multi-process: this process's index, 0-based (else $SGS_PROCESS_ID)",
                         flag_values=flag_values)
    flags.DEFINE_string("log-level", "WARNING", "Python logging level", flag_values=flag_values)
    flags.DEFINE_boolean("help", False, "show this help and exit", short_name="h", flag_values=flag_values)


def usage() -> str:
    own = flags.FlagValues()
    define_flags(own)
    return f"{__doc__}\nflags:\n  --config: FILE.py[:PRESET], then --config.FIELD=VALUE for any field\n{own.get_help()}"


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return code


def main(argv=None) -> int:
    from_command_line = argv is None  # only then may the process restart itself (host allocator)
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(arg in ("-h", "--help", "-help") for arg in argv):
        print(usage())
        return 0
    from sgs_jax.parallel.host_memory import configure_host_malloc

    try:
        configure_host_malloc(may_restart=from_command_line)  # before JAX starts (sgs_jax.parallel.host_memory)
    except ValueError as err:
        return _fail(str(err), 2)
    fv = flags.FlagValues()
    define_flags(fv)
    try:
        cfg, positional = parse_config_flags([PROG, *argv], fv)
        if positional:
            raise ConfigError(f"unexpected argument {positional[0]!r} (flags are --name=value)")
    except ConfigError as err:
        return _fail(str(err), 2)
    logging.basicConfig(level=fv["log-level"].value.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    allow = [f.strip() for f in fv["allow-config-change"].value.split(",") if f.strip()]
    from sgs_jax.parallel.distributed import DistributedSetupError, initialize_from_environment

    try:
        initialize_from_environment(fv["coordinator"].value, fv["num-processes"].value, fv["process-id"].value)
    except DistributedSetupError as err:
        return _fail(str(err), 2)
    import jax

    writer = jax.process_index() == 0  # the others run silently (docs/multihost.md)
    from sgs_jax.checkpoint import CheckpointRestoreError, NonFiniteWeightsError, storage_errno
    from sgs_jax.sgs.run import SGSRun
    from sgs_jax.sgs.stopping import GracefulStop, StopRequested
    from sgs_jax.verify import VerifierUnavailable

    print(f"[sgs] {cfg.experiment}: run directory {cfg.run.workdir}", flush=True)
    run = None
    progress = RunProgress(fv["progress"].value if writer else "off")
    resume_hint = "rerun the same command to resume"
    stop = GracefulStop(where=lambda: run.resume_point() if run is not None else resume_hint, prog=PROG)
    with stop:
        try:
            run = SGSRun(cfg, allow_config_change=allow, stop=stop, progress=progress)
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
            # orbax abandons the sibling fragment writes of a failed save; their coroutines,
            # never awaited, would warn at exit below the one line (the checkpoint was not
            # committed: only a finished save is renamed into place).
            warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
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
            progress.close()
    if writer:
        print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
