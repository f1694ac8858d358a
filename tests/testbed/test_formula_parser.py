import random

import pytest

from sgs_jax.testbed.formula import FALSE, And, Atom, Iff, Imp, Not, Or, is_classical_tautology, show
from sgs_jax.testbed.generator import random_formula
from sgs_jax.testbed.lexer import LeanSyntaxError
from sgs_jax.testbed.parser import parse_formula, parse_statement

p, q, r = Atom("p"), Atom("q"), Atom("r")


@pytest.mark.parametrize("text, tree", [
    ("p → q → r", Imp(p, Imp(q, r))),          # → is right associative
    ("p ∧ q ∧ r", And(p, And(q, r))),
    ("p ∨ q ∧ r", Or(p, And(q, r))),            # ∧ (35) binds tighter than ∨ (30)
    ("p ∨ q → r", Imp(Or(p, q), r)),            # ∨ (30) tighter than → (25)
    ("p → q ↔ r", Iff(Imp(p, q), r)),           # → (25) tighter than ↔ (20)
    ("p ↔ q → r", Iff(p, Imp(q, r))),
    ("¬p ∧ q", And(Not(p), q)),                 # ¬ takes its argument at precedence 40
    ("¬(p ∧ q)", Not(And(p, q))),
    ("¬¬p → False", Imp(Not(Not(p)), FALSE)),
    ("p -> q <-> r", Iff(Imp(p, q), r)),        # ASCII spellings
])
def test_precedence_by_hand(text, tree):
    assert parse_formula(text) == tree


@pytest.mark.parametrize("tree, text", [
    (Imp(Imp(p, q), r), "(p → q) → r"),
    (And(Or(p, q), r), "(p ∨ q) ∧ r"),
    (Iff(Iff(p, q), r), "(p ↔ q) ↔ r"),
    (Not(Imp(p, q)), "¬(p → q)"),
    (Or(p, Or(q, r)), "p ∨ q ∨ r"),
])
def test_minimal_parentheses(tree, text):
    assert show(tree) == text


def test_print_parse_roundtrip_random():
    rng = random.Random(0)
    for _ in range(2000):
        f = random_formula(rng, ("p", "q", "r"), rng.randint(0, 5))
        assert parse_formula(show(f)) == f


@pytest.mark.parametrize("text, fragment", [
    ("p ↔ q ↔ r", "not associative"),
    ("p ∧", "end of input"),
    ("(p ∧ q", "expected ')'"),
    ("p + q", "unexpected character"),
])
def test_formula_errors_have_positions(text, fragment):
    with pytest.raises(LeanSyntaxError, match="column") as info:
        parse_formula(text)
    assert fragment in str(info.value)


def test_statement_parse_and_print():
    text = "theorem t1 (p q r : Prop) (h₀ : p → q) (h₁ : q ∨ r) : r ∨ p → q ∨ r := by"
    s = parse_statement(text)
    assert s.name == "t1" and s.atoms == ("p", "q", "r")
    assert s.hypotheses == (("h₀", Imp(p, q)), ("h₁", Or(q, r)))
    assert s.lean() == text


@pytest.mark.parametrize("text, fragment", [
    ("lemma x (p : Prop) : p → p := by", "core Lean has no `lemma`"),
    ("theorem x (p : Prop) : q := by", "not bound as Prop"),
    ("theorem x (p p : Prop) : p := by", "duplicate"),
    ("theorem x (p : Prop) : p → p := by exact id", "after ':= by'"),
    ("theorem x (True : Prop) : True := by", "binder name"),
])
def test_statement_errors(text, fragment):
    with pytest.raises(LeanSyntaxError) as info:
        parse_statement(text)
    assert fragment in str(info.value)


def test_truth_table_reference():
    assert is_classical_tautology((), Or(p, Not(p)))
    assert is_classical_tautology((Imp(p, q), p), q)
    assert not is_classical_tautology((Imp(p, q),), p)
