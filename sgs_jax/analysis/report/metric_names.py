"""Metric names the report reads beyond those `sgs_jax/metrics.py` names.

Each is optional: a run that does not log one shows "–" in the table and no line in its
figure. Families (a prefix plus a part the run chooses) are listed as prefix and suffix.
"""

from __future__ import annotations

from collections.abc import Iterable

from sgs_jax import metrics as m

SOLVER_CLIP_FRACTION = "solver/clip_fraction"  # what training logs (Trainer metric `clip_fraction`)
CLIP_FRACTIONS = (SOLVER_CLIP_FRACTION, m.CISPO_CLIP_FRACTION)  # first logged one is read
HARD_SOLVE_RATE = m.CUMULATIVE_SOLVE_RATE_HARD  # cumulative solve rate of the hard split
SOLVE_RATE_BAND_PREFIX = m.CUMULATIVE_SOLVE_RATE_BAND  # + difficulty band
HACK_PREFIX, HACK_SUFFIX = "conjectures/hack/", "_fraction"  # + hack name + suffix (metrics.CONJECTURE_*_FRACTION)
ILL_FORMED = m.CONJECTURE_ILL_FORMED  # conjectures dropped by the statement check
GUIDE_PREFIX, GUIDE_SHADOW_PREFIX = "guide/", "guide_shadow/"  # + Guide sub-score
GUIDE_SUBSCORES = (m.GUIDE_RELEVANCE, m.GUIDE_REDUNDANCY, m.GUIDE_CONCLUSION_COMPLEXITY)


def family(names: Iterable[str], prefix: str, suffix: str = "") -> list[str]:
    """The members of a family among `names`: the variable parts, sorted, without repeats."""
    return sorted({name[len(prefix):len(name) - len(suffix)] for name in names
                   if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix) + len(suffix)})
