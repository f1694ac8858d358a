"""Dead-step elimination for the prover's proofs, checked by the checker.

G4ip applies its invertible rules eagerly, so a derivation decomposes every hypothesis
whether the goal needs it or not: many `have`/`obtain` steps introduce facts nothing
uses. `prune_proof` deletes such steps (a `have ... := by` together with its nested
block) from the last to the first, keeping each deletion only when the checker still
accepts the proof. The result is what a person would write, shorter and easier for a
small model to imitate; its line count is the testbed's difficulty measure.
"""

from __future__ import annotations

import re

from sgs_jax.testbed.checker import check_parsed
from sgs_jax.testbed.parser import Statement

_DELETABLE = ("have ", "obtain ")
_FRESH_NAME = re.compile(r"(?<![\w'.])h(\d+)(?![\w'])")  # the prover's fresh names h1, h2, ...


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block_end(lines: list[str], i: int) -> int:
    """One past the last line of the step at `i` (its deeper-indented continuation)."""
    j, base = i + 1, _indent(lines[i])
    while j < len(lines) and _indent(lines[j]) > base:
        j += 1
    return j


def renumber(proof: str) -> str:
    """The prover's fresh names `hN` renamed h1, h2, ... in order of first appearance."""
    names: dict[str, str] = {}
    return _FRESH_NAME.sub(lambda m: names.setdefault(m.group(0), f"h{len(names) + 1}"), proof)


def _without_step(lines: list[str], i: int) -> list[str] | None:
    """`lines` without the `have`/`obtain` step at `i` (None when it is not one). A step
    that opens a focus block (`· have ...`) hands its dot to the block's next step."""
    text = lines[i].lstrip(" ")
    dot = text.startswith("· ")
    if not (text[2:] if dot else text).startswith(_DELETABLE):
        return None
    if not dot:
        return lines[:i] + lines[_block_end(lines, i) :]
    inner = _indent(lines[i]) + 2  # the column of the focused tactics
    j = i + 1  # past the step's own nested block, to the block's next tactic
    while j < len(lines) and _indent(lines[j]) > inner:
        j += 1
    if j >= len(lines) or _indent(lines[j]) != inner:
        return None  # the step is the block's only tactic
    return lines[:i] + [" " * (inner - 2) + "· " + lines[j][inner:]] + lines[j + 1 :]


def prune_proof(statement: Statement, proof: str) -> str:
    """`proof` (the body after `:= by`, one tactic per line) without the `have`/`obtain`
    steps it does not need, its fresh names renumbered. The input must check; so does
    the output."""
    lines = proof.split("\n")
    i = len(lines) - 1
    while i >= 0:
        candidate = _without_step(lines, i)
        if candidate and check_parsed(statement, "\n".join(candidate)).ok:
            lines = candidate
        i = min(i, len(lines)) - 1
    pruned = "\n".join(lines)
    renamed = renumber(pruned)
    # A statement binding its own `hN` could clash with a renamed step: keep the old names then.
    return renamed if check_parsed(statement, renamed).ok else pruned


def proof_length(proof: str) -> int:
    """Tactics in a proof printed one per line (the difficulty measure)."""
    return sum(1 for line in proof.split("\n") if line.strip())
