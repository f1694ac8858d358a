"""Prompt templates: exact Solver format, Conjecturer with/without target, Guide, overrides."""

import json

import pytest

from sgs_jax.sgs import prompts
from sgs_jax.sgs.prompts import PromptTemplates, conjecturer_messages, guide_messages, lean_code, solver_messages
from sgs_jax.sgs.types import ChatMessage, Conjecture, Problem, Target

HEADER = "import Mathlib\nimport Aesop\nset_option maxHeartbeats 0\nopen BigOperators Real Nat Topology Rat\n\n"
TARGET = Target("t1", HEADER, "theorem t1 (x : ℝ) (h : 0 < x) : x / x = 1 := by")


def test_solver_prompt_is_deepseek_prover_v2_format():
    (message,) = solver_messages(Problem.from_target(TARGET))
    expected = "Complete the following Lean 4 code:\n\n```lean4\n" + HEADER + TARGET.statement + "\n```"
    assert message == ChatMessage("user", expected)
    assert message.as_dict() == {"role": "user", "content": expected}


def test_solver_prompt_for_a_conjecture_uses_the_targets_header():
    conjecture = Conjecture.create("t1", "theorem c (x : ℝ) (h : 0 < x) : x ≠ 0 := by")
    (message,) = solver_messages(Problem.from_conjecture(conjecture, TARGET.header))
    assert message.content.endswith("```lean4\n" + HEADER + conjecture.statement + "\n```")


def test_solver_prompt_on_real_d3k(d3k_path):
    entry = next(iter(json.loads(d3k_path.read_text(encoding="utf-8"))["target_statements"].values()))
    problem = Problem.from_target(Target(entry["id"], entry["header"], entry["theorem"]))
    (message,) = solver_messages(problem)
    assert message.content == (
        "Complete the following Lean 4 code:\n\n```lean4\n" + entry["header"] + entry["theorem"] + "\n```"
    )


def test_lean_code_adds_a_missing_newline_only():
    assert lean_code("import Mathlib", "theorem t := by") == "import Mathlib\ntheorem t := by"
    assert lean_code("import Mathlib\n", "theorem t := by") == "import Mathlib\ntheorem t := by"
    assert lean_code("", "theorem t := by") == "theorem t := by"


def test_dollar_signs_in_lean_text_are_inserted_verbatim():
    target = Target("d", "", "theorem d (f : ℕ → ℕ) : f $ 0 = f 0 := by")
    (message,) = solver_messages(Problem.from_target(target))
    assert "f $ 0 = f 0 := by\n```" in message.content


def test_conjecturer_prompt_shows_the_target_only_when_conditioned():
    (with_target,) = conjecturer_messages(TARGET)
    (without_target,) = conjecturer_messages(TARGET, condition_on_target=False)
    assert TARGET.statement in with_target.content and "sorry" in with_target.content
    assert TARGET.statement not in without_target.content and "t1" not in without_target.content
    assert "import Mathlib" in without_target.content and "sorry" in without_target.content


def test_guide_prompt_holds_both_statements_rubric_and_tags():
    conjecture = "theorem c (x : ℝ) (h : 0 < x) : x ≠ 0 := by"
    (message,) = guide_messages(TARGET.statement, conjecture)
    text = message.content
    assert TARGET.statement in text and conjecture in text and "import" not in text
    for tag in ("relevance_score", "redundancy_score", "conclusion_complexity_score"):
        assert f"<begin_{tag}>" in text and f"<end_{tag}>" in text
    assert "0 to 5" in text and "0 or 1" in text and "0 to 4" in text


def test_override_a_template_from_a_path(tmp_path):
    path = tmp_path / "solver.txt"
    path.write_text("Prove this:\n${code}\n", encoding="utf-8")
    templates = PromptTemplates.load({"solver": path})
    (message,) = solver_messages(Problem.from_target(TARGET), templates)
    assert message.content == "Prove this:\n" + HEADER + TARGET.statement
    assert templates.guide == prompts.default_templates().guide  # others stay the packaged ones


@pytest.mark.parametrize(
    "role, text, match",
    [
        ("solver", "no placeholder at all", "must use"),
        ("guide", "only ${target}", "must use"),
        ("conjecturer_no_target", "leaks ${statement}", "may use only"),
        ("solver", "${code} costs $5", "malformed"),
    ],
)
def test_bad_templates_are_rejected(tmp_path, role, text, match):
    path = tmp_path / f"{role}.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        PromptTemplates.load({role: path})


def test_unknown_role_is_rejected():
    with pytest.raises(ValueError, match="unknown template roles"):
        PromptTemplates.load({"verifier": "x.txt"})
