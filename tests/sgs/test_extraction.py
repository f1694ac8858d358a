"""Proof and conjecture extraction on realistic model outputs (SPEC Section 4, steps 2 and 4)."""

import pytest

from sgs_jax.sgs.extraction import (
    Extraction,
    blank_lean_comments,
    dedup_conjectures,
    extract_conjecture,
    extract_proof,
    statement_key,
)
from sgs_jax.sgs.types import Conjecture

HEADER = "import Mathlib\nimport Aesop\nset_option maxHeartbeats 400000\nopen BigOperators Real Nat Topology Rat\n\n"
STATEMENT = "theorem mathd_algebra_10 (x : ℝ) (h₀ : 0 < x) : x ^ 2 + 1 > 0 := by"
PROOF = "\n  have h₁ : 0 ≤ x ^ 2 := sq_nonneg x\n  nlinarith [h₁, h₀]"
GOOD = f"```lean4\n{HEADER}{STATEMENT}{PROOF}\n```"


def test_proof_from_a_clean_output():
    result = extract_proof(GOOD)
    assert result == Extraction(PROOF)
    assert result.ok and result.reason == ""


def test_proof_surrounding_whitespace_and_crlf():
    result = extract_proof("\n\n  " + GOOD.replace("\n", "\r\n") + "  \r\n")
    assert result.text == PROOF


def test_proof_with_lemma_keyword_and_same_line_tactic():
    output = "```lean4\nlemma foo (a b : ℕ) : a + b = b + a := by omega\n```"
    assert extract_proof(output).text == " omega"


def test_proof_keeps_comments_but_ignores_keywords_in_them():
    proof = "\n  -- this lemma is easy, a theorem of arithmetic := by trick\n  /- def nested /- lemma -/ -/\n  norm_num"
    output = f"```lean4\n{STATEMENT}{proof}\n```"
    assert extract_proof(output).text == proof


def test_assign_by_split_over_lines():
    output = "```lean4\ntheorem t : 1 + 1 = 2 :=\n  by\n  norm_num\n```"
    assert extract_proof(output).text == "\n  norm_num"


@pytest.mark.parametrize(
    "output, reason",
    [
        (f"Here is the proof:\n{GOOD}", "no_opening_fence"),  # extra prose before
        (f"{GOOD}\nThis completes the proof.", "no_closing_fence"),  # extra prose after
        (f"```lean\n{STATEMENT}{PROOF}\n```", "no_opening_fence"),  # wrong language tag
        (f"{STATEMENT}{PROOF}", "no_opening_fence"),  # missing fence
        (f"```lean4\n{STATEMENT}{PROOF}", "no_closing_fence"),  # truncated at max tokens
        ("```lean4", "no_closing_fence"),
        (f"```lean4\n{STATEMENT}\n```\n```lean4\n{STATEMENT}{PROOF}\n```", "multiple_code_blocks"),
        (f"```lean4\nlemma aux : True := by trivial\n{STATEMENT}{PROOF}\n```", "declaration_count"),
        (f"```lean4\ndef f (n : ℕ) : ℕ := n\n{STATEMENT}{PROOF}\n```", "declaration_count"),
        ("```lean4\nexample : 1 = 1 := by rfl\n```", "declaration_count"),
        ("```lean4\ntheorem t : 1 = 1 := rfl\n```", "no_assign_by"),
        (f"```lean4\n{STATEMENT}\n  \n```", "empty_proof"),
        (f"```lean4\n{STATEMENT} -- to do\n```", "empty_proof"),
        ("", "no_opening_fence"),
        (None, "not_a_string"),
        (b"```lean4\n```", "not_a_string"),
    ],
)
def test_proof_failures_give_a_reason(output, reason):
    result = extract_proof(output)
    assert result.text is None and not result.ok
    assert result.reason == reason and result.detail


def test_identifiers_containing_keywords_are_not_declarations():
    output = "```lean4\ntheorem t : my_lemma_def = Nat.theorem' := by\n  rfl\n```"
    assert extract_proof(output).text == "\n  rfl"


def test_blank_lean_comments_keeps_positions():
    text = "a -- x\nb /- c /- d -/ e -/ f\n/-- doc\nmore -/ g"
    blanked = blank_lean_comments(text)
    assert len(blanked) == len(text)
    assert [i for i, c in enumerate(text) if c == "\n"] == [i for i, c in enumerate(blanked) if c == "\n"]
    assert blanked.split() == ["a", "b", "f", "g"]


def test_blank_lean_comments_unterminated_block_runs_to_end():
    assert blank_lean_comments("x /- never closed\ny").split() == ["x"]


CONJ = "theorem aux_sq_pos (x : ℝ) (h : 0 < x) : 0 < x ^ 2 := by"


@pytest.mark.parametrize(
    "output",
    [
        f"```lean4\n{CONJ} sorry\n```",
        f"```lean4\n{CONJ}\n  sorry\n```",
        f"```lean4\n{CONJ}\n```",
        f"Some reasoning about the target.\n\n```lean4\n{CONJ}\n  sorry\n```\nThis lemma helps because ...",
        f"```lean4\n{HEADER}{CONJ}\n  sorry\n```",  # echoed preamble is dropped
        f"```lean4\n/-- A helper. -/\n{CONJ}\n  sorry -- to prove\n```",
        f"```lean4\ntheorem old : False := by sorry\n```\nBetter:\n```lean4\n{CONJ} sorry\n```",  # last block wins
        f"```lean4\n{CONJ} sorry\n```".replace("\n", "\r\n"),
        f"```lean4\n{CONJ[:-6]} :=\n    by sorry\n```",  # := and by on separate lines
    ],
)
def test_conjecture_extraction(output):
    assert extract_conjecture(output) == Extraction(CONJ)


def test_conjecture_lemma_keyword_is_kept():
    assert extract_conjecture("```lean4\nlemma l : 2 ≤ 3 := by sorry\n```").text == "lemma l : 2 ≤ 3 := by"


@pytest.mark.parametrize(
    "output, reason",
    [
        (f"{CONJ} sorry", "no_lean4_block"),
        (f"```lean\n{CONJ} sorry\n```", "no_lean4_block"),
        (f"```lean4\n{CONJ} sorry\n```\n```lean4\n{CONJ} sorr", "unterminated_block"),
        (f"```lean4\n{CONJ} sorry\n{CONJ} sorry\n```", "assign_by_count"),
        ("```lean4\ntheorem t : 1 = 1 := rfl\n```", "assign_by_count"),
        (f"```lean4\n{CONJ}\n  nlinarith [sq_nonneg x]\n```", "bad_ending"),
        (f"```lean4\n{CONJ} sorry\nexample : True := trivial\n```", "bad_ending"),
        (f"```lean4\ndef g : ℕ := 3\n{CONJ} sorry\n```", "unexpected_preamble"),
        (f"```lean4\naxiom cheat : False\n{CONJ} sorry\n```", "unexpected_preamble"),
        (f"```lean4\n{CONJ} sorry\ndef g : ℕ := 3 -- sorry\n```", "bad_ending"),
        ("```lean4\nexample : 1 = 1 := by sorry\n```", "declaration_count"),
        ("```lean4\ndef f : ℕ → ℕ := by sorry\n```", "declaration_count"),
        ("```lean4\n:= by sorry\n```", "declaration_count"),
        ("```lean4\ntheorem a : 1 = 1 := by sorry\n-- lemma b : 2 = 2 := by sorry\n```", None),
        (None, "not_a_string"),
    ],
)
def test_conjecture_failures(output, reason):
    result = extract_conjecture(output)
    if reason is None:  # the commented-out second lemma does not count
        assert result.text == "theorem a : 1 = 1 := by"
    else:
        assert (result.text, result.reason) == (None, reason) and result.detail


def test_statement_key_collapses_whitespace():
    assert statement_key("theorem  t :\r\n  1 = 1 := by") == statement_key("theorem t : 1 = 1 := by")
    assert statement_key("theorem t : 1 = 1 := by") != statement_key("theorem u : 1 = 1 := by")


def test_dedup_against_targets_and_earlier_conjectures():
    target = "theorem t (x : ℝ) : x ^ 2 ≥ 0 := by"
    c1 = Conjecture.create("t", "theorem t  (x : ℝ) :\n x ^ 2 ≥ 0 := by")  # the target again
    c2 = Conjecture.create("t", "theorem a (x : ℝ) : x * x ≥ 0 := by")
    c3 = Conjecture.create("u", "theorem a (x : ℝ) :  x * x ≥ 0 := by")  # repeat of c2
    c4 = Conjecture.create("u", "theorem b : (0 : ℝ) ≤ 1 := by")
    kept, dropped = dedup_conjectures([c1, c2, c3, c4], [target])
    assert kept == (c2, c4) and dropped == (c1, c3)


def test_conjecture_ids_follow_the_text():
    assert Conjecture.create("t", "theorem a : True := by").id == Conjecture.create("t", "theorem a : True := by").id
    assert Conjecture.create("t", "theorem a : True := by").id != Conjecture.create("t", "theorem b : True := by").id


def test_every_d3k_statement_round_trips(d3k_path):
    """A well-formed output for each real target extracts the proof, and the target stated
    as a conjecture extracts back to itself (up to the whitespace before `:= by`).

    48 D3k statements end in a line comment that swallows their `:= by` (e.g. `... = 3
    -- median formula := by`): Lean never sees it, so no proof can follow; extraction
    reports no_assign_by for them rather than pretending."""
    import json

    entries = json.loads(d3k_path.read_text(encoding="utf-8"))["target_statements"].values()
    commented = 0
    for entry in entries:
        header, statement = entry["header"], entry["theorem"]
        proof = extract_proof(f"```lean4\n{header}{statement}\n  nlinarith [sq_nonneg 1]\n```")
        if not blank_lean_comments(statement).rstrip().endswith(":= by"):
            commented += 1
            assert proof.reason == "no_assign_by", entry["id"]
            continue
        assert proof.text == "\n  nlinarith [sq_nonneg 1]", (entry["id"], proof)
        conjecture = extract_conjecture(f"Idea.\n```lean4\n{statement} sorry\n```")
        assert statement_key(conjecture.text or "") == statement_key(statement), (entry["id"], conjecture)
    assert commented == 48


def test_blank_lean_comments_keeps_positions_and_skips_strings():
    from sgs_jax.sgs.extraction import blank_lean_comments

    text = 'theorem t : s = "a--b" := by -- note\n  /- x\n -/ rfl'
    blanked = blank_lean_comments(text)
    assert len(blanked) == len(text) and blanked.count("\n") == text.count("\n")
    assert '"a--b"' in blanked and "note" not in blanked and "x" not in blanked.split("\n")[1]
    assert blanked.rstrip().endswith("rfl")
    assert blank_lean_comments("a /- never closed\nb") == "a " + " " * 15 + "\n "
