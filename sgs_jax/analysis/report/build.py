"""Build a report for several runs: runs grouped by config, figures, two tables, report.md."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Sequence

import numpy as np

from sgs_jax import metrics as m
from sgs_jax.analysis.groups import (RunGroup, final_generations, group_runs, matched_generations,
                                     run_identity)
from sgs_jax.analysis.report import figures
from sgs_jax.analysis.report.summary import LATE_WINDOW_FRACTION, ConfigSummary, hack_names, summarize_config
from sgs_jax.analysis.report.table import RunSummary, config_table, fit_table
from sgs_jax.analysis.run_log import JSONL_NAME, RunLog, has_metrics, load_run
from sgs_jax.analysis.scaling import (DEFAULT_MIN_GENERATIONS, MIN_GENERATIONS_FRACTION, fit_robustness,
                                      scale_aware_min_generations)
from sgs_jax.analysis.statements import StatementStats, summarize_statements

REPORT_NAME = "report.md"


@dataclasses.dataclass(frozen=True)
class Report:
    """What build_report wrote: the figures (name -> path), the Markdown report, the
    per-config and per-run rows, the matched generation count (NaN when a run logs no
    generations), the fit threshold used and the targets' baselines drawn;
    `skipped_figures` names figures no run had data for."""

    figures: dict[str, pathlib.Path]
    skipped_figures: tuple[str, ...]
    report_path: pathlib.Path
    configs: tuple[ConfigSummary, ...]
    rows: tuple[RunSummary, ...]
    matched_generations: float
    min_generations: float
    baselines: tuple[figures.Baseline, ...]


def load_target_statements(path: str | pathlib.Path) -> list[str]:
    """The theorem texts of a target-set file in D3k's format
    ({"target_statements": {id: {"theorem": ...}}}). Raises ValueError otherwise."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    try:
        return [entry["theorem"] for entry in data["target_statements"].values()]
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path} is not a target set: expected target_statements.<id>.theorem") from err


def expand_run_dirs(paths: Sequence[str | pathlib.Path]) -> list[pathlib.Path]:
    """Run folders: each path as given, except that a folder without metrics whose
    subfolders hold runs (an experiment folder of `sgs-experiments`) stands for those
    subfolders, in name order."""
    out = []
    for path in map(pathlib.Path, paths):
        children = sorted(p for p in path.iterdir() if p.is_dir() and has_metrics(p)) if path.is_dir() else []
        out.extend(children if children and not has_metrics(path) else [path])
    return out


def _first(run: RunLog, name: str) -> float:
    series = run.scalars.get(name)
    return float(series.values[0]) if series is not None and series.values.size else math.nan


def summarize_run(run: RunLog, config: str, min_generations: float, seed: int, n_subsets: int) -> RunSummary:
    """Final values and the scaling fit (with robustness refits) of one run."""
    generations, rates = run.paired(m.GENERATIONS, m.CUMULATIVE_SOLVE_RATE)
    fit, error = None, None
    try:
        fit = fit_robustness(generations, rates, min_generations=min_generations, seed=seed, n_subsets=n_subsets)
    except ValueError as err:
        error = str(err)
    return RunSummary(
        name=run.name,
        config=config,
        final_generations=float(generations[-1]) if generations.size else math.nan,
        final_solve_rate=float(rates[-1]) if rates.size else math.nan,
        fit=fit,
        fit_error=error,
    )


def _unique_names(run_dirs: Sequence[pathlib.Path]) -> list[str]:
    """Folder names, made unique with the parent's name where two clash."""
    names = [p.name for p in run_dirs]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in run_dirs]


def logged_baselines(groups: Sequence[RunGroup], styles: dict[str, figures.Style]) -> tuple[figures.Baseline, ...]:
    """The targets' statement shape each config's runs logged at step 0 (mean over its runs):
    one black line when every config has the same targets, else one line per config in
    its colour. Empty when no run logged `targets/*`."""
    per_group = {}
    for group in groups:
        values = [(_first(run, m.TARGET_DISJUNCTIVE_FRACTION), _first(run, m.TARGET_MEAN_CONCLUSION_LENGTH))
                  for run in group.runs]
        values = [v for v in values if all(math.isfinite(x) for x in v)]
        if values:
            per_group[group.label] = tuple(float(x) for x in np.mean(values, axis=0))
    if not per_group:
        return ()
    shapes = list(per_group.values())
    if all(np.allclose(shape, shapes[0], rtol=1e-9, atol=1e-12) for shape in shapes):
        single = sum(len(g.runs) for g in groups) == 1
        return (figures.Baseline(*shapes[0], label="targets (this run)" if single else "targets (these runs)"),)
    return tuple(figures.Baseline(*shape, label=f"targets ({label})", color=styles[label].color)
                 for label, shape in per_group.items())


def _baseline_section(stats: StatementStats | None, targets_path, baselines: Sequence[figures.Baseline]) -> list[str]:
    if stats is not None:
        return [f"## Target-set baseline (`{pathlib.Path(targets_path).name}`)", "",
                f"{stats.parsed} of {stats.count} statements parsed; disjunctive conclusions "
                f"{100 * stats.disjunctive_fraction:.1f}% (any `∨` in the conclusion "
                f"{100 * stats.any_disjunction_fraction:.1f}%); mean conclusion length "
                f"{stats.mean_conclusion_length:.1f} characters; mean clauses {stats.mean_clauses:.3f}.", ""]
    if baselines:
        return ["## Target-set baseline (as logged by the runs at step 0)", ""] + [
            f"- {b.label}: disjunctive conclusions {100 * b.disjunctive_fraction:.1f}%; mean conclusion "
            f"length {b.mean_conclusion_length:.1f} characters." for b in baselines] + [""]
    return []


def _matched_line(runs: Sequence[RunLog], matched: float) -> str:
    if not math.isfinite(matched):
        return "Matched generations: none (a run logs no generation count); solve rates are not compared."
    limiting = [run.name for run in runs if final_generations(run) == matched]
    return (f"Matched generations: **{matched:,.0f}**, the largest generation count every run of every "
            f"config reaches (where `{limiting[0]}` ends); solve rates are read there.")


def build_report(run_dirs: Sequence[str | pathlib.Path], out_dir: str | pathlib.Path, source: str = "auto",
                 targets_path: str | pathlib.Path | None = None, min_generations: float | None = None,
                 seed: int = 0, n_subsets: int = 100,
                 labels: Sequence[str | None] | None = None) -> Report:
    """Read each run, group the runs by config, fit each run's scaling curve, draw the
    figures and write report.md.

    labels[i]: run i's config label, None to take config.json's `experiment` name (else
    the folder name). min_generations: the fit threshold; None = scale-aware
    (`scaling.scale_aware_min_generations` of the runs' final counts). The targets'
    baseline comes from `targets_path` (a D3k-format file) when given, else from what the
    runs logged at step 0. Raises FileNotFoundError for a run folder without metrics.
    """
    out = pathlib.Path(out_dir)
    paths = [pathlib.Path(d) for d in run_dirs]
    labels = list(labels) if labels is not None else [None] * len(paths)
    if len(labels) != len(paths):
        raise ValueError(f"{len(paths)} run folders but {len(labels)} labels")
    runs = [load_run(p, source=source, name=n) for p, n in zip(paths, _unique_names(paths))]
    identities = [run_identity(p, label) for p, label in zip(paths, labels)]
    groups = group_runs(runs, [label for label, _ in identities], [s for _, s in identities])
    config_of = {run.name: label for run, (label, _) in zip(runs, identities)}
    styles = figures.group_styles([g.label for g in groups])
    out.mkdir(parents=True, exist_ok=True)

    matched = matched_generations(runs)
    finals = [f for f in map(final_generations, runs) if math.isfinite(f) and f > 0]
    if min_generations is not None:
        threshold_rule = "set by --min-generations"
    elif finals:
        min_generations = scale_aware_min_generations(finals)
        threshold_rule = f"min({DEFAULT_MIN_GENERATIONS:,}, {MIN_GENERATIONS_FRACTION:g} × the shortest run's generations)"
    else:
        min_generations, threshold_rule = DEFAULT_MIN_GENERATIONS, "the paper's; no run logs generations"
    rows = tuple(summarize_run(run, config_of[run.name], min_generations, seed, n_subsets) for run in runs)
    fits = {row.name: row.fit.full for row in rows if row.fit is not None}
    hacks = hack_names(runs)
    configs = tuple(summarize_config(group, matched, hacks) for group in groups)

    stats = summarize_statements(load_target_statements(targets_path)) if targets_path else None
    if stats is not None:
        baselines = (figures.Baseline(stats.disjunctive_fraction, stats.mean_conclusion_length,
                                      label=f"targets ({pathlib.Path(targets_path).name})"),)
    else:
        baselines = logged_baselines(groups, styles)

    drawn = {
        "solve_rate": figures.solve_rate_figure(groups, styles, out / "solve_rate.png", matched),
        "solve_rate_bands": figures.solve_rate_bands_figure(groups, styles, out / "solve_rate_bands.png"),
        "scaling_fit": figures.scaling_fit_figure(groups, styles, fits, out / "scaling_fit.png", min_generations),
        "conjecture_shape": figures.conjecture_shape_figure(groups, styles, baselines, out / "conjecture_shape.png"),
        "conjecture_hacks": figures.conjecture_hacks_figure(groups, styles, hacks, out / "conjecture_hacks.png"),
        "guide_scores": figures.guide_scores_figure(groups, styles, out / "guide_scores.png"),
        "solver_entropy": figures.solver_entropy_figure(groups, styles, out / "solver_entropy.png"),
        "synthetic_solve_rate": figures.synthetic_histogram_figure(groups, styles, out / "synthetic_solve_rate.png"),
        "cispo_clip_fraction": figures.clip_fraction_figure(groups, styles, out / "cispo_clip_fraction.png"),
    }
    written = {name: path for name, path in drawn.items() if path is not None}
    skipped = tuple(name for name, path in drawn.items() if path is None)

    window = f"the last {100 * LATE_WINDOW_FRACTION:.0f}% of its iterations (at least one)"
    lines = ["# Run report", "",
             f"{len(runs)} runs in {len(groups)} configs: " + "; ".join(
                 f"**{g.label}** (" + ", ".join(f"`{r.name}`" for r in g.runs) + ")" for g in groups), "",
             "## By config", "", _matched_line(runs, matched), "",
             config_table(configs, hacks),
             "Each cell: mean over the config's runs [min, max]. Solve rates (all targets; hard split, "
             "`cumulative_solve_rate/hard`) at the matched generation count, linearly interpolated between "
             f"logged iterations. Final values are each run's mean over {window}; entropy change is final "
             "over iteration 1, minus 1. Synthetic at 0 / at 1: share of conjectures whose k Solver attempts "
             "all failed / all succeeded (`synthetic_solve_rate` histograms). Disjunctive and hack columns: "
             "fraction of kept conjectures. – : not logged by any run of the config.", "",
             "## Scaling fits (per run)", "", fit_table(rows),
             f"A: fitted asymptote ± population std of A over the refits (last 10/20/30% dropped, "
             f"{n_subsets} random 50% subsets, seed {seed}); points with fewer than "
             f"{min_generations:,.0f} generations are not fitted ({threshold_rule}). "
             "Asymptotes are estimates, not observations.", ""]
    lines += _baseline_section(stats, targets_path, baselines)
    lines += ["## Figures", ""] + [f"![{name}]({path.name})" for name, path in written.items()] + [""]
    if skipped:
        lines += ["Not drawn (no run logged the metric): " + ", ".join(skipped), ""]
    unreadable = [f"`{run.name}` {JSONL_NAME} line{'s' if len(run.skipped_lines) > 1 else ''} "
                  + ", ".join(map(str, run.skipped_lines)) for run in runs if run.skipped_lines]
    if unreadable:
        lines += ["Unreadable log records skipped: " + "; ".join(unreadable), ""]
    report_path = out / REPORT_NAME
    report_path.write_text("\n".join(lines), encoding="utf-8")
    return Report(written, skipped, report_path, configs, rows, matched, min_generations, tuple(baselines))
