"""Per-iteration fractions of well-formed, true and reward-hacking statements (method.md §9).

Two sources, chosen by the run's domain:
- exact (testbed, `prop` backend): `sgs_jax.testbed.hacks` decides each fact with the
  testbed parser and prover: well-formed, true, easy disjunct, conclusion in premises,
  redundant premise.
- Lean text (any other backend): only what the text shows. A conclusion counts as "in the
  premises" when, after `sgs_jax.analysis.statements` peels the statement, it is `True`
  or equals the type of a binder or a premise (whitespace and outer parentheses aside).
  Truth, redundancy and easy disjuncts need a prover, so they are not logged.

The disjunctive fraction itself comes from `sgs_jax.analysis.statements` for both.
"""

from __future__ import annotations

from typing import Iterable

from sgs_jax import metrics as M
from sgs_jax.analysis.statements import try_parse_statement

# hacks.fractions key -> (conjecture metric, target metric or None)
_EXACT_NAMES = {
    "well_formed": (M.CONJECTURE_WELL_FORMED_FRACTION, None),
    "true": (M.CONJECTURE_TRUE_FRACTION, None),
    "easy_disjunct": (M.CONJECTURE_EASY_DISJUNCT_FRACTION, M.TARGET_EASY_DISJUNCT_FRACTION),
    "conclusion_in_premises": (M.CONJECTURE_CONCLUSION_IN_PREMISES_FRACTION, M.TARGET_CONCLUSION_IN_PREMISES_FRACTION),
    "redundant_premise": (M.CONJECTURE_REDUNDANT_PREMISE_FRACTION, M.TARGET_REDUNDANT_PREMISE_FRACTION),
}


def _normalise(text: str) -> str:
    text = " ".join(text.split())
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def _binder_types(binder: str) -> list[str]:
    """`(h₀ h₁ : x > 0)` -> ["x > 0"]; binders without a type give nothing."""
    inner = binder.strip()[1:-1]
    return [inner.split(":", 1)[1]] if ":" in inner else []


def lean_conclusion_in_premises(theorem: str) -> bool | None:
    """Text heuristic: the conclusion is `True` or restates a binder's type or a premise;
    None when the statement does not parse."""
    shape = try_parse_statement(theorem)
    if isinstance(shape, str):
        return None
    conclusion = _normalise(shape.conclusion)
    if conclusion == "True":
        return True
    given = [t for b in shape.binders for t in _binder_types(b)] + list(shape.premises)
    return any(_normalise(g) == conclusion for g in given)


def statement_fractions(statements: Iterable[str], exact: bool, of_targets: bool = False) -> dict[str, float]:
    """Metric name -> fraction for this batch of statements (empty when there are none).

    exact: use the testbed's exact facts (only valid for testbed statements); otherwise
    the Lean text heuristic. of_targets: name the hack fractions `targets/hack/*` (the
    target set's baseline) and leave out well-formed and true."""
    statements = list(statements)
    if not statements:
        return {}
    if exact:
        from sgs_jax.testbed.hacks import fractions  # the testbed joins here only when asked

        names = {key: pair[1 if of_targets else 0] for key, pair in _EXACT_NAMES.items()}
        return {names[key]: value for key, value in fractions(statements).items() if names.get(key)}
    flags = [f for f in (lean_conclusion_in_premises(s) for s in statements) if f is not None]
    if not flags:
        return {}
    name = M.TARGET_CONCLUSION_IN_PREMISES_FRACTION if of_targets else M.CONJECTURE_CONCLUSION_IN_PREMISES_FRACTION
    return {name: sum(flags) / len(flags)}
