"""Proof pruning and the exact reward-hack detectors, on hand-written statements."""

import random

import pytest

from sgs_jax.analysis import statements as lean_text
from sgs_jax.testbed import hacks
from sgs_jax.testbed.checker import check_proof
from sgs_jax.testbed.generator import DEFAULT_MIX, generate, random_formula
from sgs_jax.testbed.parser import parse_statement
from sgs_jax.testbed.prover import prove_statement
from sgs_jax.testbed.prune import proof_length, prune_proof, renumber


def test_prune_drops_unused_steps_and_keeps_the_proof_valid():
    text = ("theorem t (p q r s : Prop) (h₀ : (p ↔ q) ∧ (q ∨ p) → (r → q) → ¬p) (h₁ : ¬(¬q → s)) "
            "(h₂ : p ∧ s → False → r) : ¬((r → q) ∧ s ∧ r) := by")
    statement = parse_statement(text)
    raw = prove_statement(statement).proof_text()
    pruned = prune_proof(statement, raw)
    assert check_proof(text, raw).ok and check_proof(text, pruned).ok
    assert proof_length(pruned) < proof_length(raw)
    assert "h₀" not in pruned  # the first hypothesis is never needed
    assert pruned.split("\n")[0] == "  intro h1"  # fresh names renumbered from 1


def test_prune_moves_a_focus_dot_to_the_next_step():
    text = "theorem t (p q : Prop) (h₀ : p ∧ q) (h₁ : p → q) : q ∧ p := by"
    proof = ("  constructor\n"
             "  · have h9 : p := h₀.1\n"
             "    exact h₀.2\n"
             "  · exact h₀.1")
    pruned = prune_proof(parse_statement(text), proof)
    assert pruned == "  constructor\n  · exact h₀.2\n  · exact h₀.1"
    assert check_proof(text, pruned).ok


def test_renumber_touches_only_fresh_names():
    assert renumber("intro h7\nexact h₀ h7 h12") == "intro h1\nexact h₀ h1 h2"


def test_pruned_proofs_of_random_statements_check():
    for item in generate(DEFAULT_MIX, 30, seed=21):
        assert check_proof(item.statement.lean(), item.proof).ok
        assert item.difficulty == proof_length(item.proof)


def facts(text):
    return hacks.statement_facts(text)


@pytest.mark.parametrize("text, expected", [
    # A disjunct that a premise gives: padding around it.
    ("theorem c (p q r : Prop) (h₀ : p) (h₁ : q → r) : (q → r ∧ q) ∨ p := by", "easy_disjunct"),
    ("theorem c (p q : Prop) (h₀ : p ∧ q) : q ∨ (p → False) := by", "easy_disjunct"),
    # The claim is given: a premise, a conjunct of one, a curried antecedent, True, ex falso.
    ("theorem c (p q : Prop) (h₀ : p ∧ q) : q := by", "conclusion_in_premises"),
    ("theorem c (p : Prop) : p → p := by", "conclusion_in_premises"),
    ("theorem c (p q : Prop) (h₀ : q) : p → True := by", "conclusion_in_premises"),
    ("theorem c (p q : Prop) (h₀ : False ∧ q) : p := by", "conclusion_in_premises"),
    ("theorem c (p q : Prop) (h₀ : ¬p) : p → False := by", "conclusion_in_premises"),  # ¬p is p → False
    # A hypothesis the proof does not need.
    ("theorem c (p q r : Prop) (h₀ : p → q) (h₁ : p) (h₂ : r) : q := by", "redundant_premise"),
])
def test_each_hack_is_detected(text, expected):
    f = facts(text)
    assert f.well_formed and f.true
    found = {name for name in ("easy_disjunct", "conclusion_in_premises", "redundant_premise") if getattr(f, name)}
    assert expected in found, found


@pytest.mark.parametrize("text", [
    "theorem c (p q r : Prop) (h₀ : p → q) (h₁ : q → r) : p → r := by",  # a clean lemma
    "theorem c (p q : Prop) (h₀ : p ∨ q) : q ∨ p := by",  # a disjunction no disjunct of which follows alone
    "theorem c (p q : Prop) (h₀ : p ∧ q) : q ∧ p := by",
])
def test_honest_lemmas_are_not_hacks(text):
    f = facts(text)
    assert f.well_formed and f.true
    assert not (f.easy_disjunct or f.conclusion_in_premises or f.redundant_premise)


def test_ill_formed_and_false_statements():
    assert not facts("theorem c (p : Prop) : p ∨ q := by").well_formed  # q unbound
    assert not facts("theorem c (p q : Prop) : p ∧ := by").well_formed
    false = facts("theorem c (p q : Prop) (h₀ : p ∨ q) : p := by")
    assert false.well_formed and not false.true and not false.redundant_premise


def test_fractions_count_well_formed_over_all_and_the_rest_over_well_formed():
    texts = ["theorem c (p q : Prop) (h₀ : p) : p ∨ q := by",  # true, disjunctive, easy disjunct
             "theorem c (p q : Prop) (h₀ : p → q) (h₁ : p) : q := by",  # true, clean
             "theorem c (p q : Prop) (h₀ : p ∨ q) : p := by",  # false
             "theorem c (p : Prop) : p ∨ z := by"]  # ill-formed
    out = hacks.fractions(texts)
    assert out["well_formed"] == 0.75
    assert out["true"] == pytest.approx(2 / 3)
    assert out["disjunctive"] == pytest.approx(1 / 3) and out["easy_disjunct"] == pytest.approx(1 / 3)
    assert out["conclusion_in_premises"] == 0.0 and out["redundant_premise"] == 0.0
    assert hacks.fractions([]) == {} and hacks.fractions(["theorem bad"]) == {"well_formed": 0.0}


def test_disjunctive_agrees_with_the_lean_text_analysis():
    rng = random.Random(4)
    names = ("p", "q", "r")
    for _ in range(200):
        hyp, concl = random_formula(rng, names, 2), random_formula(rng, names, 3)
        text = f"theorem c (p q r : Prop) (h₀ : {hyp_text(hyp)}) : {hyp_text(concl)} := by"
        assert hacks.is_disjunctive(parse_statement(text)) == lean_text.is_disjunctive(text), text


def hyp_text(f):
    from sgs_jax.testbed.formula import show

    return show(f)
