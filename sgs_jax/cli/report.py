"""`sgs-report`: figures and a summary table for one or more runs.

    sgs-report --runs runs/sgs runs/no_guide --out reports/ablation \
        [--targets ../shared/data/d3k/D_3k_prover_dataset.json] [--source auto|jsonl|tensorboard]
"""

from __future__ import annotations

import argparse
import sys

from sgs_jax.analysis.report.build import build_report
from sgs_jax.analysis.run_log import SOURCES
from sgs_jax.analysis.scaling import DEFAULT_MIN_GENERATIONS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sgs-report", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, help="run folders written by MetricsWriter")
    parser.add_argument("--out", required=True, help="folder for the PNG figures and report.md")
    parser.add_argument("--targets", help="target-set file (D3k format) for the statement-shape baseline")
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="read metrics.jsonl, the TensorBoard event files, or auto (JSONL when present)")
    parser.add_argument("--min-generations", type=float, default=DEFAULT_MIN_GENERATIONS,
                        help="points below this generation count are not fitted (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random-subset refits")
    parser.add_argument("--subsets", type=int, default=100, help="number of random 50%% subset refits")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status (2 when a run folder has no metrics)."""
    args = parse_args(argv)
    try:
        report = build_report(args.runs, args.out, source=args.source, targets_path=args.targets,
                              min_generations=args.min_generations, seed=args.seed, n_subsets=args.subsets)
    except (FileNotFoundError, ValueError) as err:
        print(f"sgs-report: {err}", file=sys.stderr)
        return 2
    print(report.report_path.read_text(encoding="utf-8"))
    for name, path in report.figures.items():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
