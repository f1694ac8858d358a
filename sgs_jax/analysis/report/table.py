"""The Markdown summary table of a report: one row per run."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from sgs_jax.analysis.scaling import ScalingRobustness


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What the table says about one run. Rates in [0, 1]; lengths in characters;
    `fit` is None when the fit failed, and `fit_error` then says why."""

    name: str
    final_generations: float
    final_solve_rate: float
    fit: ScalingRobustness | None
    fit_error: str | None
    final_disjunctive_fraction: float
    final_conclusion_length: float


def _pct(value: float, digits: int = 1) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:.{digits}f}%"


def _num(value: float, fmt: str) -> str:
    return "–" if not math.isfinite(value) else format(value, fmt)


def markdown_table(rows: Sequence[RunSummary]) -> str:
    """A Markdown table: final solve rate, fitted A ± std (and max−min) of the
    robustness refits in percentage points, C_mid, B, and conjecture shape."""
    header = ("| run | generations | final solve rate | A ± std | A max−min | C_mid | B "
              "| disjunctive (final) | conclusion length (final) | note |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        if row.fit is not None:
            fit = row.fit.full
            a = f"{100 * fit.A:.1f}% ± {100 * row.fit.A_std:.1f} pp"
            spread = f"{100 * row.fit.A_range:.1f} pp"
            c_mid, b = f"{fit.C_mid:,.0f}", f"{fit.B:.3f}"
            note = f"{fit.n_points} points fitted"
            if row.fit.failed_refits:
                note += f"; {row.fit.failed_refits} refits failed"
        else:
            a = spread = c_mid = b = "–"
            note = f"no fit: {row.fit_error}"
        lines.append(f"| {row.name} | {_num(row.final_generations, ',.0f')} | {_pct(row.final_solve_rate)} "
                     f"| {a} | {spread} | {c_mid} | {b} | {_pct(row.final_disjunctive_fraction)} "
                     f"| {_num(row.final_conclusion_length, '.1f')} | {note} |")
    return "\n".join(lines) + "\n"
