"""The Markdown tables of a report: one row per config (seeds pooled), one row per run (fits)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from sgs_jax.analysis.report.summary import ConfigSummary, Spread
from sgs_jax.analysis.scaling import ScalingRobustness


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What the fit table says about one run of config `config`. Rates in [0, 1]; `fit`
    is None when the fit failed, and `fit_error` then says why."""

    name: str
    config: str
    final_generations: float
    final_solve_rate: float
    fit: ScalingRobustness | None
    fit_error: str | None


def _pct(value: float, digits: int = 1) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:.{digits}f}%"


def _num(value: float, fmt: str) -> str:
    return "–" if not math.isfinite(value) else format(value, fmt)


def _spread(value: Spread, show) -> str:
    """`mean [min, max]` over the runs that have the value, noting runs that lack it."""
    if value.n == 0:
        return "–"
    text = show(value.mean)
    if value.n > 1:
        text += f" [{show(value.low)}, {show(value.high)}]"
    if value.n < value.of:
        text += f" ({value.n} of {value.of} runs)"
    return text


def _signed_pct(value: float) -> str:
    return f"{100 * value:+.0f}%".replace("-", "−")


def _seeds(seeds: Sequence[int | None]) -> str:
    known = [str(s) for s in seeds if s is not None]
    return f"{len(seeds)}" + (f" ({', '.join(known)})" if known else "")


def config_table(rows: Sequence[ConfigSummary], hacks: Sequence[str]) -> str:
    """A Markdown table, one row per config: `mean [min, max]` over its seeds of the solve
    rate (all targets, hard split) at matched generations, final Solver entropy and its
    change, the synthetic solve-rate shares at 0 and 1, and the conjecture fractions."""
    columns = ["config", "seeds", "solve rate", "hard split", "entropy (final)", "entropy change",
               "synthetic at 0", "synthetic at 1", "disjunctive"] + [f"hack: {h}" for h in hacks]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [row.label, _seeds(row.seeds), _spread(row.solve_rate, _pct), _spread(row.hard_solve_rate, _pct),
                 _spread(row.final_entropy, lambda v: f"{v:.3f}"), _spread(row.entropy_change, _signed_pct),
                 _spread(row.synthetic_at_zero, _pct), _spread(row.synthetic_at_one, _pct),
                 _spread(row.disjunctive_fraction, _pct)]
        cells += [_spread(row.hack_fractions[h], _pct) for h in hacks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def fit_table(rows: Sequence[RunSummary]) -> str:
    """A Markdown table, one row per run: final generations and solve rate, fitted A ± std
    (and max−min) of the robustness refits in percentage points, C_mid, B."""
    header = "| run | config | generations | final solve rate | A ± std | A max−min | C_mid | B | note |"
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
        lines.append(f"| {row.name} | {row.config} | {_num(row.final_generations, ',.0f')} "
                     f"| {_pct(row.final_solve_rate)} | {a} | {spread} | {c_mid} | {b} | {note} |")
    return "\n".join(lines) + "\n"
