"""Syntax trees and the layout-aware parser for the tactic subset.

The subset (each one a real core Lean 4 tactic or term form):
  tactics: intro/intros [names], exact t, apply t, constructor, left, right, assumption,
    exfalso, contradiction, trivial, cases h [with | ctor names => tacs ...],
    rcases t with pat, obtain pat := t, have [h] [: A] := t, show A, `·`/`.` focus
    blocks; tactics separated by newlines at the block's column or by `;`.
  terms: names (hypotheses, And.intro, Or.inl, Or.inr, Or.elim, Iff.intro, absurd,
    False.elim, True.intro, trivial, id, ...), application, fun x (y : A) => t, ⟨t, ...⟩,
    t.1 t.2 t.mp t.mpr t.left t.right t.elim, (t : A), show A from t, by tacs.
Layout follows Lean: a block's tactics start at the column of its first tactic; a line
starting further right continues the current tactic; one starting at or left of the
block's column ends it (a `|` line may continue a `cases ... with`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

from sgs_jax.testbed.formula import Formula
from sgs_jax.testbed.lexer import LeanSyntaxError, tokenize
from sgs_jax.testbed.parser import RESERVED, TokenStream, parse_formula_tokens


# ---- terms -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Var:
    """A name: a hypothesis (optionally followed by dotted fields, `h.mp`) or a constant."""

    name: str


@dataclasses.dataclass(frozen=True)
class Field:
    term: "Term"
    field: str  # "1", "2", "mp", "left", "elim", ...


@dataclasses.dataclass(frozen=True)
class App:
    fn: "Term"
    args: tuple["Term", ...]


@dataclasses.dataclass(frozen=True)
class Fun:
    """`fun x (y : A) _ => body`; a binder is (name or None for `_`, type or None)."""

    binders: tuple[tuple[Optional[str], Optional[Formula]], ...]
    body: "Term"


@dataclasses.dataclass(frozen=True)
class Anon:
    """Anonymous constructor `⟨a, b, ...⟩`."""

    items: tuple["Term", ...]


@dataclasses.dataclass(frozen=True)
class Ascribe:
    """`(t : A)` and `show A from t`."""

    term: "Term"
    type: Formula


@dataclasses.dataclass(frozen=True)
class By:
    block: "Block"


Term = Union[Var, Field, App, Fun, Anon, Ascribe, By]


# ---- rcases patterns ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PName:
    name: Optional[str]  # None for `_`


@dataclasses.dataclass(frozen=True)
class PTuple:
    items: tuple["Pattern", ...]


@dataclasses.dataclass(frozen=True)
class PAlts:
    alts: tuple["Pattern", ...]


Pattern = Union[PName, PTuple, PAlts]


# ---- tactics -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Tactic:
    """One tactic. kind names it; the other fields are used by the kinds listed:
    names (intro, intros), term (exact, apply, rcases/obtain, have), formula (have, show),
    hyp (cases, have's new name), alts (cases ... with), pattern (rcases/obtain),
    block (focus dot). line is where it starts (for messages)."""

    kind: str
    line: int
    names: tuple[Optional[str], ...] = ()
    term: Optional[Term] = None
    formula: Optional[Formula] = None
    hyp: Optional[str] = None
    alts: Optional[tuple[tuple[str, tuple[Optional[str], ...], "Block"], ...]] = None
    pattern: Optional[Pattern] = None
    block: Optional["Block"] = None


Block = tuple[Tactic, ...]

NULLARY = frozenset("constructor left right assumption exfalso contradiction trivial".split())
# Tokens that can never start a term argument (Lean keywords and tactic names).
_NOT_AN_ARG = RESERVED - {"True", "False", "And", "Or", "Not", "Iff", "id", "absurd", "trivial", "this"}


class ProofParser:
    """Parses a proof body (the text after `:= by`) into a `Block`."""

    def __init__(self, text: str, atoms: frozenset[str]):
        self.ts = TokenStream(tokenize(text))
        self.atoms = atoms

    def parse(self) -> Block:
        block = self.block(outer_col=-1)
        tok = self.ts.raw()
        if tok.kind != "eof":
            raise LeanSyntaxError(f"unexpected {tok.text!r}", tok.line, tok.col)
        return block

    # -- layout --------------------------------------------------------------------------
    def block(self, outer_col: int) -> Block:
        ts = self.ts
        first = ts.peek()
        if first.kind == "eof":
            raise LeanSyntaxError("expected a tactic", first.line, first.col)
        if first.first_on_line and first.col <= outer_col:
            raise LeanSyntaxError("tactic block must be indented", first.line, first.col)
        col = first.col
        if col == 0:
            raise LeanSyntaxError("tactics must be indented (column 0 starts a new command)", first.line, 0)
        tactics = []
        ts.cols.append(col)
        try:
            while True:
                head = ts.raw()
                ts.i += 1  # the head token itself is never cut off by layout
                tactics.append(self.tactic(head, col))
                if ts.accept(";"):
                    continue
                nxt = ts.raw()
                if nxt.kind != "eof" and nxt.first_on_line and nxt.col == col and nxt.text != "|":
                    continue
                break
        finally:
            ts.cols.pop()
        return tuple(tactics)

    # -- tactics -------------------------------------------------------------------------
    def tactic(self, head, col: int) -> Tactic:
        ts, kind, line = self.ts, head.text, head.line
        if head.kind == "symbol" and kind in ("·", "."):
            return Tactic("focus", line, block=self.block(col))
        if head.kind != "ident":
            raise LeanSyntaxError(f"expected a tactic, found {kind!r}", head.line, head.col)
        if kind in ("intro", "intros"):
            names = []
            while ts.peek().kind == "ident" and ts.peek().text not in RESERVED:
                names.append(self.binder_name())
            return Tactic(kind, line, names=tuple(names))
        if kind in ("exact", "apply"):
            return Tactic(kind, line, term=self.term())
        if kind in NULLARY:
            return Tactic(kind, line)
        if kind == "cases":
            hyp = ts.expect_name("a hypothesis name").text
            alts = self.cases_alts(col) if ts.accept("with") else None
            return Tactic("cases", line, hyp=hyp, alts=alts)
        if kind == "rcases":
            term = self.term()
            ts.expect("with")
            return Tactic("rcases", line, term=term, pattern=self.pattern_alts())
        if kind == "obtain":
            pattern = self.pattern_alts()
            ts.expect(":=")
            return Tactic("rcases", line, term=self.term(), pattern=pattern)
        if kind == "have":
            name = "this"
            if ts.peek().kind == "ident" and not ts.at(":") and not ts.at(":="):
                name = ts.expect_name("a hypothesis name").text
            formula = self.formula() if ts.accept(":") else None
            ts.expect(":=")
            return Tactic("have", line, hyp=name, formula=formula, term=self.term())
        if kind == "show":
            return Tactic("show", line, formula=self.formula())
        raise LeanSyntaxError(f"tactic {kind!r} is not in the supported subset", head.line, head.col)

    def binder_name(self) -> Optional[str]:
        tok = self.ts.peek()
        if tok.kind == "ident" and tok.text == "_":
            self.ts.next()
            return None
        name = self.ts.expect_name("a name").text
        if name in self.atoms:
            raise LeanSyntaxError(f"name {name!r} would shadow the proposition {name!r}", tok.line, tok.col)
        return name

    def cases_alts(self, col: int):
        ts, alts = self.ts, []
        while True:
            tok = ts.raw()
            if not (tok.kind == "symbol" and tok.text == "|" and (not tok.first_on_line or tok.col >= col)):
                break
            ts.i += 1
            ctor = ts.peek()
            if ctor.kind != "ident" or ctor.text not in ("intro", "inl", "inr"):
                raise LeanSyntaxError(f"unknown constructor {ctor.text!r} in cases alternative", ctor.line, ctor.col)
            ts.next()
            names = []
            while not ts.at("=>"):
                names.append(self.binder_name())
            ts.expect("=>")
            alts.append((ctor.text, tuple(names), self.block(col)))
        if not alts:
            tok = ts.peek()
            raise LeanSyntaxError("expected '|' alternatives after 'with'", tok.line, tok.col)
        return tuple(alts)

    # -- rcases patterns -----------------------------------------------------------------
    def pattern_alts(self) -> Pattern:
        alts = [self.pattern()]
        while self.ts.accept("|"):
            alts.append(self.pattern())
        return alts[0] if len(alts) == 1 else PAlts(tuple(alts))

    def pattern(self) -> Pattern:
        ts = self.ts
        if ts.accept("⟨"):
            items = []
            if not ts.at("⟩"):
                items.append(self.pattern_alts())
                while ts.accept(","):
                    items.append(self.pattern_alts())
            ts.expect("⟩")
            return PTuple(tuple(items))
        if ts.accept("("):
            inner = self.pattern_alts()
            ts.expect(")")
            return inner
        return PName(self.binder_name())

    # -- terms and formulas --------------------------------------------------------------
    def formula(self) -> Formula:
        return parse_formula_tokens(self.ts, self.atoms)

    def term(self) -> Term:
        ts = self.ts
        if ts.accept("fun"):
            binders = []
            while not ts.at("=>"):
                if ts.accept("("):
                    names = [self.binder_name()]
                    while not ts.at(":"):
                        names.append(self.binder_name())
                    ts.expect(":")
                    ty = self.formula()
                    ts.expect(")")
                    binders += [(n, ty) for n in names]
                else:
                    binders.append((self.binder_name(), None))
            if not binders:
                tok = ts.peek()
                raise LeanSyntaxError("'fun' needs a binder", tok.line, tok.col)
            ts.expect("=>")
            return Fun(tuple(binders), self.term())
        if ts.accept("show"):
            ty = self.formula()
            ts.expect("from")
            return Ascribe(self.term(), ty)
        if ts.at("by"):
            tok = ts.next()
            return By(self.block(ts.cols[-1] if ts.cols else tok.col))
        head = self.argument()
        args = []
        while self.starts_argument():
            args.append(self.argument())
        return App(head, tuple(args)) if args else head

    def starts_argument(self) -> bool:
        tok = self.ts.peek()
        if tok.kind == "ident":
            return tok.text not in _NOT_AN_ARG
        return tok.kind == "symbol" and tok.text in ("(", "⟨")

    def argument(self) -> Term:
        ts = self.ts
        tok = ts.next()
        if tok.kind == "ident" and tok.text not in _NOT_AN_ARG and tok.text != "_":
            term: Term = Var(tok.text)
        elif tok.kind == "symbol" and tok.text == "(":
            term = self.term()
            if ts.accept(":"):
                term = Ascribe(term, self.formula())
            ts.expect(")")
        elif tok.kind == "symbol" and tok.text == "⟨":
            items = []
            if not ts.at("⟩"):
                items.append(self.term())
                while ts.accept(","):
                    items.append(self.term())
            ts.expect("⟩")
            term = Anon(tuple(items))
        else:
            raise LeanSyntaxError(f"expected a term, found {tok.text or 'end of input'!r}", tok.line, tok.col)
        while ts.peek().kind == "field":
            term = Field(term, ts.next().text)
        return term


def parse_proof(text: str, atoms: frozenset[str]) -> Block:
    """Parse a proof body; `atoms` are the statement's propositions (for `have`/`show` types).

    Raises LeanSyntaxError with a position for anything outside the subset."""
    return ProofParser(text, atoms).parse()
