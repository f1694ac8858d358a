"""Per-iteration statement fractions: exact on the testbed, the text heuristic for Lean."""

import pytest

from sgs_jax import metrics as M
from sgs_jax.sgs.statement_facts import lean_conclusion_in_premises, statement_fractions


@pytest.mark.parametrize("theorem, given", [
    ("theorem t (x : ℝ) (h₀ : 0 < x) : 0 < x := by", True),
    ("theorem t (x y : ℝ) (h₀ h₁ : x = y) : (x = y) := by", True),
    ("theorem t (x : ℕ) : x > 2 → x > 2 := by", True),
    ("theorem t (x : ℕ) (h : x = 1) : True := by", True),
    ("theorem t (x : ℝ) (h₀ : 0 < x) : 0 < x ^ 2 := by", False),
    ("theorem t (a b : ℕ) (h : a ∣ b) : a ∣ b * 2 ∨ b = 0 := by", False),
])
def test_lean_text_heuristic(theorem, given):
    assert lean_conclusion_in_premises(theorem) is given


def test_unparsable_lean_is_left_out():
    assert lean_conclusion_in_premises("example := 3") is None
    assert statement_fractions(["example := 3"], exact=False) == {}


def test_exact_and_lean_fractions_and_names():
    texts = ["theorem c (p q : Prop) (h₀ : p) : p ∨ q := by", "theorem c (p q : Prop) (h₀ : p ∧ q) : q := by"]
    exact = statement_fractions(texts, exact=True)
    assert exact[M.CONJECTURE_WELL_FORMED_FRACTION] == 1.0 and exact[M.CONJECTURE_TRUE_FRACTION] == 1.0
    assert exact[M.CONJECTURE_EASY_DISJUNCT_FRACTION] == 0.5
    assert exact[M.CONJECTURE_CONCLUSION_IN_PREMISES_FRACTION] == 0.5
    assert exact[M.CONJECTURE_REDUNDANT_PREMISE_FRACTION] == 0.0
    targets = statement_fractions(texts, exact=True, of_targets=True)
    assert set(targets) == {M.TARGET_EASY_DISJUNCT_FRACTION, M.TARGET_CONCLUSION_IN_PREMISES_FRACTION,
                            M.TARGET_REDUNDANT_PREMISE_FRACTION}
    # Text sees a restated premise, not a conjunct of one; and nothing else.
    lean = statement_fractions(texts + ["theorem c (p q : Prop) (h₀ : p ∧ q) : p ∧ q := by"], exact=False)
    assert lean == {M.CONJECTURE_CONCLUSION_IN_PREMISES_FRACTION: pytest.approx(1 / 3)}
    assert statement_fractions([], exact=True) == {}
