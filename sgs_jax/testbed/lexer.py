"""Tokens of the Lean 4 subset the testbed reads, with line/column for layout and errors.

Comments (`--` to end of line, nested `/- -/`) are skipped as Lean skips them; anything
the subset does not know (other symbols, numbers outside `.1`/`.2`, doc comments) is a
`LeanSyntaxError` that names its position.
"""

from __future__ import annotations

import dataclasses

# Longest first, so `<->` wins over `<`, `:=` over `:`.
SYMBOLS = (
    "<->", "<;>", ":=", "=>", "->", "/\\", "\\/",
    "(", ")", "⟨", "⟩", ",", ":", ";", "|", "·", ".", "¬", "∧", "∨", "→", "↔",
)
ASCII_ALIASES = {"->": "→", "<->": "↔", "/\\": "∧", "\\/": "∨"}
_GREEK_EXCLUDED = set("λΠΣ")  # Lean reserves these
_SUBSCRIPTS = set("₀₁₂₃₄₅₆₇₈₉ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼ")


class LeanSyntaxError(ValueError):
    """Input outside the supported Lean subset; `line`/`col` are 1-based/0-based."""

    def __init__(self, message: str, line: int = 0, col: int = 0):
        super().__init__(f"{message} (line {line}, column {col})" if line else message)
        self.line, self.col = line, col


@dataclasses.dataclass(frozen=True)
class Token:
    """kind: 'ident', 'field' (text after a `.` projection), 'symbol' or 'eof'.

    line is 1-based, col 0-based (Lean's convention); first_on_line marks the first token
    of its line, which is what Lean's layout rules look at; ws_before: whitespace or a
    comment precedes it (a `.1` projection must follow without any).
    """

    kind: str
    text: str
    line: int
    col: int
    first_on_line: bool
    ws_before: bool

    def where(self) -> str:
        return f"line {self.line}, column {self.col}"


def _ident_start(ch: str) -> bool:
    return ch.isascii() and (ch.isalpha() or ch == "_") or ("α" <= ch <= "ω" or "Α" <= ch <= "Ω") and ch not in _GREEK_EXCLUDED


def _ident_rest(ch: str) -> bool:
    return _ident_start(ch) or (ch.isascii() and ch.isdigit()) or ch in "'!?" or ch in _SUBSCRIPTS


def tokenize(text: str) -> list[Token]:
    """Split `text` into tokens; the list ends with one 'eof' token."""
    tokens: list[Token] = []
    i, line, line_start, n = 0, 1, 0, len(text)
    first_on_line, ws_before = True, True

    def emit(kind: str, value: str, start: int) -> None:
        nonlocal first_on_line, ws_before
        tokens.append(Token(kind, value, line, start - line_start, first_on_line, ws_before))
        first_on_line, ws_before = False, False

    while i < n:
        ch = text[i]
        if ch == "\n":
            i, line, line_start, first_on_line, ws_before = i + 1, line + 1, i + 1, True, True
            continue
        if ch in " \t\r":
            if ch == "\t":  # Lean rejects tabs in layout-sensitive positions; so do we
                raise LeanSyntaxError("tabs are not allowed", line, i - line_start)
            i, ws_before = i + 1, True
            continue
        if text.startswith("--", i):
            while i < n and text[i] != "\n":
                i += 1
            ws_before = True
            continue
        if text.startswith("/-", i):
            if text.startswith("/--", i) or text.startswith("/-!", i):
                raise LeanSyntaxError("doc comments are not allowed in a proof", line, i - line_start)
            i, depth = i + 2, 1
            while depth:
                if i >= n:
                    raise LeanSyntaxError("unterminated comment", line, i - line_start)
                if text.startswith("/-", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("-/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        line, line_start, first_on_line = line + 1, i + 1, True
                    i += 1
            ws_before = True
            continue
        if _ident_start(ch):
            start = i
            while i < n and _ident_rest(text[i]):
                i += 1
            # Dotted names (`And.intro`, `h.mp`) are one identifier in Lean.
            while i + 1 < n and text[i] == "." and _ident_start(text[i + 1]):
                i += 1
                while i < n and _ident_rest(text[i]):
                    i += 1
            emit("ident", text[start:i], start)
            i = _numeric_fields(text, i, emit)
            continue
        if ch == "." and tokens and not ws_before and tokens[-1].text in (")", "⟩") and i + 1 < n:
            # `(h x).1`, `(h x).mp`: a projection right after a closing bracket.
            start = i
            i += 1
            while i < n and (_ident_rest(text[i])):
                i += 1
            if i == start + 1:
                raise LeanSyntaxError("expected a field name after '.'", line, start - line_start)
            emit("field", text[start + 1 : i], start)
            continue
        for sym in SYMBOLS:
            if text.startswith(sym, i):
                emit("symbol", ASCII_ALIASES.get(sym, sym), i)
                i += len(sym)
                break
        else:
            raise LeanSyntaxError(f"unexpected character {ch!r}", line, i - line_start)
    tokens.append(Token("eof", "", line, i - line_start, True, True))
    return tokens


def _numeric_fields(text: str, i: int, emit) -> int:
    """Emit each `.digits` right after an identifier (`h.1.2`) as a projection; return
    the index after them."""
    while i + 1 < len(text) and text[i] == "." and text[i + 1].isascii() and text[i + 1].isdigit():
        j = i + 1
        while j < len(text) and text[j].isascii() and text[j].isdigit():
            j += 1
        emit("field", text[i + 1 : j], i)
        i = j
    return i
