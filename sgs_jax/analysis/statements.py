"""Shape of a Lean 4 theorem statement: binders, premises, conclusion, disjunctive clauses.

Pure functions, no Lean. The conclusion is what remains of the statement's type after
peeling, repeatedly: outer parentheses, leading `let`/`have` bindings, leading `∀`
binders (and `∀ᶠ`, `Π`), and the premises of top-level implications `P → Q` (`→` is
right-associative, so the conclusion is the last part).

Precedence follows Lean's: `↔` (20) binds looser than `→` (25), so `A → B ↔ C` is an
iff and is kept whole as the conclusion; `∨` (30) binds tighter than `→`, so in
`A ∨ B → C` the disjunction is a premise. Binder notations (`∀ ∃ fun λ let if match`)
extend as far right as possible, so a connective after one belongs to its body; big
operators (`∑ ∏ ⋃ ⋂ ⨆ ⨅`) bind tightly and are ordinary terms here.

Disjunctive conclusion: after outer parentheses and leading `∀`/`∃`/`∃!` binders are
peeled, the conclusion's top-level connective is `∨`. `∃` is looked through because
it distributes over `∨` (`∃ x, P ∨ Q` is `(∃ x, P) ∨ (∃ x, Q)`); `∀` because its
binders are premises. A conclusion whose top connective is `↔`, `∧`, `¬`, `=`, ... is
not disjunctive, whatever its sides hold. Clauses are the disjuncts, flattened through
parentheses and quantifiers (`(A ∨ B) ∨ ∃ x, C ∨ D` has 4). `Or A B` written as a
function application is not recognised.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence

from sgs_jax.analysis.lean_tokens import OPENERS, LeanSyntaxError, Token, strip_comments, tokenize

DECLARATION_KEYWORDS = frozenset({"theorem", "lemma", "example"})
ARROWS = frozenset({"→", "->"})
IFFS = frozenset({"↔", "<->"})
ORS = frozenset({"∨", "\\/"})
UNIVERSAL_BINDERS = frozenset({"∀", "forall", "∀ᶠ", "Π"})
EXISTENTIAL_BINDERS = frozenset({"∃", "exists", "∃!", "∃ᶠ"})
LOCAL_BINDINGS = frozenset({"let", "have"})
# Notations whose body runs to the end of the enclosing expression.
OPEN_ENDED = (UNIVERSAL_BINDERS | EXISTENTIAL_BINDERS | LOCAL_BINDINGS
              | frozenset({"fun", "λ", "Σ", "if", "match", "show"}))


class StatementParseError(ValueError):
    """A statement whose binders, premises or conclusion cannot be found."""


@dataclasses.dataclass(frozen=True)
class StatementShape:
    """The parts of one statement, each as comment-free text with whitespace collapsed.

    binders: the bracketed binders before the signature colon, e.g. `(x : ℝ)`.
    premises: `let`/`have` bindings, `∀` binder groups and implication premises found
      in the type, in order.
    conclusion: the claim left after all premises are peeled.
    clauses: the top-level disjuncts of the conclusion (one element when it is not
      a disjunction).
    contains_disjunction: the conclusion holds a `∨` token anywhere (nested too).
    """

    binders: tuple[str, ...]
    premises: tuple[str, ...]
    conclusion: str
    clauses: tuple[str, ...]
    contains_disjunction: bool

    @property
    def is_disjunctive(self) -> bool:
        return len(self.clauses) > 1

    @property
    def conclusion_length(self) -> int:
        """Length of the conclusion in characters (Unicode code points)."""
        return len(self.conclusion)


@dataclasses.dataclass(frozen=True)
class StatementStats:
    """Aggregate shape of a set of statements (failures excluded from the means).

    disjunctive_fraction: share of parsed statements with a disjunctive conclusion.
    any_disjunction_fraction: share whose conclusion holds `∨` anywhere (the looser
      measure "has a disjunction").
    mean_conclusion_length: characters. mean_clauses: disjuncts per conclusion.
    failures: (index, reason) of statements that did not parse.
    """

    count: int
    parsed: int
    disjunctive_fraction: float
    any_disjunction_fraction: float
    mean_conclusion_length: float
    mean_clauses: float
    failures: tuple[tuple[int, str], ...]


class _Expr:
    """A slice of the token list that forms one expression, with its source text."""

    def __init__(self, text: str, tokens: Sequence[Token]):
        self.source = text
        self.tokens = tokens

    def slice(self, lo: int, hi: int) -> "_Expr":
        return _Expr(self.source, self.tokens[lo:hi])

    def render(self) -> str:
        if not self.tokens:
            return ""
        return " ".join(self.source[self.tokens[0].start:self.tokens[-1].end].split())

    def base_depth(self) -> int:
        return self.tokens[0].depth

    def strip_parens(self) -> "_Expr":
        """Remove parentheses that wrap the whole expression: `((P))` -> `P`."""
        expr = self
        while len(expr.tokens) >= 2 and expr.tokens[0].text == "(" and expr.tokens[-1].text == ")":
            inner = expr.slice(1, len(expr.tokens) - 1)
            depth = expr.base_depth()
            # The first `(` must close only at the very end, not e.g. `(a) ∨ (b)`.
            if not inner.tokens or any(t.depth == depth for t in inner.tokens):
                break
            expr = inner
        return expr

    def top_level_split(self, separators: frozenset[str]) -> list["_Expr"]:
        """Split at top-level separators, stopping at an open-ended notation's body."""
        depth = self.base_depth()
        parts, lo = [], 0
        for i, tok in enumerate(self.tokens):
            if tok.depth != depth:
                continue
            if tok.text in OPEN_ENDED:
                break  # the rest is that notation's body
            if tok.text in separators:
                parts.append(self.slice(lo, i))
                lo = i + 1
        parts.append(self.slice(lo, len(self.tokens)))
        if any(not p.tokens for p in parts):
            raise StatementParseError(f"empty operand around {sorted(separators)[0]!r} in {self.render()!r}")
        return parts

    def find_top(self, texts: frozenset[str]) -> int:
        """Index of the first top-level token in `texts`, or -1."""
        depth = self.base_depth()
        for i in range(len(self.tokens)):
            if self.tokens[i].depth == depth and self.tokens[i].text in texts:
                return i
        return -1


def _end_of_local_binding(expr: _Expr) -> int:
    """Index of the first body token after a leading `let x := v` (a `;` or a new line
    at or left of the `let` keyword's column ends the value)."""
    head, depth = expr.tokens[0], expr.base_depth()
    for i in range(1, len(expr.tokens)):
        tok = expr.tokens[i]
        if tok.depth != depth:
            continue
        if tok.text == ";":
            return i
        if tok.line_start and tok.column <= head.column:
            return i
    raise StatementParseError(f"{head.text!r} binding without a body: {expr.render()!r}")


def _peel_binder(expr: _Expr) -> int:
    """Index of the comma that ends a leading binder such as `∀ x ∈ s,`."""
    comma = expr.find_top(frozenset({","}))
    if comma < 0:
        raise StatementParseError(f"binder without a comma: {expr.render()!r}")
    return comma


def _split_type(expr: _Expr) -> tuple[list[str], _Expr]:
    """Peel premises off a statement's type; returns (premises, conclusion expr)."""
    premises: list[str] = []
    while True:
        expr = expr.strip_parens()
        if not expr.tokens:
            raise StatementParseError("empty proposition")
        head = expr.tokens[0].text
        if head in LOCAL_BINDINGS:
            cut = _end_of_local_binding(expr)
            premises.append(expr.slice(0, cut).render())
            expr = expr.slice(cut + (expr.tokens[cut].text == ";"), len(expr.tokens))
            continue
        if head in UNIVERSAL_BINDERS:
            comma = _peel_binder(expr)
            premises.append(expr.slice(0, comma).render())
            expr = expr.slice(comma + 1, len(expr.tokens))
            continue
        if len(expr.top_level_split(IFFS)) > 1:
            return premises, expr
        parts = expr.top_level_split(ARROWS)
        if len(parts) == 1:
            return premises, expr
        premises.extend(p.render() for p in parts[:-1])
        expr = parts[-1]


def _clauses(expr: _Expr) -> list[_Expr]:
    """Flattened top-level disjuncts, looking through parentheses and quantifiers."""
    expr = expr.strip_parens()
    while expr.tokens and expr.tokens[0].text in UNIVERSAL_BINDERS | EXISTENTIAL_BINDERS:
        expr = expr.slice(_peel_binder(expr) + 1, len(expr.tokens)).strip_parens()
    if not expr.tokens:
        raise StatementParseError("empty clause")
    if len(expr.top_level_split(IFFS | ARROWS)) > 1:
        return [expr]  # `∃ x, P → Q ∨ R` is an implication: `→` binds looser than `∨`
    parts = expr.top_level_split(ORS)
    if len(parts) == 1:
        return [expr]
    return [clause for part in parts for clause in _clauses(part)]


def _signature(tokens: list[Token]) -> tuple[list[Token], list[Token]]:
    """Split a declaration's tokens into (binder tokens, type tokens).

    The type runs from the signature colon to the `:=` that starts the proof (one not
    owned by a `let`/`have` inside the type), or to the end when there is no proof.
    """
    keyword = next((i for i, t in enumerate(tokens) if t.depth == 0 and t.text in DECLARATION_KEYWORDS), -1)
    if keyword < 0:
        return [], tokens  # a bare proposition
    start = keyword + 1 + (tokens[keyword].text != "example")  # skip the name
    colon = next((i for i in range(start, len(tokens)) if tokens[i].depth == 0 and tokens[i].text == ":"), -1)
    if colon < 0:
        raise StatementParseError("no ':' between the declaration's binders and its type")
    pending_bindings, end = 0, len(tokens)
    for i in range(colon + 1, len(tokens)):
        if tokens[i].depth != 0:
            continue  # e.g. a named argument `(x := 1)`
        if tokens[i].text in LOCAL_BINDINGS:
            pending_bindings += 1
        elif tokens[i].text == ":=":
            if pending_bindings == 0:
                end = i
                break
            pending_bindings -= 1
    return tokens[start:colon], tokens[colon + 1:end]


def _group_binders(text: str, tokens: list[Token]) -> tuple[str, ...]:
    """Each depth-0 bracket group (or stray token) before the colon, as text."""
    groups, lo = [], 0
    for i, tok in enumerate(tokens):
        if tok.depth == 0 and tok.text not in OPENERS:  # a closer, or a stray token
            groups.append(_Expr(text, tokens[lo:i + 1]).render())
            lo = i + 1
    return tuple(groups)


def parse_statement(theorem: str) -> StatementShape:
    """Split a Lean 4 statement (`theorem name binders : type := by`, a `lemma`, an
    `example`, or a bare proposition) into binders, premises, conclusion and clauses.

    Raises StatementParseError (a ValueError) with the reason when it cannot.
    """
    if not isinstance(theorem, str):
        raise StatementParseError(f"expected a string, got {type(theorem).__name__}")
    try:
        text = strip_comments(theorem)
        tokens = tokenize(text)
    except LeanSyntaxError as err:
        raise StatementParseError(str(err)) from err
    if not tokens:
        raise StatementParseError("empty statement")
    binder_tokens, type_tokens = _signature(tokens)
    if not type_tokens:
        raise StatementParseError("the statement has no type after ':'")
    premises, concl = _split_type(_Expr(text, type_tokens))
    clauses = _clauses(concl)
    return StatementShape(
        binders=_group_binders(text, binder_tokens),
        premises=tuple(premises),
        conclusion=concl.render(),
        clauses=tuple(c.render() for c in clauses),
        contains_disjunction=any(t.text in ORS for t in concl.tokens),
    )


def try_parse_statement(theorem: str) -> StatementShape | str:
    """Like parse_statement, but returns the failure reason as a string instead of
    raising: for hot paths that analyse model output."""
    try:
        return parse_statement(theorem)
    except StatementParseError as err:
        return str(err)


def conclusion(theorem: str) -> str:
    """The conclusion text of a Lean statement (whitespace collapsed, comments removed)."""
    return parse_statement(theorem).conclusion


def is_disjunctive(theorem: str) -> bool:
    """True when the statement's conclusion is a disjunction (see the module docstring)."""
    return parse_statement(theorem).is_disjunctive


def clause_count(theorem: str) -> int:
    """Number of top-level disjuncts in the conclusion (1 when it is not a disjunction)."""
    return len(parse_statement(theorem).clauses)


def conclusion_length(theorem: str) -> int:
    """Length of the conclusion in characters after whitespace is collapsed."""
    return parse_statement(theorem).conclusion_length


def summarize_statements(theorems: Iterable[str]) -> StatementStats:
    """Disjunctive fraction, mean conclusion length and clause count over statements.

    Statements that fail to parse are listed in `failures` and left out of the means;
    the means are NaN when nothing parsed.
    """
    shapes, failures, count = [], [], 0
    for index, theorem in enumerate(theorems):
        count += 1
        result = try_parse_statement(theorem)
        if isinstance(result, str):
            failures.append((index, result))
        else:
            shapes.append(result)

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else float("nan")

    return StatementStats(
        count=count,
        parsed=len(shapes),
        disjunctive_fraction=mean([float(s.is_disjunctive) for s in shapes]),
        any_disjunction_fraction=mean([float(s.contains_disjunction) for s in shapes]),
        mean_conclusion_length=mean([float(s.conclusion_length) for s in shapes]),
        mean_clauses=mean([float(len(s.clauses)) for s in shapes]),
        failures=tuple(failures),
    )
