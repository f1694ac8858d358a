import re

import pytest

from sgs_jax.testbed.teacher import score, teacher_reply

T = "theorem t (p q r : Prop) (h₀ : p → q) (h₁ : q → r) (h₂ : p) : r := by"


def test_relevant_lemma_scores_high():
    s = score(T, "theorem c (p q r : Prop) (h₀ : p → q) (h₁ : q → r) : p → r := by")
    assert s.relevance >= 4 and s.redundancy == 0 and s.complexity <= 1


def test_identical_and_unrelated_score_zero():
    assert score(T, T.replace("theorem t", "theorem c")).relevance == 0
    assert score(T, "theorem c (s u : Prop) (h : s) : s ∨ u := by").relevance == 0
    assert score(T, "theorem c (p : Prop) (h : p) : p := by").relevance == 0  # trivial


def test_redundant_premise_detected():
    assert score(T, "theorem c (p q r : Prop) (h₀ : p → q) (h₁ : r) (h₂ : p) : q := by").redundancy == 1
    assert score(T, "theorem c (p q : Prop) (h₀ : p → q) (h₂ : p) : q := by").redundancy == 0


@pytest.mark.parametrize("concl, expected", [
    ("p", 0),
    ("p ∧ q", 1),
    ("p ∨ q ∧ p", 2),                  # two related disjuncts
    ("p ∨ (q → r)", 3),                # two unrelated disjuncts
    ("p ∨ q ∨ r ∨ (q ∧ r)", 4),        # 3+ largely unrelated disjuncts
])
def test_conclusion_complexity(concl, expected):
    s = score(T, f"theorem c (p q r : Prop) : {concl} := by")
    assert s.complexity == expected


def test_reply_format_is_exact():
    reply = teacher_reply(T, "theorem c (p q r : Prop) (h₀ : p → q) (h₁ : q → r) : p → r := by")
    lines = reply.splitlines()
    assert re.fullmatch(r"<begin_relevance_score> [0-5] <end_relevance_score>", lines[-3])
    assert re.fullmatch(r"<begin_redundancy_score> [01] <end_redundancy_score>", lines[-2])
    assert re.fullmatch(r"<begin_conclusion_complexity_score> [0-4] <end_conclusion_complexity_score>", lines[-1])
    assert lines[0].strip()  # reasoning comes first


def test_unparsable_conjecture_does_not_raise():
    s = score(T, "lemma c : p := by")
    assert (s.relevance, s.complexity) == (0, 4)


def test_reward_hacks_get_no_relevance():
    # Padding a disjunction around a disjunct that a premise gives.
    assert score(T, "theorem c (p q r : Prop) (h₀ : p → q) (h₁ : p) : r ∨ q := by").relevance == 0
    # A conjunct of a premise restated, and `p → p` (its antecedent is the claim).
    assert score(T, "theorem c (p q r : Prop) (h₀ : p ∧ q) : q := by").relevance == 0
    assert score(T, "theorem c (p : Prop) : p → p := by").relevance == 0
    # The honest lemma for the same target still scores high.
    assert score(T, "theorem c (p q r : Prop) (h₀ : p → q) (h₁ : q → r) : p → r := by").relevance >= 4
