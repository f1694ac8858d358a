"""`sgs-experiments`: run an experiment's configs x seeds, then (optionally) its report.

  sgs-experiments configs/experiments/findings.py --jobs 2 --report reports/findings
  sgs-experiments configs/experiments/findings.py --only sgs,rl_baseline --seeds 1 --config.run.iterations=2
  sgs-experiments configs/experiments/findings.py --dry-run        # print the sgs-train commands

`--config.FIELD=VALUE` flags (written with `=`) go to every run's sgs-train command as
they are, after the experiment's own overrides. Each run is
`ROOT/<experiment>/<label>_seed<seed>/` (its sgs-train output in train.log).
Rerunning the same command continues: finished runs are skipped, the others resume.
Exit status: 0 when every run finished, 1 when one failed, 2 for a bad experiment or
override (nothing is started then), 130 when stopped by SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys

from sgs_jax.config import override_names, retired_flag_error
from sgs_jax.experiments import load_experiment, plan_runs, run_experiment, train_command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sgs-experiments", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", help="experiment file defining get_experiment(), e.g. configs/experiments/findings.py")
    p.add_argument("--root", default="runs", help="runs go to ROOT/<experiment>/ (default %(default)s)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each its own process (default %(default)s)")
    p.add_argument("--only", default="", help="comma-separated entry labels to run (default: all)")
    p.add_argument("--seeds", default="", help="comma-separated seeds to run (default: the experiment's)")
    p.add_argument("--report", metavar="OUT", help="when every run finished, write sgs-report's report to OUT")
    p.add_argument("--dry-run", action="store_true", help="print each run's sgs-train command and exit")
    return p


def split_config_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the runner's own arguments, the `--config.FIELD=VALUE` flags for every run).
    Raises ValueError for a retired flag and for an override not written with `=` (its
    value would be taken for the runner's)."""
    retired = retired_flag_error(argv)
    if retired is not None:
        raise ValueError(str(retired))
    own, config_flags = [], []
    for arg in argv:
        if override_names([arg]):
            if "=" not in arg and not arg.startswith(("--no", "-no")):
                raise ValueError(f"write {arg}=VALUE (with =)")
            config_flags.append(arg)
        else:
            own.append(arg)
    return own, config_flags


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        own, config_flags = split_config_flags(argv)
    except ValueError as err:
        print(f"sgs-experiments: {err}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(own)
    try:
        path = pathlib.Path(args.experiment)
        experiment = load_experiment(path)
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        only = [s.strip() for s in args.only.split(",") if s.strip()]
        runs = plan_runs(experiment, path.parent, args.root, only=only, seeds=seeds,
                         extra=config_flags)
        if args.jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    except ValueError as err:
        print(f"sgs-experiments: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        for run in runs:
            print(shlex.join(train_command(run)))
        return 0
    print(f"[experiments] {experiment.name}: {len(runs)} runs ({len({r.label for r in runs})} configs x "
          f"{len({r.seed for r in runs})} seeds), {args.jobs} at a time, in {pathlib.Path(args.root, experiment.name)}",
          flush=True)
    outcomes = run_experiment(runs, jobs=args.jobs)
    failed = [o.run.name for o in outcomes if o.status == "failed"]
    if any(o.status == "interrupted" for o in outcomes):
        return 130
    if failed:
        print(f"[experiments] {len(failed)} failed: {', '.join(failed)}; rerun the same command to retry them",
              flush=True)
        return 1
    run_dirs = [str(run.workdir) for run in runs]
    if args.report:
        from sgs_jax.analysis.report.build import build_report

        report = build_report(run_dirs, args.report)
        print(f"[experiments] report: {report.report_path}", flush=True)
    else:
        print(f"[experiments] all runs finished; report: sgs-report --runs {pathlib.Path(args.root, experiment.name)} "
              f"--out reports/{experiment.name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
