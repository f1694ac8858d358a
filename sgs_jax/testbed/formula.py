"""Propositional formulas as frozen dataclasses, printed in Lean 4 syntax.

Lean 4 core precedences (Init/Core.lean, Init/Prelude.lean): `¬ p` is `notation:max "¬" p:40`,
`∧` is infixr 35, `∨` infixr 30, `→` infixr 25, `↔` non-associative 20. Printing puts in
exactly the parentheses those rules need, so `parse(show(f)) == f` for every formula.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, Union

MAX_PREC = 1024  # Lean's `max`: atoms, constants, parenthesised terms and `¬ p`
NOT_ARG_PREC = 40


@dataclasses.dataclass(frozen=True)
class Atom:
    """A propositional variable, declared in the statement as `(name : Prop)`."""

    name: str


@dataclasses.dataclass(frozen=True)
class Top:
    """`True`."""


@dataclasses.dataclass(frozen=True)
class Bot:
    """`False`."""


@dataclasses.dataclass(frozen=True)
class Not:
    """`¬ arg`; in Lean a definition that unfolds to `arg → False`."""

    arg: "Formula"


@dataclasses.dataclass(frozen=True)
class And:
    left: "Formula"
    right: "Formula"


@dataclasses.dataclass(frozen=True)
class Or:
    left: "Formula"
    right: "Formula"


@dataclasses.dataclass(frozen=True)
class Imp:
    left: "Formula"
    right: "Formula"


@dataclasses.dataclass(frozen=True)
class Iff:
    left: "Formula"
    right: "Formula"


Formula = Union[Atom, Top, Bot, Not, And, Or, Imp, Iff]
TRUE = Top()
FALSE = Bot()
BINARY = (And, Or, Imp, Iff)

# node type -> (symbol, precedence, left operand's minimum precedence, right operand's)
_BINARY_SYNTAX = {
    And: ("∧", 35, 36, 35),
    Or: ("∨", 30, 31, 30),
    Imp: ("→", 25, 26, 25),
    Iff: ("↔", 20, 21, 21),
}


def precedence(f: Formula) -> int:
    """Lean precedence of the notation at the root of `f`."""
    spec = _BINARY_SYNTAX.get(type(f))
    return spec[1] if spec else MAX_PREC


def show(f: Formula) -> str:
    """Lean 4 source text of `f` with the fewest parentheses Lean's grammar needs."""
    if isinstance(f, Atom):
        return f.name
    if isinstance(f, Top):
        return "True"
    if isinstance(f, Bot):
        return "False"
    if isinstance(f, Not):
        return "¬" + _wrap(f.arg, NOT_ARG_PREC)
    symbol, _, left_min, right_min = _BINARY_SYNTAX[type(f)]
    return f"{_wrap(f.left, left_min)} {symbol} {_wrap(f.right, right_min)}"


def _wrap(f: Formula, min_prec: int) -> str:
    text = show(f)
    return f"({text})" if precedence(f) < min_prec else text


def unfold_not(f: Formula) -> Formula:
    """`f` with every `¬ a` replaced by `a → False` (Lean's definitional unfolding of `Not`)."""
    if isinstance(f, Not):
        return Imp(unfold_not(f.arg), FALSE)
    if isinstance(f, BINARY):
        return type(f)(unfold_not(f.left), unfold_not(f.right))
    return f


def defeq(a: Formula, b: Formula) -> bool:
    """Definitional equality in this fragment: syntactic equality once `Not` is unfolded."""
    return a == b or unfold_not(a) == unfold_not(b)


def subformulas(f: Formula) -> Iterator[Formula]:
    """All subformulas of `f`, `f` first (pre-order)."""
    yield f
    if isinstance(f, Not):
        yield from subformulas(f.arg)
    elif isinstance(f, BINARY):
        yield from subformulas(f.left)
        yield from subformulas(f.right)


def atoms(f: Formula) -> frozenset[str]:
    """Names of the propositional variables in `f`."""
    return frozenset(g.name for g in subformulas(f) if isinstance(g, Atom))


def size(f: Formula) -> int:
    """Number of nodes of `f`."""
    return sum(1 for _ in subformulas(f))


def depth(f: Formula) -> int:
    """Nesting depth of connectives (an atom has depth 0)."""
    if isinstance(f, Not):
        return 1 + depth(f.arg)
    if isinstance(f, BINARY):
        return 1 + max(depth(f.left), depth(f.right))
    return 0


def evaluate(f: Formula, valuation: dict[str, bool]) -> bool:
    """Classical truth value of `f` under `valuation` (atom name -> bool)."""
    if isinstance(f, Atom):
        return valuation[f.name]
    if isinstance(f, Top):
        return True
    if isinstance(f, Bot):
        return False
    if isinstance(f, Not):
        return not evaluate(f.arg, valuation)
    a, b = evaluate(f.left, valuation), evaluate(f.right, valuation)
    if isinstance(f, And):
        return a and b
    if isinstance(f, Or):
        return a or b
    if isinstance(f, Imp):
        return (not a) or b
    return a == b


def is_classical_tautology(hypotheses: tuple[Formula, ...], conclusion: Formula) -> bool:
    """True iff every valuation making all hypotheses true makes `conclusion` true
    (brute force over 2^atoms truth assignments)."""
    names = sorted(set().union(atoms(conclusion), *(atoms(h) for h in hypotheses)))
    for values in itertools.product((False, True), repeat=len(names)):
        valuation = dict(zip(names, values))
        if all(evaluate(h, valuation) for h in hypotheses) and not evaluate(conclusion, valuation):
            return False
    return True


def conjuncts(f: Formula) -> list[Formula]:
    """The top-level conjuncts of `f` (`a ∧ (b ∧ c)` -> [a, b, c])."""
    return conjuncts(f.left) + conjuncts(f.right) if isinstance(f, And) else [f]


def disjuncts(f: Formula) -> list[Formula]:
    """The top-level disjuncts of `f` (`a ∨ (b ∨ c)` -> [a, b, c])."""
    return disjuncts(f.left) + disjuncts(f.right) if isinstance(f, Or) else [f]
