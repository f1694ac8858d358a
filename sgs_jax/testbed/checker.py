"""The proof checker: runs a tactic script over a goal stack, as Lean would.

`check_proof(statement_text, proof_text)` parses the trusted statement and the proof
body, runs every tactic and accepts only if no step fails and no goal is left. Each
tactic is modelled conservatively: where Lean's behaviour in a corner is not certain the
step is rejected, so acceptance here means acceptance by core Lean 4. Every step is a
rule of intuitionistic natural deduction, which is what makes the checker sound.
"""

from __future__ import annotations

import dataclasses

from sgs_jax.testbed.elaborate import Context, Elaborator, Hyp, ProofError
from sgs_jax.testbed.formula import FALSE, And, Bot, Formula, Iff, Imp, Not, Or, Top, defeq, show
from sgs_jax.testbed.lexer import LeanSyntaxError
from sgs_jax.testbed.parser import Statement, parse_statement
from sgs_jax.testbed.proof_syntax import Block, PAlts, PName, PTuple, Pattern, Tactic, Var, parse_proof

MAX_PROOF_CHARS = 20_000  # longer bodies are rejected before parsing


@dataclasses.dataclass(frozen=True)
class Goal:
    hyps: Context
    target: Formula

    def describe(self) -> str:
        names = ", ".join(f"{h.name or '✝'} : {show(h.type)}" for h in self.hyps)
        return f"[{names}] ⊢ {show(self.target)}"


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """ok: the proof is accepted. stage: 'statement', 'syntax' or 'proof' for failures.
    reason: why not ("" when ok)."""

    ok: bool
    stage: str = ""
    reason: str = ""


def initial_goal(statement: Statement) -> Goal:
    return Goal(tuple(Hyp(name, f) for name, f in statement.hypotheses), statement.conclusion)


def check_proof(statement_text: str, proof_text: str) -> CheckResult:
    """Check `proof_text` (the tactic block after `:= by`) against the statement.

    Never raises: malformed input gives a failed `CheckResult` with the reason."""
    try:
        statement = parse_statement(statement_text)
    except LeanSyntaxError as err:
        return CheckResult(False, "statement", f"statement: {err}")
    except RecursionError:
        return CheckResult(False, "statement", "statement: nesting too deep")
    return check_parsed(statement, proof_text)


def check_parsed(statement: Statement, proof_text: str) -> CheckResult:
    """As `check_proof`, for an already parsed statement."""
    if len(proof_text) > MAX_PROOF_CHARS:
        return CheckResult(False, "syntax", f"proof longer than {MAX_PROOF_CHARS} characters")
    try:
        block = parse_proof(proof_text, frozenset(statement.atoms))
    except LeanSyntaxError as err:
        return CheckResult(False, "syntax", f"syntax: {err}")
    except RecursionError:
        return CheckResult(False, "syntax", "syntax: nesting too deep")
    try:
        close_goal(initial_goal(statement), block)
    except ProofError as err:
        return CheckResult(False, "proof", str(err))
    except RecursionError:
        return CheckResult(False, "proof", "proof: nesting too deep")
    return CheckResult(True)


def close_goal(goal: Goal, block: Block) -> None:
    """Run `block` on one goal; it must leave no goal (`by`, `·` and `cases` alternatives)."""
    left = run_block([goal], block)
    if left:
        raise ProofError(f"unsolved goals: {left[0].describe()}" + (f" (+{len(left) - 1} more)" if len(left) > 1 else ""))


def run_block(goals: list[Goal], block: Block) -> list[Goal]:
    for tactic in block:
        if not goals:
            raise ProofError(f"line {tactic.line}: no goals to be proved ({tactic.kind})")
        try:
            goals = run_tactic(goals[0], tactic) + goals[1:]
        except ProofError as err:
            msg = str(err)
            raise ProofError(msg if msg.startswith("line ") else f"line {tactic.line}: {tactic.kind}: {msg}") from None
    return goals


def _by_runner(ctx: Context, target: Formula, block: Block) -> None:
    close_goal(Goal(ctx, target), block)


def _elaborator() -> Elaborator:
    return Elaborator(_by_runner)


def run_tactic(goal: Goal, t: Tactic) -> list[Goal]:
    """The goals that replace `goal` after tactic `t` (raises ProofError)."""
    kind, target, hyps = t.kind, goal.target, goal.hyps
    if kind == "focus":
        close_goal(goal, t.block)
        return []
    if kind in ("intro", "intros"):
        return [_intro(goal, t)]
    if kind == "exact":
        el = _elaborator()
        el.elab(t.term, hyps, target)
        el.require_solved()
        return []
    if kind == "apply":
        return _apply(goal, t)
    if kind == "constructor":
        if isinstance(target, And):
            return [Goal(hyps, target.left), Goal(hyps, target.right)]
        if isinstance(target, Iff):
            return [Goal(hyps, Imp(target.left, target.right)), Goal(hyps, Imp(target.right, target.left))]
        if isinstance(target, Top):
            return []
        raise ProofError(f"constructor: target {show(target)} is not ∧, ↔ or True")
    if kind in ("left", "right"):
        if not isinstance(target, Or):
            raise ProofError(f"target {show(target)} is not a disjunction")
        return [Goal(hyps, target.left if kind == "left" else target.right)]
    if kind == "assumption":
        if _assumption(goal):
            return []
        raise ProofError(f"no hypothesis matches {show(target)}")
    if kind == "exfalso":
        return [Goal(hyps, FALSE)]
    if kind == "contradiction":
        if _contradiction(goal):
            return []
        raise ProofError("no contradiction found among the hypotheses")
    if kind == "trivial":
        if _trivial(goal):
            return []
        raise ProofError(f"trivial failed on {show(target)}")
    if kind == "cases":
        return _cases(goal, t)
    if kind == "rcases":
        return _rcases(goal, t)
    if kind == "have":
        el = _elaborator()
        ty = el.elab(t.term, hyps, t.formula)
        el.require_solved()
        ty = t.formula if t.formula is not None else el.zonk(ty)
        return [Goal(hyps + (Hyp(t.hyp, ty),), target)]
    if kind == "show":
        if not defeq(t.formula, target):
            raise ProofError(f"{show(t.formula)} is not the goal {show(target)}")
        return [Goal(hyps, t.formula)]
    raise ProofError(f"unsupported tactic {kind}")


def _intro(goal: Goal, t: Tactic) -> Goal:
    hyps, target = goal.hyps, goal.target
    if t.kind == "intros" and not t.names:
        # `intros` introduces only syntactic arrows: it does not unfold `¬`.
        while isinstance(target, Imp):
            hyps, target = hyps + (Hyp(None, target.left),), target.right
        return Goal(hyps, target)
    for name in t.names or (None,):
        if isinstance(target, Imp):
            dom, target = target.left, target.right
        elif isinstance(target, Not):
            dom, target = target.arg, FALSE
        else:
            raise ProofError(f"no implication to introduce in {show(target)}")
        hyps = hyps + (Hyp(name, dom),)
    return Goal(hyps, target)


def _spine(el: Elaborator, t) -> list:
    """Argument types of `t` seen as a curried implication (whnf unfolds `¬`)."""
    args = []
    pi = el.as_pi(t)
    while pi is not None:
        args.append(pi[0])
        pi = el.as_pi(pi[1])
    return args


def _apply(goal: Goal, t: Tactic) -> list[Goal]:
    el = _elaborator()
    fn_type = el.elab(t.term, goal.hyps)
    n = len(_spine(el, fn_type))
    target_arity = len(_spine(el, goal.target))
    # Lean tries n - (target's arity) arguments first, then more, up to all of them.
    for k in range(max(0, n - target_arity), n + 1):
        rest, domains = fn_type, []
        for _ in range(k):
            dom, rest = el.as_pi(rest)
            domains.append(dom)
        if el.unify(rest, goal.target):
            if any(el.has_meta(d) for d in domains):
                raise ProofError("apply leaves goals with unknown propositions")
            el.require_solved()
            return [Goal(goal.hyps, el.zonk(d)) for d in domains]
    raise ProofError(f"cannot unify the conclusion of {show(el.zonk_safe(fn_type))} with {show(goal.target)}")


def _assumption(goal: Goal) -> bool:
    return any(defeq(h.type, goal.target) for h in goal.hyps)


def _contradiction(goal: Goal) -> bool:
    types = [h.type for h in goal.hyps]
    if any(isinstance(ty, Bot) for ty in types):
        return True
    return any(isinstance(ty, Not) and ty.arg in types for ty in types)


def _trivial(goal: Goal) -> bool:
    # Core `trivial` tries assumption, contradiction, `True.intro` and
    # `apply And.intro <;> trivial` (and rfl/decide, which add nothing we accept).
    if isinstance(goal.target, Top) or _assumption(goal) or _contradiction(goal):
        return True
    if isinstance(goal.target, And):
        return _trivial(Goal(goal.hyps, goal.target.left)) and _trivial(Goal(goal.hyps, goal.target.right))
    return False


def _find_hyp(hyps: Context, name: str) -> int:
    for i in range(len(hyps) - 1, -1, -1):
        if hyps[i].name == name:
            return i
    raise ProofError(f"unknown hypothesis {name!r}")


def _constructors(ty: Formula) -> list[tuple[str, list[Formula]]]:
    """Constructors of the inductive proposition `ty` with their field types."""
    if isinstance(ty, And):
        return [("intro", [ty.left, ty.right])]
    if isinstance(ty, Or):
        return [("inl", [ty.left]), ("inr", [ty.right])]
    if isinstance(ty, Iff):
        return [("intro", [Imp(ty.left, ty.right), Imp(ty.right, ty.left)])]
    if isinstance(ty, Top):
        return [("intro", [])]
    if isinstance(ty, Bot):
        return []
    raise ProofError(f"cannot do cases on a proof of {show(ty)} (not ∧, ∨, ↔, True or False)")


def _cases(goal: Goal, t: Tactic) -> list[Goal]:
    i = _find_hyp(goal.hyps, t.hyp)
    base = goal.hyps[:i] + goal.hyps[i + 1 :]
    ctors = _constructors(goal.hyps[i].type)
    if t.alts is None:
        return [Goal(base + tuple(Hyp(None, f) for f in fields), goal.target) for _, fields in ctors]
    given = [alt[0] for alt in t.alts]
    wanted = [c for c, _ in ctors]
    if sorted(given) != sorted(wanted):
        raise ProofError(f"alternatives {given} do not match the constructors {wanted}")
    fields_of = dict(ctors)
    for ctor, names, block in t.alts:
        fields = fields_of[ctor]
        if len(names) > len(fields):
            raise ProofError(f"too many names for constructor {ctor}")
        padded = list(names) + [None] * (len(fields) - len(names))
        close_goal(Goal(base + tuple(Hyp(n, f) for n, f in zip(padded, fields)), goal.target), block)
    return []


def _rcases(goal: Goal, t: Tactic) -> list[Goal]:
    hyps = goal.hyps
    if isinstance(t.term, Var) and "." not in t.term.name and _has_name(hyps, t.term.name):
        i = _find_hyp(hyps, t.term.name)
        ty = hyps[i].type
        hyps = hyps[:i] + hyps[i + 1 :]  # destructuring a hypothesis clears it
        if isinstance(t.pattern, PName):
            raise ProofError("a plain name pattern on a hypothesis is not supported")
    else:
        el = _elaborator()
        ty = el.zonk(el.elab(t.term, hyps))
        el.require_solved()
    if _splits(t.pattern, ty) > 1:
        raise ProofError("only one `|` alternative split per rcases/obtain is supported")
    return _destructure([Goal(hyps, goal.target)], ty, t.pattern)


def _has_name(hyps: Context, name: str) -> bool:
    return any(h.name == name for h in hyps)


def _alt_parts(alts: tuple[Pattern, ...], ty: Formula) -> list[tuple[Pattern, Formula]]:
    """Pair alternatives with disjuncts; `a | b | c` on `A ∨ B ∨ C` is `a | (b | c)`."""
    parts = []
    while len(alts) > 1 and isinstance(ty, Or):
        parts.append((alts[0], ty.left))
        alts, ty = alts[1:], ty.right
    parts.append((alts[0] if len(alts) == 1 else PAlts(alts), ty))
    return parts


def _tuple_parts(items: tuple[Pattern, ...], ty: Formula) -> list[tuple[Pattern, Formula]]:
    """Pair tuple items with fields; `⟨a, b, c⟩` on `A ∧ B ∧ C` is `⟨a, ⟨b, c⟩⟩`."""
    first, second = (ty.left, ty.right) if isinstance(ty, And) else (Imp(ty.left, ty.right), Imp(ty.right, ty.left))
    return [(items[0], first), (items[1] if len(items) == 2 else PTuple(items[1:]), second)]


def _splits(p: Pattern, ty: Formula) -> int:
    """How many places in the pattern split a goal in several (`a | b | c` counts once)."""
    if isinstance(p, PAlts) and isinstance(ty, Or):
        return 1 + sum(_splits(q, part) for q, part in _alt_parts(p.alts, ty))
    if isinstance(p, PTuple) and isinstance(ty, (And, Iff)) and len(p.items) >= 2:
        return sum(_splits(q, part) for q, part in _tuple_parts(p.items, ty))
    return 0


def _destructure(goals: list[Goal], ty: Formula, p: Pattern) -> list[Goal]:
    """Apply rcases pattern `p` to a proof of `ty`, in each goal of `goals`."""
    out: list[Goal] = []
    for g in goals:
        out += _destructure_one(g, ty, p)
    return out


def _destructure_one(g: Goal, ty: Formula, p: Pattern) -> list[Goal]:
    if isinstance(p, PName):
        return [Goal(g.hyps + (Hyp(p.name, ty),), g.target)]
    if isinstance(p, PTuple):
        if not p.items and isinstance(ty, Bot):
            return []
        if not p.items and isinstance(ty, Top):
            return [g]
        if isinstance(ty, (And, Iff)) and len(p.items) >= 2:
            (p1, t1), (p2, t2) = _tuple_parts(p.items, ty)
            return _destructure(_destructure_one(g, t1, p1), t2, p2)
        raise ProofError(f"pattern ⟨...⟩ with {len(p.items)} items does not fit {show(ty)}")
    if isinstance(p, PAlts) and isinstance(ty, Or):
        return [h for q, part in _alt_parts(p.alts, ty) for h in _destructure_one(g, part, q)]
    raise ProofError(f"pattern with alternatives does not fit {show(ty)}")
