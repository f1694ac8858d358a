"""Parse formulas and `theorem` statements of the testbed's Lean subset.

A statement is `theorem NAME (p q : Prop) (h₀ : A) ... : C := by`: atoms are bound as
`Prop` before use, hypotheses are explicit `(name : formula)` binders, and the
conclusion follows the last binder. Anything else raises `LeanSyntaxError` with a
position, so a bad statement never reaches the checker.
"""

from __future__ import annotations

import dataclasses

from sgs_jax.testbed.formula import FALSE, TRUE, And, Atom, Formula, Iff, Imp, Not, Or, show
from sgs_jax.testbed.lexer import LeanSyntaxError, Token, tokenize

# Words that cannot name a binder: Lean keywords, tactic names (Lean turns them into
# tokens) and the constants the term language refers to.
RESERVED = frozenset(
    "theorem lemma def example axiom by fun λ have show from at with let in if then else do "
    "match return sorry admit Prop Type Sort True False And Or Not Iff id absurd trivial "
    "intro intros exact apply constructor left right cases rcases obtain assumption exfalso "
    "contradiction this rfl decide simp calc open import section namespace end".split()
)

# Binary connectives: symbol -> (constructor, precedence, right operand's minimum precedence).
_INFIX = {"∧": (And, 35, 35), "∨": (Or, 30, 30), "→": (Imp, 25, 25), "↔": (Iff, 20, 21)}


@dataclasses.dataclass(frozen=True)
class Statement:
    """A parsed theorem: name, atoms (in binder order), named hypotheses, conclusion."""

    name: str
    atoms: tuple[str, ...]
    hypotheses: tuple[tuple[str, Formula], ...]
    conclusion: Formula

    def lean(self) -> str:
        """The statement as Lean source, ending in `:= by` (one line)."""
        parts = [f"theorem {self.name}"]
        if self.atoms:
            parts.append(f"({' '.join(self.atoms)} : Prop)")
        parts += [f"({name} : {show(f)})" for name, f in self.hypotheses]
        return " ".join(parts) + f" : {show(self.conclusion)} := by"


class TokenStream:
    """Cursor over tokens with Lean's layout rule: inside a tactic block that starts at
    column c (`cols[-1]`), a token that begins a line at column <= c ends the current
    tactic, so `peek` reports it as end of input."""

    def __init__(self, tokens: list[Token]):
        self.tokens, self.i = tokens, 0
        self.cols: list[int] = []

    def stops(self, tok: Token) -> bool:
        return bool(self.cols) and tok.first_on_line and tok.col <= self.cols[-1]

    def peek(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "eof" and self.stops(tok):
            return Token("eof", "", tok.line, tok.col, tok.first_on_line, tok.ws_before)
        return tok

    def raw(self) -> Token:
        return self.tokens[self.i]

    def next(self) -> Token:
        tok = self.peek()
        if tok.kind == "eof":
            raise LeanSyntaxError("unexpected end of input", tok.line, tok.col)
        self.i += 1
        return tok

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok.kind in ("symbol", "ident") and tok.text == text

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.i += 1
            return True
        return False

    def expect(self, text: str) -> Token:
        tok = self.peek()
        if not self.at(text):
            raise LeanSyntaxError(f"expected {text!r}, found {tok.text or 'end of input'!r}", tok.line, tok.col)
        self.i += 1
        return tok

    def expect_name(self, what: str) -> Token:
        tok = self.peek()
        if tok.kind != "ident" or tok.text in RESERVED or "." in tok.text or tok.text == "_":
            raise LeanSyntaxError(f"expected {what}, found {tok.text or 'end of input'!r}", tok.line, tok.col)
        self.i += 1
        return tok


def parse_formula_tokens(ts: TokenStream, atoms: frozenset[str] | None, min_prec: int = 0) -> Formula:
    """Pratt parser over `ts` following Lean's precedences; `atoms` limits the variable
    names allowed (None: any non-reserved name)."""
    tok = ts.next()
    if tok.text == "¬" and tok.kind == "symbol":
        left: Formula = Not(parse_formula_tokens(ts, atoms, 40))
    elif tok.text == "(" and tok.kind == "symbol":
        left = parse_formula_tokens(ts, atoms, 0)
        ts.expect(")")
    elif tok.kind == "ident" and tok.text == "True":
        left = TRUE
    elif tok.kind == "ident" and tok.text == "False":
        left = FALSE
    elif tok.kind == "ident" and tok.text not in RESERVED and "." not in tok.text:
        if atoms is not None and tok.text not in atoms:
            raise LeanSyntaxError(f"unknown proposition {tok.text!r} (not bound as Prop)", tok.line, tok.col)
        left = Atom(tok.text)
    else:
        raise LeanSyntaxError(f"expected a proposition, found {tok.text or 'end of input'!r}", tok.line, tok.col)
    bare_iff = False  # `left` is an unparenthesised `_ ↔ _` built by this loop
    while True:
        tok = ts.peek()
        spec = _INFIX.get(tok.text) if tok.kind == "symbol" else None
        if spec is None or spec[1] < min_prec:
            return left
        ctor, prec, right_min = spec
        if ctor is Iff and bare_iff:
            # Lean's `↔` is `infix:20`: `a ↔ b ↔ c` does not parse.
            raise LeanSyntaxError("'↔' is not associative: add parentheses", tok.line, tok.col)
        ts.next()
        left = ctor(left, parse_formula_tokens(ts, atoms, right_min))
        bare_iff = ctor is Iff


def parse_formula(text: str, atoms: frozenset[str] | None = None) -> Formula:
    """Parse a whole string as one formula."""
    ts = TokenStream(tokenize(text))
    f = parse_formula_tokens(ts, atoms)
    tok = ts.peek()
    if tok.kind != "eof":
        raise LeanSyntaxError(f"unexpected {tok.text!r} after the formula", tok.line, tok.col)
    return f


def parse_statement(text: str) -> Statement:
    """Parse `theorem NAME binders : conclusion := by` (nothing may follow `by`)."""
    ts = TokenStream(tokenize(text))
    head = ts.next()
    if head.text != "theorem":
        hint = " (core Lean has no `lemma`)" if head.text == "lemma" else ""
        raise LeanSyntaxError(f"a statement must start with 'theorem'{hint}", head.line, head.col)
    name = ts.peek()
    if name.kind != "ident" or name.text in RESERVED or name.text.split(".")[-1] in RESERVED:
        raise LeanSyntaxError(f"bad theorem name {name.text!r}", name.line, name.col)
    ts.next()
    atoms: list[str] = []
    hyps: list[tuple[str, Formula]] = []
    seen: set[str] = set()
    while ts.accept("("):
        names = [ts.expect_name("a binder name")]
        while ts.peek().kind == "ident" and not ts.at(":"):
            names.append(ts.expect_name("a binder name"))
        ts.expect(":")
        for tok in names:
            if tok.text in seen:
                raise LeanSyntaxError(f"duplicate binder name {tok.text!r}", tok.line, tok.col)
            seen.add(tok.text)
        if ts.accept("Prop"):
            atoms += [t.text for t in names]
        else:
            f = parse_formula_tokens(ts, frozenset(atoms))
            hyps += [(t.text, f) for t in names]
        ts.expect(")")
    ts.expect(":")
    conclusion = parse_formula_tokens(ts, frozenset(atoms))
    ts.expect(":=")
    ts.expect("by")
    tok = ts.peek()
    if tok.kind != "eof":
        raise LeanSyntaxError(f"unexpected {tok.text!r} after ':= by'", tok.line, tok.col)
    return Statement(name.text, tuple(atoms), tuple(hyps), conclusion)
