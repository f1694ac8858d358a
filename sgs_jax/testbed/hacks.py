"""Exact detectors of the Conjecturer's reward hacks on testbed statements.

A conjecture earns the solve-rate reward when the Solver proves it sometimes; the cheap
ways to get there are the hacks the Guide is meant to stop (method.md §1 and §6). On
the testbed each is decided exactly, with the parser and the prover:

- easy disjunct: the conclusion is a disjunction one of whose disjuncts already follows
  from the premises alone, so the other disjuncts are padding (`p ∨ junk` given `h : p`).
- conclusion in premises: the claim is given, a conjunct of a given fact, `True`, or
  the premises hold `False` (`(h : p ∧ q) : q`, `p → p`).
- redundant premise: the statement stays provable after dropping one hypothesis.

Premises here are the statement's hypotheses plus the antecedents of its conclusion's
implication chain, and the *core* is what remains (`(h : a) : b → c` has premises a, b
and core c): the same peeling as the Lean text analysis of `sgs_jax.analysis.statements`,
so "disjunctive" means the same in both.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from sgs_jax.testbed.formula import Bot, Formula, Imp, Or, Top, conjuncts, disjuncts, unfold_not
from sgs_jax.testbed.lexer import LeanSyntaxError
from sgs_jax.testbed.parser import Statement, parse_statement
from sgs_jax.testbed.prover import SearchBudgetExceeded, is_provable

MAX_NODES = 20_000  # prover budget per question; an exhausted search counts as "no"


def provable(premises: tuple[Formula, ...], goal: Formula, max_nodes: int = MAX_NODES) -> bool:
    """Intuitionistic provability of `premises ⊢ goal`, False when the budget runs out."""
    try:
        return is_provable(premises, goal, max_nodes)
    except SearchBudgetExceeded:
        return False


def sequent(statement: Statement) -> tuple[tuple[Formula, ...], Formula]:
    """(premises, core): hypotheses plus the conclusion's curried antecedents, and the
    final consequent of the conclusion's implication chain."""
    premises = [f for _, f in statement.hypotheses]
    core = statement.conclusion
    while isinstance(core, Imp):
        premises.append(core.left)
        core = core.right
    return tuple(premises), core


def is_disjunctive(statement: Statement) -> bool:
    """The core of the conclusion is a disjunction."""
    return isinstance(sequent(statement)[1], Or)


def conclusion_in_premises(statement: Statement) -> bool:
    """The claim is given: the core is `True`, or the conclusion or any part of its
    implication chain (`b → c` of `a → b → c`) is a premise or a conjunct of one (up to
    `¬a` = `a → False`), or some premise or conjunct is `False`."""
    premises = [f for _, f in statement.hypotheses]
    rest = statement.conclusion
    while True:
        given = {unfold_not(c) for p in premises for c in conjuncts(p)}
        if isinstance(rest, Top) or unfold_not(rest) in given or unfold_not(Bot()) in given:
            return True
        if not isinstance(rest, Imp):
            return False
        premises.append(rest.left)
        rest = rest.right


def easy_disjunct(statement: Statement, max_nodes: int = MAX_NODES) -> Formula | None:
    """The first disjunct of a disjunctive core that follows from the premises alone, or None."""
    premises, core = sequent(statement)
    if not isinstance(core, Or):
        return None
    return next((d for d in disjuncts(core) if provable(premises, d, max_nodes)), None)


def redundant_hypothesis(statement: Statement, max_nodes: int = MAX_NODES, known_provable: bool | None = None) -> str | None:
    """The name of a hypothesis the (provable) statement does not need, or None.
    known_provable: the statement's provability when the caller has decided it already."""
    prems = tuple(f for _, f in statement.hypotheses)
    if not prems:
        return None
    if known_provable is None:
        known_provable = provable(prems, statement.conclusion, max_nodes)
    if not known_provable:
        return None
    for i, (name, _) in enumerate(statement.hypotheses):
        if provable(prems[:i] + prems[i + 1 :], statement.conclusion, max_nodes):
            return name
    return None


@dataclasses.dataclass(frozen=True)
class StatementFacts:
    """What the testbed knows exactly about one conjecture statement.

    well_formed: it parses (atoms bound, core Lean syntax); the other fields are False
    when it does not. true: provable (intuitionistically; Lean's core logic here)."""

    well_formed: bool
    true: bool = False
    disjunctive: bool = False
    easy_disjunct: bool = False
    conclusion_in_premises: bool = False
    redundant_premise: bool = False


def statement_facts(text: str) -> StatementFacts:
    """The exact facts of one statement (`theorem ... := by`); never raises."""
    try:
        statement = parse_statement(text)
    except (LeanSyntaxError, RecursionError):
        return StatementFacts(False)
    true = provable(tuple(f for _, f in statement.hypotheses), statement.conclusion)
    return StatementFacts(
        well_formed=True,
        true=true,
        disjunctive=is_disjunctive(statement),
        # A false statement has no provable disjunct (each would prove the disjunction).
        easy_disjunct=true and easy_disjunct(statement) is not None,
        conclusion_in_premises=conclusion_in_premises(statement),
        redundant_premise=redundant_hypothesis(statement, known_provable=true) is not None,
    )


# Fraction names (keys of `fractions`), in the order they are logged.
FRACTIONS = ("well_formed", "true", "disjunctive", "easy_disjunct", "conclusion_in_premises", "redundant_premise")


def fractions(texts: Iterable[str]) -> dict[str, float]:
    """Per fact, its share of the statements: `well_formed` over all of them, the rest
    over the well-formed ones. Empty when there are no statements; only `well_formed`
    when none is well-formed."""
    facts = [statement_facts(t) for t in texts]
    if not facts:
        return {}
    good = [f for f in facts if f.well_formed]
    out = {"well_formed": len(good) / len(facts)}
    if good:
        for name in FRACTIONS[1:]:
            out[name] = sum(getattr(f, name) for f in good) / len(good)
    return out
