"""A small Lean 4 lexer: enough structure to find binders, premises and the conclusion.

It does not parse Lean; it only splits text into tokens that carry their bracket depth
and position, after removing comments (nested `/- -/` and `--`). Strings, character
literals and `«guillemet»` names become single atoms, so brackets or connectives inside
them are never mistaken for structure.
"""

from __future__ import annotations

import dataclasses

from sgs_jax.verify.rules import scan_comments

OPENERS = {"(": ")", "[": "]", "{": "}", "⦃": "⦄", "⟨": "⟩", "⌊": "⌋", "⌈": "⌉",
           "⟪": "⟫", "⟦": "⟧", "⁅": "⁆", "‹": "›"}
CLOSERS = {close: open_ for open_, close in OPENERS.items()}

# Longest first, so that `<->` wins over `->` and `:=` over `:`.
MULTI_CHAR_SYMBOLS = ("<->", "∀ᶠ", "∃ᶠ", "∃!", ":=", "->", "=>", "\\/", "/\\", "..")

# Lean's own "letter-like" rule: Greek except λ Π Σ (which are notation), the
# letter-like block (ℝ ℕ ℤ ...), and sub/superscript letters used in names.
_NOT_LETTERS = frozenset("λΠΣ")


class LeanSyntaxError(ValueError):
    """The text is not lexically well-formed Lean (unbalanced bracket, open comment...)."""


@dataclasses.dataclass(frozen=True)
class Token:
    """One lexical token: its text, [start, end) offsets into the source, and depth.

    `depth` is the number of brackets open before the token (an opening bracket has the
    depth outside it, its closing partner the same depth). `line_start` is True when the
    token is the first on its line; `column` is its column in characters.
    """

    text: str
    start: int
    end: int
    depth: int
    line_start: bool
    column: int


def _is_ident_start(ch: str) -> bool:
    if ch == "_":
        return True
    if ch in _NOT_LETTERS:
        return False
    return ch.isalpha() or "\u2100" <= ch <= "\u214f" or "\u1d00" <= ch <= "\u1dbf"


def _is_ident_rest(ch: str) -> bool:
    return (_is_ident_start(ch) or ch.isdigit() or ch in "'!?"
            or "\u2080" <= ch <= "\u209c" or ch in "ᵢᵣᵤᵥⱼ")


def strip_comments(text: str) -> str:
    """`text` with Lean comments removed (newlines kept, strings untouched), by the
    verifier's own comment scanner so that both read Lean the same way.

    Raises LeanSyntaxError for an unterminated block comment or string.
    """
    stripped, unterminated = scan_comments(text)
    if unterminated:
        raise LeanSyntaxError("unterminated block comment or string literal")
    return stripped


def _end_of_string(text: str, i: int) -> int:
    """Offset just past the string literal that starts at text[i] == '"'."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == '"':
            return j + 1
        else:
            j += 1
    raise LeanSyntaxError(f"unterminated string literal at offset {i}")


def _end_of_atom(text: str, i: int) -> int:
    """Offset just past the token starting at text[i] (text has no comments)."""
    ch = text[i]
    if ch == '"':
        return _end_of_string(text, i)
    if ch == "«":
        j = text.find("»", i)
        if j < 0:
            raise LeanSyntaxError(f"unterminated «name» at offset {i}")
        return j + 1
    if ch == "'" and i + 2 < len(text):
        # A char literal 'a' or '\n'; a prime after a name is part of that name instead.
        j = i + 3 if text[i + 1] == "\\" else i + 2
        if j < len(text) and text[j] == "'":
            return j + 1
    if _is_ident_start(ch):
        j = i + 1
        while j < len(text):
            if _is_ident_rest(text[j]):
                j += 1
            elif text[j] == "." and j + 1 < len(text) and _is_ident_start(text[j + 1]):
                j += 1  # dotted name such as Real.sqrt
            else:
                break
        return j
    if ch.isdigit():
        j = i + 1
        while j < len(text) and (text[j].isalnum() or text[j] == "_"
                                 or (text[j] == "." and j + 1 < len(text) and text[j + 1].isdigit())):
            j += 1
        return j
    for symbol in MULTI_CHAR_SYMBOLS:
        if text.startswith(symbol, i):
            return i + len(symbol)
    return i + 1


def tokenize(text: str) -> list[Token]:
    """Split comment-free Lean text into tokens with bracket depth.

    Raises LeanSyntaxError on an unbalanced or mismatched bracket.
    """
    tokens: list[Token] = []
    stack: list[tuple[str, int]] = []
    i, n = 0, len(text)
    line_begin, fresh_line = 0, True
    while i < n:
        ch = text[i]
        if ch == "\n":
            i, line_begin, fresh_line = i + 1, i + 1, True
            continue
        if ch.isspace():
            i += 1
            continue
        end = _end_of_atom(text, i)
        piece = text[i:end]
        depth = len(stack)
        if piece in CLOSERS:
            if not stack or stack[-1][0] != CLOSERS[piece]:
                raise LeanSyntaxError(f"unbalanced {piece!r} at offset {i}")
            stack.pop()
            depth = len(stack)
        tokens.append(Token(piece, i, end, depth, fresh_line, i - line_begin))
        if piece in OPENERS:
            stack.append((piece, i))
        fresh_line = False
        i = end
    if stack:
        bracket, where = stack[-1]
        raise LeanSyntaxError(f"unclosed {bracket!r} at offset {where}")
    return tokens
