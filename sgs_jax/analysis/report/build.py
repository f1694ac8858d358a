"""Build a report for several runs: figures, the summary table, and report.md."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Sequence

from sgs_jax import metrics as m
from sgs_jax.analysis.report import figures
from sgs_jax.analysis.report.table import RunSummary, markdown_table
from sgs_jax.analysis.run_log import RunLog, load_run
from sgs_jax.analysis.scaling import DEFAULT_MIN_GENERATIONS, fit_robustness
from sgs_jax.analysis.statements import StatementStats, summarize_statements

REPORT_NAME = "report.md"


@dataclasses.dataclass(frozen=True)
class Report:
    """What build_report wrote: the figures (name -> path), the Markdown report and
    the per-run rows; `skipped_figures` names figures no run had data for."""

    figures: dict[str, pathlib.Path]
    skipped_figures: tuple[str, ...]
    report_path: pathlib.Path
    rows: tuple[RunSummary, ...]
    baseline: figures.Baseline | None


def load_target_statements(path: str | pathlib.Path) -> list[str]:
    """The theorem texts of a target-set file in D3k's format
    ({"target_statements": {id: {"theorem": ...}}}). Raises ValueError otherwise."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    try:
        return [entry["theorem"] for entry in data["target_statements"].values()]
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path} is not a target set: expected target_statements.<id>.theorem") from err


def _last(run: RunLog, name: str) -> float:
    series = run.scalars.get(name)
    return float(series.values[-1]) if series is not None and series.values.size else math.nan


def _first(runs: Sequence[RunLog], name: str) -> float:
    for run in runs:
        series = run.scalars.get(name)
        if series is not None and series.values.size:
            return float(series.values[0])
    return math.nan


def summarize_run(run: RunLog, min_generations: float, seed: int, n_subsets: int) -> RunSummary:
    """Final values and the scaling fit (with robustness refits) of one run."""
    generations, rates = run.paired(m.GENERATIONS, m.CUMULATIVE_SOLVE_RATE)
    fit, error = None, None
    try:
        fit = fit_robustness(generations, rates, min_generations=min_generations, seed=seed, n_subsets=n_subsets)
    except ValueError as err:
        error = str(err)
    return RunSummary(
        name=run.name,
        final_generations=float(generations[-1]) if generations.size else math.nan,
        final_solve_rate=float(rates[-1]) if rates.size else math.nan,
        fit=fit,
        fit_error=error,
        final_disjunctive_fraction=_last(run, m.CONJECTURE_DISJUNCTIVE_FRACTION),
        final_conclusion_length=_last(run, m.CONJECTURE_MEAN_CONCLUSION_LENGTH),
    )


def _unique_names(run_dirs: Sequence[pathlib.Path]) -> list[str]:
    """Folder names, made unique with the parent's name where two clash."""
    names = [p.name for p in run_dirs]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in run_dirs]


def _baseline_section(stats: StatementStats | None, baseline: figures.Baseline | None) -> list[str]:
    if stats is not None:
        return ["## Target-set baseline", "",
                f"{stats.parsed} of {stats.count} statements parsed; disjunctive conclusions "
                f"{100 * stats.disjunctive_fraction:.1f}% (any `∨` in the conclusion "
                f"{100 * stats.any_disjunction_fraction:.1f}%); mean conclusion length "
                f"{stats.mean_conclusion_length:.1f} characters; mean clauses {stats.mean_clauses:.3f}.", ""]
    if baseline is not None:
        return ["## Target-set baseline (as logged by the run)", "",
                f"disjunctive conclusions {100 * baseline.disjunctive_fraction:.1f}%; mean conclusion "
                f"length {baseline.mean_conclusion_length:.1f} characters.", ""]
    return []


def build_report(run_dirs: Sequence[str | pathlib.Path], out_dir: str | pathlib.Path, source: str = "auto",
                 targets_path: str | pathlib.Path | None = None,
                 min_generations: float = DEFAULT_MIN_GENERATIONS, seed: int = 0,
                 n_subsets: int = 100) -> Report:
    """Read each run, fit its scaling curve, draw the figures and write report.md.

    The targets' baseline comes from `targets_path` (a D3k-format file) when given,
    else from the first run that logged `targets/...` metrics. Raises FileNotFoundError
    for a run folder without metrics.
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [pathlib.Path(d) for d in run_dirs]
    runs = [load_run(p, source=source, name=n) for p, n in zip(paths, _unique_names(paths))]

    stats = summarize_statements(load_target_statements(targets_path)) if targets_path else None
    if stats is not None:
        baseline = figures.Baseline(stats.disjunctive_fraction, stats.mean_conclusion_length)
    else:
        logged = (_first(runs, m.TARGET_DISJUNCTIVE_FRACTION), _first(runs, m.TARGET_MEAN_CONCLUSION_LENGTH))
        baseline = figures.Baseline(*logged) if all(math.isfinite(v) for v in logged) else None

    rows = tuple(summarize_run(run, min_generations, seed, n_subsets) for run in runs)
    fits = {row.name: row.fit.full for row in rows if row.fit is not None}
    drawn = {
        "solve_rate": figures.solve_rate_figure(runs, fits, out / "solve_rate.png", min_generations),
        "conjecture_shape": figures.conjecture_shape_figure(runs, baseline, out / "conjecture_shape.png"),
        "solver_entropy": figures.solver_entropy_figure(runs, out / "solver_entropy.png"),
        "synthetic_solve_rate": figures.synthetic_histogram_figure(runs, out / "synthetic_solve_rate.png"),
        "cispo_clip_fraction": figures.clip_fraction_figure(runs, out / "cispo_clip_fraction.png"),
    }
    written = {name: path for name, path in drawn.items() if path is not None}
    skipped = tuple(name for name, path in drawn.items() if path is None)

    lines = ["# Run report", "", "Runs: " + ", ".join(f"`{run.name}` ({run.source})" for run in runs), "",
             markdown_table(rows),
             f"A: fitted asymptote ± population std of A over the refits (last 10/20/30% dropped, "
             f"{n_subsets} random 50% subsets, seed {seed}); points with fewer than "
             f"{min_generations:,.0f} generations are not fitted. Asymptotes are estimates, not observations.", ""]
    lines += _baseline_section(stats, baseline)
    lines += ["## Figures", ""] + [f"![{name}]({path.name})" for name, path in written.items()] + [""]
    if skipped:
        lines += ["Not drawn (no run logged the metric): " + ", ".join(skipped), ""]
    skipped_records = [f"`{run.name}`: {run.skipped_records}" for run in runs if run.skipped_records]
    if skipped_records:
        lines += ["Unreadable log records skipped: " + ", ".join(skipped_records), ""]
    report_path = out / REPORT_NAME
    report_path.write_text("\n".join(lines), encoding="utf-8")
    return Report(written, skipped, report_path, rows, baseline)
