import random
import re

from sgs_jax.testbed import hacks
from sgs_jax.testbed.checker import check_proof
from sgs_jax.testbed.generator import Knobs, generate
from sgs_jax.testbed.parser import parse_statement
from sgs_jax.testbed.warmstart import HACK_ROW_FRACTION, build_sets, corpus_record, hack_conjectures, rows_from_records


def _statements(n, seed=11):
    return [("", g.statement.lean()) for g in generate([Knobs(atoms=3, premises=2, depth=2)], n, seed=seed)]


def test_warmstart_rows_are_well_formed():
    sets = build_sets(_statements(6), seed=0)
    assert len(sets["solver"]) == 6 and sets["conjecturer"] and len(sets["guide"]) >= 18
    for row in sets["solver"]:
        prompt = row["messages"][0]["content"]
        assert prompt.startswith("Complete the following Lean 4 code:\n\n```lean4\n")
        m = re.fullmatch(r"```lean4\n(.*?:= by)\n(.*)\n```", row["completion"], re.S)
        assert m and check_proof(m.group(1), m.group(2)).ok
    for row in sets["conjecturer"]:
        m = re.fullmatch(r"```lean4\n(.*:= by) sorry\n```", row["completion"], re.S)
        assert m
        parse_statement(m.group(1))
    for row in sets["guide"]:
        assert row["completion"].rstrip().endswith("<end_conclusion_complexity_score>")


def test_lemmas_are_true_and_clean_and_hacks_are_hacks():
    rng = random.Random(0)
    records = [r for r in (corpus_record("", text, rng) for _, text in _statements(12, seed=3)) if r]
    lemmas = [lemma for r in records for lemma in r["lemmas"]]
    assert len(lemmas) >= len(records)
    for lemma in lemmas:
        f = hacks.statement_facts(lemma)
        assert f.true and not f.redundant_premise  # only the hypotheses it needs
    target = parse_statement("theorem t (p q r : Prop) (h₀ : p → q) (h₁ : q → r) (h₂ : p ∧ r) : r := by")
    lemma = parse_statement("theorem t_aux (p q r : Prop) (h₀ : p → q) (h₁ : q → r) : p → r := by")
    easy, given, redundant = (hacks.statement_facts(h.lean()) for h in hack_conjectures(rng, target, lemma))
    assert easy.easy_disjunct and given.conclusion_in_premises and redundant.redundant_premise


def test_a_tenth_of_the_conjecturer_rows_are_hacks():
    rng = random.Random(1)
    records = [r for r in (corpus_record("", text, rng) for _, text in _statements(40, seed=5)) if r]
    rows = rows_from_records(records, seed=2)["conjecturer"]
    statements = [re.fullmatch(r"```lean4\n(.*:= by) sorry\n```", r["completion"], re.S).group(1) for r in rows]
    hack_rows = sum(s in {h for r in records for h in r["hacks"]} for s in statements)
    assert abs(hack_rows / len(rows) - HACK_ROW_FRACTION) < 0.03
    assert rows_from_records(records, seed=2) == rows_from_records(records, seed=2)
