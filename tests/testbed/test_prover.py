import pytest

from sgs_jax.testbed.checker import check_parsed
from sgs_jax.testbed.parser import parse_statement
from sgs_jax.testbed.prover import prove_statement

THEOREMS = [
    "(p q : Prop) : ¬¬(p ∨ ¬p)",
    "(p q : Prop) : (p → q) → ¬q → ¬p",
    "(p q r : Prop) : (p ∧ q → r) ↔ (p → q → r)",
    "(p q r : Prop) : p ∧ (q ∨ r) → p ∧ q ∨ p ∧ r",
    "(p q : Prop) : ¬(p ∨ q) ↔ ¬p ∧ ¬q",
    "(p q : Prop) : ((((p → q) → p) → p) → q) → q",
    "(p : Prop) : ¬¬¬p → ¬p",
    "(p q r : Prop) (h₀ : p → q) (h₁ : q ∨ r) : r ∨ p → q ∨ r",
]
# Classical tautologies that intuitionistic logic does not prove.
NON_THEOREMS = [
    "(p : Prop) : p ∨ ¬p",
    "(p : Prop) : ¬¬p → p",
    "(p q : Prop) : ((p → q) → p) → p",
    "(p q : Prop) : (p → q) ∨ (q → p)",
    "(p q : Prop) : ¬(p ∧ q) → ¬p ∨ ¬q",
    "(p q : Prop) : (¬q → ¬p) → p → q",
]


@pytest.mark.parametrize("body", THEOREMS)
def test_intuitionistic_theorems_are_proved_and_checked(body):
    st = parse_statement(f"theorem t {body} := by")
    result = prove_statement(st)
    assert result.provable
    assert check_parsed(st, result.proof_text()).ok
    assert result.length == sum(1 for line in result.proof if not line.strip().startswith("·")) or result.length > 0


@pytest.mark.parametrize("body", NON_THEOREMS)
def test_classical_only_tautologies_are_refuted(body):
    assert not prove_statement(parse_statement(f"theorem t {body} := by")).provable
