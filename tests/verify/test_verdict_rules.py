"""Pure verdict rules and text checks (SPEC 4.8 and 7), against hand-made cases."""

import json

import pytest

from sgs_jax.verify import rules
from sgs_jax.verify.interface import Status

# ------------------------------------------------------------------ comments


@pytest.mark.parametrize(
    "text, expected",
    [
        ("simp -- try this\nlinarith", "simp  \nlinarith"),
        ("a /- outer /- inner -/ still -/ b", "a   b"),
        ("a /-- doc\ncomment -/ b", "a  \n b"),
        ("a /-! module -/ b", "a   b"),
        ('trace "-- not a comment" -- but this is', 'trace "-- not a comment"  '),
        ("exact h' -- prime", "exact h'  "),
        ("f '-' -- c", "f '-'  "),
        ('s "esc \\" -- still string" x', 's "esc \\" -- still string" x'),
    ],
)
def test_strip_comments(text, expected):
    assert rules.strip_comments(text) == expected


def test_unterminated_comment_and_string():
    assert rules.scan_comments("simp /- open /- nested -/")[1]
    assert rules.scan_comments('trace "open')[1]
    assert not rules.scan_comments("simp /- closed -/")[1]
    assert rules.scan_comments('x "s" y', blank_strings=True)[0] == 'x "" y'


# ------------------------------------------------------------------ try detector


@pytest.mark.parametrize(
    "proof, plain, token",
    [
        ("try simp", True, True),
        ("  nlinarith [sq_nonneg x]\n  <;> try linarith", True, True),
        ("exact symmetry h", True, False),  # the official substring test hits names
        ("exact h.trySomething", True, False),
        ("simp -- try later", False, False),
        ("simp /- try -/", False, False),
        ('trace "try"', True, False),
        ("first | try? | simp", True, False),
        ("linarith", False, False),
    ],
)
def test_contains_try(proof, plain, token):
    assert rules.contains_try(proof) is plain
    assert rules.contains_try(proof, token_aware=True) is token


# ------------------------------------------------------------------ banned and smuggled


@pytest.mark.parametrize("proof, banned", [("exact?", "exact?"), ("  apply?", "apply?"), ("rw? [h]", "rw?"), ("simp\n  rw??", "rw?")])
def test_banned_tactics(proof, banned):
    assert rules.find_banned_tactic(proof) == banned
    verdict = rules.precheck(proof)
    assert verdict.status is Status.REJECTED and banned in verdict.reason


@pytest.mark.parametrize("proof", ["exact h", "rwa [h]", "simp?", "-- exact?\n simp", 'trace "apply?"', "exact foo.exact"])
def test_not_banned(proof):
    assert rules.find_banned_tactic(proof) is None


@pytest.mark.parametrize(
    "proof, found",
    [
        ("simp\n#eval IO.println 1", "#eval"),
        ("  simp\n  #exit", "#exit"),
        ("norm_num\naxiom cheat : False", "axiom"),
        ("rfl\nmacro \"x\" : tactic => `(tactic| rfl)", "macro"),
        ("rfl\nelab \"x\" : tactic => pure ()", "elab"),
        ("rfl\nrun_cmd Lean.logInfo \"hi\"", "run_cmd"),
        ("rfl\n@[implemented_by g] def f := 1", "@["),
        ("rfl\n@[simp] theorem t2 : True := trivial", "@["),
        ("rfl\n  lemma t2 : True := trivial", "lemma"),
        ("rfl\ninstance : Inhabited Nat := ⟨0⟩", "instance"),
        ("rfl\nopen Lean", "open"),
        ("set_option debug.skipKernelTC true in\n  exact h", "set_option"),
        ("rfl\nset_option maxHeartbeats 0", "set_option"),
        ("rfl\nnoncomputable section", "noncomputable"),
    ],
)
def test_smuggled_commands(proof, found):
    assert rules.find_smuggled_command(proof) == found
    assert rules.precheck(proof).status is Status.REJECTED


@pytest.mark.parametrize(
    "proof",
    [
        "  nlinarith [sq_nonneg (x - y), sq_nonneg (x + y)]",
        "  open Real in\n  simp [exp_pos]",
        "  set_option maxRecDepth 10000 in\n  norm_num",
        "  exact h.def",
        "  have := my_lemma_1\n  exact inferInstance",
        "  exact Nat.theorem_x",
        '  trace "def axiom #eval"\n  simp',
        "  -- theorem in a comment\n  simp",
        "  infer_instance",
        "  rcases h with ⟨x, hx⟩\n  exact ⟨x, hx⟩",
        "  simp [Finset.sum_range_succ]\n  <;> ring_nf",
    ],
)
def test_honest_proofs_pass_prechecks(proof):
    assert rules.precheck(proof) is None


def test_text_that_is_not_utf8_is_rejected():
    verdict = rules.precheck("simp \udcff")  # a byte the input decoder could not read
    assert verdict.status is Status.REJECTED and "UTF-8" in verdict.reason


def test_unterminated_comment_rejected():
    verdict = rules.precheck("simp /- swallow the axioms check")
    assert verdict.status is Status.REJECTED and "unterminated" in verdict.reason


# ------------------------------------------------------------------ names and axioms


@pytest.mark.parametrize(
    "statement, name",
    [
        ("theorem lean_workbook_plus_80569_9 (x  : ℝ)  : x > 0 → x ^ 2 > 0 := by", "lean_workbook_plus_80569_9"),
        ("theorem wavelength_scientific_notation  :\n  0.00000094 = 9.4 * 10^(-7) := by", "wavelength_scientific_notation"),
        ("lemma foo.bar {n : ℕ} : n = n := by", "foo.bar"),
        ("/-- doc -/\ntheorem t: True := by", "t"),
        ("theorem «odd name» : True := by", "«odd name»"),
        ("example : True := by", None),
    ],
)
def test_theorem_name(statement, name):
    assert rules.theorem_name(statement) == name


def test_every_d3k_statement_has_a_name(d3k_path):
    targets = json.loads(d3k_path.read_text())["target_statements"]
    names = [rules.theorem_name(t["theorem"]) for t in targets.values()]
    assert len(names) == 3323 and all(names)
    # The name is the token right after `theorem`.
    for t, name in zip(targets.values(), names):
        assert t["theorem"].split("theorem", 1)[1].split()[0].startswith(name)


@pytest.mark.parametrize(
    "data, name, axioms",
    [
        ("'t' depends on axioms: [propext, Classical.choice, Quot.sound]", "t", ("propext", "Classical.choice", "Quot.sound")),
        ("'t' depends on axioms: [propext, sorryAx]", None, ("propext", "sorryAx")),
        ("'t' does not depend on any axioms", "t", ()),
        ("'u' does not depend on any axioms", "t", None),
        ("'«odd name»' does not depend on any axioms", "«odd name»", ()),
        ("Try this: exact h", "t", None),
    ],
)
def test_parse_axioms(data, name, axioms):
    assert rules.parse_axioms(data, name) == axioms


def _msg(severity, data, line=1, column=0):
    return {"severity": severity, "pos": {"line": line, "column": column}, "endPos": {"line": line, "column": column + 3}, "data": data}


def test_axioms_come_from_the_last_message_only():
    spoof = _msg("info", "'t' does not depend on any axioms", line=8, column=2)
    real = _msg("info", "'t' depends on axioms: [Lean.ofReduceBool, propext]", line=10)
    assert rules.axioms_from_messages([real, spoof], "t") == ("Lean.ofReduceBool", "propext")
    # Without the real report, the look-alike is not the last-positioned message either
    # when anything follows it; alone it would be, which is why unterminated comments
    # (which could swallow the real report) are rejected before checking.
    assert rules.axioms_from_messages([spoof, _msg("warning", "unused variable", line=9)], "t") is None
    assert rules.axioms_from_messages([], "t") is None


# ------------------------------------------------------------------ verdict

STD = ("propext", "Classical.choice", "Quot.sound")
SORRY_TICK = "declaration uses 'sorry'"
SORRY_BACKTICK = "declaration uses `sorry`"


@pytest.mark.parametrize(
    "reply, axioms, status, reason_part",
    [
        ({"env": 1}, STD, Status.VERIFIED, ""),
        ({"env": 1}, (), Status.VERIFIED, ""),
        ({"env": 1, "messages": [_msg("warning", "unused variable `h`"), _msg("info", "Try this: ring_nf")]}, STD, Status.VERIFIED, ""),
        ({"env": 1, "messages": [_msg("error", "unsolved goals\nx : ℝ\n⊢ 0 < x ^ 2")]}, STD, Status.LEAN_ERROR, "unsolved goals"),
        ({"env": 1, "messages": [_msg("error", "linarith failed to find a contradiction")]}, None, Status.LEAN_ERROR, "linarith failed"),
        ({"env": 1, "sorries": [{"pos": {"line": 2, "column": 2}, "endPos": {"line": 2, "column": 7}, "goal": "⊢ False"}]}, STD, Status.REJECTED, "sorry"),
        ({"env": 1, "messages": [_msg("warning", SORRY_TICK)]}, STD, Status.REJECTED, "sorry"),
        ({"env": 1, "messages": [_msg("warning", SORRY_BACKTICK)]}, STD, Status.REJECTED, "sorry"),
        ({"env": 1}, ("propext", "sorryAx"), Status.REJECTED, "sorryAx"),
        ({"env": 1}, ("Lean.ofReduceBool", "propext"), Status.REJECTED, "Lean.ofReduceBool"),
        ({"env": 1}, ("Lean.trustCompiler",), Status.REJECTED, "Lean.trustCompiler"),
        ({"env": 1}, None, Status.REJECTED, "axioms"),
        ({"message": "Unknown environment 7."}, STD, Status.LEAN_ERROR, "Unknown environment"),
    ],
)
def test_judge(reply, axioms, status, reason_part):
    verdict = rules.judge(reply, axioms)
    assert verdict.status is status
    assert verdict.verified is (status is Status.VERIFIED)
    assert reason_part in verdict.reason
    assert (verdict.reason == "") is (status is Status.VERIFIED)


def test_error_wins_over_sorry_and_reason_is_short():
    reply = {"env": 1, "sorries": [{"goal": "⊢ False"}], "messages": [_msg("warning", SORRY_TICK), _msg("error", "x" * 5000)]}
    verdict = rules.judge(reply, STD)
    assert verdict.status is Status.LEAN_ERROR and len(verdict.reason) <= 200
