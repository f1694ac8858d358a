"""Pull proofs and conjectures out of raw model text (method.md §4 steps 2 and 4).

Every function here is total: on any input it returns an `Extraction` holding either the
extracted text or a failure `reason` (a short code for counters) plus a `detail` for
humans. Model garbage never raises.

Checks run on a copy of the text in which Lean comments are blanked out (same length,
same line breaks), so a `lemma` or `:= by` inside a comment counts for nothing, while
the text we return is sliced from the original.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Sequence

from sgs_jax.sgs.types import Conjecture
from sgs_jax.verify.rules import scan_comments

FENCE = "```"
LEAN_FENCE = "```lean4"

# Identifier characters in Lean (letters, digits, _, ', subscripts, dots in qualified
# names): a keyword counts only when not glued to one of these.
_IDENT = r"[\w'.!?]"
_SOLVER_DECLARATION = re.compile(rf"(?<!{_IDENT})(?:theorem|lemma|def)(?!{_IDENT})")
# Anything that declares something: a conjecture must hold exactly one of these.
_ANY_DECLARATION = re.compile(
    rf"(?<!{_IDENT})(?:theorem|lemma|def|example|abbrev|instance|axiom|opaque|structure|"
    rf"inductive|class|macro|elab|syntax|notation)(?!{_IDENT})"
)
_CONJECTURE_START = re.compile(r"(?:theorem|lemma)(?![\w'.!?])")
# `:= by`, tolerating any whitespace between the two tokens.
_ASSIGN_BY = re.compile(r":=\s*by(?![\w'.!?])")
_SORRY_AT_END = re.compile(rf"(?<!{_IDENT})sorry\s*\Z")
_PREAMBLE_LINE = re.compile(r"(?:import|set_option|open)(?![\w'.!?])")


@dataclasses.dataclass(frozen=True)
class Extraction:
    """Result of an extraction.

    text: the extracted proof body or statement; None on failure.
    reason: "" on success, else a short failure code (see the module's functions).
    detail: a human-readable explanation of the failure.
    """

    text: str | None
    reason: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.text is not None

    @classmethod
    def failure(cls, reason: str, detail: str) -> "Extraction":
        return cls(None, reason, detail)


def normalize_newlines(text: str) -> str:
    """CRLF and lone CR become LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def blank_lean_comments(text: str) -> str:
    """`text` with every Lean comment replaced by spaces, keeping length and newlines.

    Handles `-- line` comments and nested `/- block -/` comments (doc comments `/--` and
    `/-!` too), and skips string and character literals so a `--` inside a string is not a
    comment. An unterminated block comment blanks to the end. Positions in the result
    index the same characters as in `text`.
    """
    return scan_comments(text, keep_positions=True)[0]


def extract_proof(output: str) -> Extraction:
    """Strict proof extraction from a Solver output (method.md §4 step 4).

    The stripped output must start with a ```` ```lean4 ```` line, end with ```` ``` ````,
    hold exactly one code block and exactly one `theorem`/`lemma`/`def`. The proof is
    the text after the first `:= by` that follows that declaration keyword, with trailing
    whitespace removed (leading indentation is kept).

    Failure codes: not_a_string, no_opening_fence, no_closing_fence, multiple_code_blocks,
    declaration_count, no_assign_by, empty_proof.
    """
    if not isinstance(output, str):
        return Extraction.failure("not_a_string", f"expected text, got {type(output).__name__}")
    text = normalize_newlines(output).strip()
    first_line, _, rest = text.partition("\n")
    if first_line.rstrip() != LEAN_FENCE:
        return Extraction.failure("no_opening_fence", "output does not start with a ```lean4 line")
    if not text.endswith(FENCE) or not rest:
        return Extraction.failure("no_closing_fence", "output does not end with ```")
    if text.count(FENCE) != 2:
        return Extraction.failure("multiple_code_blocks", f"found {text.count(FENCE)} fences, expected 2")
    code = rest[: -len(FENCE)]
    blanked = blank_lean_comments(code)
    declarations = list(_SOLVER_DECLARATION.finditer(blanked))
    if len(declarations) != 1:
        return Extraction.failure(
            "declaration_count", f"found {len(declarations)} theorem/lemma/def, expected exactly 1"
        )
    assign_by = _ASSIGN_BY.search(blanked, declarations[0].end())
    if assign_by is None:
        return Extraction.failure("no_assign_by", "no `:= by` after the declaration")
    proof = code[assign_by.end() :].rstrip()
    if not blank_lean_comments(proof).strip():
        return Extraction.failure("empty_proof", "nothing but whitespace or comments after `:= by`")
    return Extraction(proof)


def extract_conjecture(output: str) -> Extraction:
    """Conjecture extraction from a Conjecturer output (method.md §4 step 2).

    Takes the last ```` ```lean4 ```` block; it must contain exactly one `:= by` and end
    with `sorry` or `:= by`. Returns the statement ending in ` := by`. Our additions,
    because the statement is later checked under the seed target's trusted header: the
    block may open with `import`/`set_option`/`open` lines (dropped, as are comments
    before the declaration), and must then hold exactly one declaration, a `theorem` or
    `lemma`.

    Failure codes: not_a_string, no_lean4_block, unterminated_block, assign_by_count,
    bad_ending, unexpected_preamble, declaration_count.
    """
    if not isinstance(output, str):
        return Extraction.failure("not_a_string", f"expected text, got {type(output).__name__}")
    text = normalize_newlines(output)
    start = text.rfind(LEAN_FENCE)
    if start < 0:
        return Extraction.failure("no_lean4_block", "no ```lean4 block in the output")
    body_start = start + len(LEAN_FENCE)
    end = text.find(FENCE, body_start)
    if end < 0:
        return Extraction.failure("unterminated_block", "the last ```lean4 block is never closed")
    code = text[body_start:end]
    blanked = blank_lean_comments(code)
    assign_bys = list(_ASSIGN_BY.finditer(blanked))
    if len(assign_bys) != 1:
        return Extraction.failure("assign_by_count", f"found {len(assign_bys)} `:= by`, expected exactly 1")
    tail = blanked[assign_bys[0].end() :].strip()
    if tail and not _SORRY_AT_END.search(tail):
        return Extraction.failure("bad_ending", "the block must end with `sorry` or `:= by`")
    head = blanked[: assign_bys[0].start()]
    declarations = list(_ANY_DECLARATION.finditer(head))
    if not declarations or not _CONJECTURE_START.match(head, declarations[-1].start()):
        return Extraction.failure("declaration_count", "the declaration ending in `:= by` is not a theorem or lemma")
    declaration = declarations[-1]
    for line in head[: declaration.start()].split("\n"):
        line = line.strip()
        if line and not _PREAMBLE_LINE.match(line):
            return Extraction.failure("unexpected_preamble", f"unexpected text before the declaration: {line[:60]!r}")
    count = len(_ANY_DECLARATION.findall(blanked))
    if count != 1:
        return Extraction.failure("declaration_count", f"found {count} declarations, expected exactly 1")
    statement = code[declaration.start() : assign_bys[0].start()].rstrip()
    return Extraction(statement + " := by")


def statement_key(statement: str) -> str:
    """Dedup key of a statement: its text with every run of whitespace collapsed to one space."""
    return " ".join(normalize_newlines(statement).split())


def dedup_conjectures(
    conjectures: Sequence[Conjecture], target_statements: Iterable[str]
) -> tuple[tuple[Conjecture, ...], tuple[Conjecture, ...]]:
    """Drop exact duplicates of a target or of an earlier conjecture (method.md §4 step 2).

    "Exact" up to whitespace (see `statement_key`). Returns (kept, dropped), both in input
    order; the first of several equal conjectures is kept.
    """
    seen = {statement_key(s) for s in target_statements}
    kept, dropped = [], []
    for conjecture in conjectures:
        key = statement_key(conjecture.statement)
        if key in seen:
            dropped.append(conjecture)
        else:
            seen.add(key)
            kept.append(conjecture)
    return tuple(kept), tuple(dropped)
