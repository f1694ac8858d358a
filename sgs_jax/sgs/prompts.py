"""Chat prompts for the three roles, built from replaceable template files.

Templates are `string.Template` texts (`${name}` placeholders) in `templates/*.txt`; a
config can point any role at its own file (`PromptTemplates.load(overrides)`). Each
prompt is one user message, sent through the tokenizer's chat template by the caller.

Placeholders:
- solver, conjecturer: `${code}` (header + statement, as the Solver sees it; required),
  `${header}`, `${statement}`.
- conjecturer_no_target (No Problem Conditioning ablation): `${header}` only, so the
  target cannot leak into it.
- guide: `${target}` and `${conjecture}`, both statements without header.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import string
from typing import Mapping

from sgs_jax.sgs.types import ChatMessage, Problem, Target

TEMPLATE_DIR = pathlib.Path(__file__).resolve().parent / "templates"

# role -> (placeholders that must appear, placeholders that may appear)
_PLACEHOLDERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "solver": (frozenset({"code"}), frozenset({"code", "header", "statement"})),
    "conjecturer": (frozenset({"code"}), frozenset({"code", "header", "statement"})),
    "conjecturer_no_target": (frozenset(), frozenset({"header"})),
    "guide": (frozenset({"target", "conjecture"}), frozenset({"target", "conjecture"})),
}


@dataclasses.dataclass(frozen=True)
class PromptTemplates:
    """The template text of each role (see the module docstring for placeholders)."""

    solver: str
    conjecturer: str
    conjecturer_no_target: str
    guide: str

    def __post_init__(self):
        for role, (required, allowed) in _PLACEHOLDERS.items():
            template = string.Template(getattr(self, role))
            if not template.is_valid():
                raise ValueError(f"{role} template has a malformed `$` placeholder (write `$$` for a dollar)")
            names = set(template.get_identifiers())
            if not required <= names or not names <= allowed:
                raise ValueError(
                    f"{role} template uses placeholders {sorted(names)}; it must use "
                    f"{sorted(required)} and may use only {sorted(allowed)}"
                )

    @classmethod
    def load(cls, overrides: Mapping[str, str | pathlib.Path] | None = None) -> "PromptTemplates":
        """Read the packaged templates, replacing each role named in `overrides` by a file path."""
        overrides = dict(overrides or {})
        unknown = set(overrides) - set(_PLACEHOLDERS)
        if unknown:
            raise ValueError(f"unknown template roles {sorted(unknown)}; known: {sorted(_PLACEHOLDERS)}")
        texts = {}
        for role in _PLACEHOLDERS:
            path = pathlib.Path(overrides.get(role, TEMPLATE_DIR / f"{role}.txt"))
            texts[role] = _read_template(path)
        return cls(**texts)


def _read_template(path: pathlib.Path) -> str:
    # A text file ends in a newline that is not part of the prompt.
    text = path.read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


@functools.lru_cache(maxsize=1)
def default_templates() -> PromptTemplates:
    """The packaged templates (read once)."""
    return PromptTemplates.load()


def lean_code(header: str, statement: str) -> str:
    """Header followed by statement, as one Lean file's text (a newline between if missing)."""
    if header and not header.endswith("\n"):
        header += "\n"
    return header + statement


def solver_messages(problem: Problem, templates: PromptTemplates | None = None) -> tuple[ChatMessage, ...]:
    """The Solver prompt for a problem: `Complete the following Lean 4 code:`, a blank
    line, and a ```` ```lean4 ```` block holding the trusted header + statement."""
    templates = templates or default_templates()
    return _user(templates.solver, **_code_values(problem.header, problem.statement))


def conjecturer_messages(
    target: Target, condition_on_target: bool = True, templates: PromptTemplates | None = None
) -> tuple[ChatMessage, ...]:
    """The Conjecturer prompt for a target; without the target when `condition_on_target`
    is False (the No Problem Conditioning ablation)."""
    templates = templates or default_templates()
    if not condition_on_target:
        return _user(templates.conjecturer_no_target, header=target.header.rstrip("\n"))
    return _user(templates.conjecturer, **_code_values(target.header, target.statement))


def guide_messages(
    target_statement: str, conjecture_statement: str, templates: PromptTemplates | None = None
) -> tuple[ChatMessage, ...]:
    """The Guide prompt: rubric, target and conjecture (statements without header)."""
    templates = templates or default_templates()
    return _user(templates.guide, target=target_statement, conjecture=conjecture_statement)


def _code_values(header: str, statement: str) -> dict[str, str]:
    return {"code": lean_code(header, statement), "header": header, "statement": statement}


def _user(template: str, **values: str) -> tuple[ChatMessage, ...]:
    # Placeholders were validated on load; values are inserted verbatim (never re-parsed).
    return (ChatMessage("user", string.Template(template).substitute(**values)),)
