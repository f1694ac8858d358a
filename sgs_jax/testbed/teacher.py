"""The programmatic Guide teacher: scores a (target, conjecture) pair on the SGS rubric
(SPEC Section 6) and writes the reply in the Guide's exact output format.

- relevance 0–5: how much the conjecture, used as a lemma (its hypotheses curried onto
  its conclusion, added as a premise of the target), shortens the prover's proof of the
  target. 0 when identical to the target, sharing no proposition with it, or trivial:
  its claim is given (`hacks.conclusion_in_premises`) or it pads a disjunction around a
  disjunct that already follows (`hacks.easy_disjunct`), the Conjecturer's reward hacks.
- redundancy 0/1: 1 when the conjecture stays provable after dropping some hypothesis.
- conclusion complexity 0–4: from the conclusion's shape (atoms, cohesive conjunctions,
  related or unrelated disjunctions, nesting depth).
"""

from __future__ import annotations

import dataclasses
import itertools

from sgs_jax.testbed.formula import Atom, Bot, Formula, Imp, Not, Top, atoms, conjuncts, depth, disjuncts, show, unfold_not
from sgs_jax.testbed.hacks import MAX_NODES, conclusion_in_premises, easy_disjunct, provable, redundant_hypothesis
from sgs_jax.testbed.lexer import LeanSyntaxError
from sgs_jax.testbed.parser import Statement, parse_statement
from sgs_jax.testbed.prover import SearchBudgetExceeded, prove_statement


@dataclasses.dataclass(frozen=True)
class GuideScores:
    relevance: int
    redundancy: int
    complexity: int
    reasons: tuple[str, ...]

    def reply(self) -> str:
        """The Guide's answer: reasoning, then the three scores between their tags."""
        return (
            " ".join(self.reasons)
            + "\n\n"
            + f"<begin_relevance_score> {self.relevance} <end_relevance_score>\n"
            + f"<begin_redundancy_score> {self.redundancy} <end_redundancy_score>\n"
            + f"<begin_conclusion_complexity_score> {self.complexity} <end_conclusion_complexity_score>"
        )


def _is_literal(f: Formula) -> bool:
    return isinstance(f, (Atom, Top, Bot)) or isinstance(f, Not) and isinstance(f.arg, Atom)


def conclusion_complexity(f: Formula) -> tuple[int, str]:
    """Rubric score 0–4 for a conclusion, with a one-sentence reason."""
    if _is_literal(f):
        return 0, "The conclusion is a single atomic claim."
    if depth(f) >= 6:
        return 4, "The conclusion is nested so deeply that it is hard to read."
    parts = disjuncts(f)
    if len(parts) >= 2:
        pairs = list(itertools.combinations(parts, 2))
        related = sum(1 for a, b in pairs if atoms(a) & atoms(b)) / len(pairs)
        if len(parts) >= 3 and related < 0.5:
            return 4, f"The conclusion is a disjunction of {len(parts)} largely unrelated clauses."
        if len(parts) >= 3 or related < 0.5 or depth(f) >= 4:
            return 3, "The conclusion is a disjunction of several loosely related clauses."
        return 2, "The conclusion is a disjunction of two closely related cases."
    parts = conjuncts(f)
    if len(parts) >= 2:
        if all(_is_literal(p) for p in parts):
            return (1, "The conclusion is a short, cohesive conjunction.") if len(parts) <= 3 else \
                (2, "The conclusion is a longer conjunction on one theme.")
        if depth(f) <= 3:
            return 2, "The conclusion conjoins a few compound claims."
        return 3, "The conclusion conjoins several nested clauses."
    d = depth(unfold_not(f))
    if d <= 2:
        return 1, "The conclusion is a simple compound claim."
    if d <= 4:
        return 2, "The conclusion has moderate nesting."
    return 3, "The conclusion is deeply nested."


def _as_lemma(s: Statement) -> Formula:
    """`h₁ → ... → hₙ → conclusion`: the conjecture as a usable premise."""
    f = s.conclusion
    for _, h in reversed(s.hypotheses):
        f = Imp(h, f)
    return f


def _proof_length(s: Statement) -> int | None:
    try:
        result = prove_statement(s, MAX_NODES)
    except SearchBudgetExceeded:
        return None
    return result.length if result.provable else None


def relevance(target: Statement, conj: Statement) -> tuple[int, str]:
    """Rubric relevance 0–5 with a reason."""
    t_hyps = sorted(show(f) for _, f in target.hypotheses)
    c_hyps = sorted(show(f) for _, f in conj.hypotheses)
    if t_hyps == c_hyps and target.conclusion == conj.conclusion:
        return 0, "The conjecture is the target itself."
    c_prems = tuple(f for _, f in conj.hypotheses)
    if conclusion_in_premises(conj):
        return 0, "The conjecture is trivial: its conclusion is given."
    if easy_disjunct(conj) is not None:
        return 0, "The conjecture is trivial: one disjunct already follows, the rest is padding."
    t_atoms = set(target.atoms) & set().union(atoms(target.conclusion), *(atoms(f) for _, f in target.hypotheses))
    c_atoms = set().union(atoms(conj.conclusion), *(atoms(f) for f in c_prems))
    if not (t_atoms & c_atoms):
        return 0, "The conjecture shares no proposition with the target."
    base = _proof_length(target)
    t_prems = tuple(f for _, f in target.hypotheses)
    # When the target already gives the conjecture's hypotheses, its conclusion can be
    # used directly; otherwise the lemma enters as an implication. It goes first so the
    # prover tries it first.
    lemma = conj.conclusion if all(provable(t_prems, h) for h in c_prems) else _as_lemma(conj)
    helped = _proof_length(dataclasses.replace(target, hypotheses=(("lemma", lemma),) + target.hypotheses))
    if base and helped is not None and helped < base:
        gain = (base - helped) / base
        if gain >= 0.5:
            return 5, f"Using it as a lemma cuts the target's proof from {base} to {helped} steps."
        if gain >= 0.25:
            return 4, f"It is directly useful: the target's proof shrinks from {base} to {helped} steps."
        return 3, f"It is a plausible ingredient: the target's proof shrinks from {base} to {helped} steps."
    if c_atoms <= t_atoms and atoms(conj.conclusion) & atoms(target.conclusion):
        return 2, "It is about the same propositions but does not shorten the target's proof."
    return 1, "It only loosely shares propositions with the target."


def redundancy(conj: Statement) -> tuple[int, str]:
    """1 if the conjecture is provable and stays so without one of its hypotheses."""
    name = redundant_hypothesis(conj)
    if name is not None:
        return 1, f"Hypothesis {name} is not needed for the conclusion."
    return 0, "Every hypothesis is needed." if conj.hypotheses else "No hypothesis can be dropped."


def score(target_statement: str, conjecture_statement: str) -> GuideScores:
    """Rubric scores of a conjecture for a target (statements without header).

    An unparsable conjecture scores relevance 0, redundancy 0, complexity 4."""
    target = parse_statement(target_statement)
    try:
        conj = parse_statement(conjecture_statement)
    except (LeanSyntaxError, RecursionError) as err:
        return GuideScores(0, 0, 4, (f"The conjecture is not a well-formed statement ({err}).",))
    rel, why_rel = relevance(target, conj)
    red, why_red = redundancy(conj)
    comp, why_comp = conclusion_complexity(conj.conclusion)
    return GuideScores(rel, red, comp, (why_rel, why_red, why_comp))


def teacher_reply(target_statement: str, conjecture_statement: str) -> str:
    """The Guide reply for a pair, in the exact output format of SPEC Section 6."""
    return score(target_statement, conjecture_statement).reply()
