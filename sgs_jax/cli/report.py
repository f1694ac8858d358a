"""`sgs-report`: figures and tables for runs, grouped by config.

    sgs-report --runs runs/findings --out reports/findings            # every run of an experiment
    sgs-report --runs runs/sgs_testbed rl=runs/rl_baseline_testbed --out reports/ \
        [--targets ../shared/data/d3k/D_3k_prover_dataset.json] [--source auto|jsonl|tensorboard]

A run is grouped with the others of its config: the `experiment` name in its config.json,
or the label given as LABEL=DIR. A folder holding run folders stands for all of them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from sgs_jax.analysis.report.build import build_report, expand_run_dirs
from sgs_jax.analysis.run_log import SOURCES
from sgs_jax.analysis.scaling import DEFAULT_MIN_GENERATIONS, MIN_GENERATIONS_FRACTION


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sgs-report", description=__doc__.splitlines()[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, metavar="[LABEL=]DIR",
                        help="run folders (or folders of run folders); LABEL= sets the config they are grouped under")
    parser.add_argument("--out", required=True, help="folder for the PNG figures and report.md")
    parser.add_argument("--targets", help="target-set file (D3k format) for the statement-shape baseline")
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="read metrics.jsonl, the TensorBoard event files, or auto (JSONL when present)")
    parser.add_argument("--min-generations", type=float, default=None,
                        help="points below this generation count are not fitted (default: "
                             f"min({DEFAULT_MIN_GENERATIONS}, {MIN_GENERATIONS_FRACTION} x the shortest run's generations))")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random-subset refits")
    parser.add_argument("--subsets", type=int, default=100, help="number of random 50%% subset refits")
    return parser.parse_args(argv)


def labelled_run_dirs(items: list[str]) -> tuple[list[str], list[str | None]]:
    """Run folders and their labels from `[LABEL=]DIR` items (folders of runs expanded)."""
    dirs, labels = [], []
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or os.path.exists(item):  # a folder whose name holds "=" is a folder
            label, path = None, item
        expanded = expand_run_dirs([path])
        dirs += [str(p) for p in expanded]
        labels += [label or None] * len(expanded)
    return dirs, labels


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status (2 when a run folder has no metrics)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="sgs-report: warning: %(message)s")
    try:
        dirs, labels = labelled_run_dirs(args.runs)
        report = build_report(dirs, args.out, source=args.source, targets_path=args.targets,
                              min_generations=args.min_generations, seed=args.seed, n_subsets=args.subsets,
                              labels=labels)
    except (FileNotFoundError, ValueError) as err:
        print(f"sgs-report: {err}", file=sys.stderr)
        return 2
    print(report.report_path.read_text(encoding="utf-8"))
    for name, path in report.figures.items():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
