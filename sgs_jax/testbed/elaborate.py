"""Type checking of proof terms against propositions (the term half of the checker).

Types are formulas that may contain metavariables (`Meta`), the implicit arguments of
constants such as `Or.inl : ?a → ?a ∨ ?b`. Unification is Lean's `isDefEq` restricted to
this fragment: structural, with `¬ a` unfolding to `a → False`, and undone on failure.
Elaboration passes the expected type down (as Lean does) and fails on anything it cannot
resolve, so whatever it accepts Lean's elaborator accepts too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from sgs_jax.testbed.formula import BINARY, FALSE, TRUE, And, Atom, Bot, Formula, Iff, Imp, Not, Or, Top, show
from sgs_jax.testbed.proof_syntax import Anon, App, Ascribe, By, Field, Fun, Term, Var


class ProofError(Exception):
    """A proof step Lean would reject; the message is the reason shown to the user."""


@dataclasses.dataclass(frozen=True)
class Hyp:
    """A local hypothesis; name None means inaccessible (Lean's `h✝`)."""

    name: Optional[str]
    type: Formula


Context = tuple[Hyp, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Meta:
    """A metavariable (an implicit argument still to be found). Identity is the object."""

    serial: int


class Elaborator:
    """Holds the metavariable assignment of one elaboration (a tactic's term)."""

    def __init__(self, run_block: Callable[[Context, Formula, "object"], None]):
        self.assigned: dict[Meta, Formula] = {}
        self.metas: list[Meta] = []
        self.run_block = run_block  # runs a nested `by` block on a goal (from the checker)

    # -- metavariables -------------------------------------------------------------------
    def fresh(self) -> Meta:
        m = Meta(len(self.metas))
        self.metas.append(m)
        return m

    def resolve(self, t):
        while isinstance(t, Meta) and t in self.assigned:
            t = self.assigned[t]
        return t

    def zonk(self, t):
        """`t` with every assigned metavariable replaced, recursively."""
        t = self.resolve(t)
        if isinstance(t, Not):
            return Not(self.zonk(t.arg))
        if isinstance(t, BINARY):
            return type(t)(self.zonk(t.left), self.zonk(t.right))
        return t

    def has_meta(self, t) -> bool:
        t = self.resolve(t)
        if isinstance(t, Meta):
            return True
        if isinstance(t, Not):
            return self.has_meta(t.arg)
        if isinstance(t, BINARY):
            return self.has_meta(t.left) or self.has_meta(t.right)
        return False

    def require_solved(self) -> None:
        if any(m not in self.assigned for m in self.metas):
            raise ProofError("cannot infer an implicit argument (add a type ascription)")

    # -- unification ---------------------------------------------------------------------
    def unify(self, a, b) -> bool:
        """isDefEq: True and assignments kept, or False and nothing changed."""
        saved = dict(self.assigned)
        if self._unify(a, b):
            return True
        self.assigned = saved
        return False

    def _unify(self, a, b) -> bool:
        a, b = self.resolve(a), self.resolve(b)
        if a is b:
            return True
        if isinstance(a, Meta) or isinstance(b, Meta):
            m, t = (a, b) if isinstance(a, Meta) else (b, a)
            if self._occurs(m, t):
                return False
            self.assigned[m] = t
            return True
        if isinstance(a, Not) and not isinstance(b, Not):
            return self._unify(Imp(a.arg, FALSE), b)
        if isinstance(b, Not) and not isinstance(a, Not):
            return self._unify(a, Imp(b.arg, FALSE))
        if type(a) is not type(b):
            return False
        if isinstance(a, Atom):
            return a.name == b.name
        if isinstance(a, (Top, Bot)):
            return True
        if isinstance(a, Not):
            return self._unify(a.arg, b.arg)
        return self._unify(a.left, b.left) and self._unify(a.right, b.right)

    def _occurs(self, m: Meta, t) -> bool:
        t = self.resolve(t)
        if t is m:
            return True
        if isinstance(t, Not):
            return self._occurs(m, t.arg)
        if isinstance(t, BINARY):
            return self._occurs(m, t.left) or self._occurs(m, t.right)
        return False

    def as_pi(self, t):
        """(domain, codomain) if `t` reduces to an implication (whnf unfolds `¬`), else None."""
        t = self.resolve(t)
        if isinstance(t, Imp):
            return t.left, t.right
        if isinstance(t, Not):
            return t.arg, FALSE
        return None

    # -- constants -----------------------------------------------------------------------
    def constant(self, name: str):
        m = self.fresh
        if name == "And.intro":
            a, b = m(), m()
            return Imp(a, Imp(b, And(a, b)))
        if name in ("And.left", "And.right"):
            a, b = m(), m()
            return Imp(And(a, b), a if name == "And.left" else b)
        if name in ("Or.inl", "Or.inr"):
            a, b = m(), m()
            return Imp(a if name == "Or.inl" else b, Or(a, b))
        if name == "Or.elim":
            a, b, c = m(), m(), m()
            return Imp(Or(a, b), Imp(Imp(a, c), Imp(Imp(b, c), c)))
        if name == "Iff.intro":
            a, b = m(), m()
            return Imp(Imp(a, b), Imp(Imp(b, a), Iff(a, b)))
        if name in ("Iff.mp", "Iff.mpr"):
            a, b = m(), m()
            return Imp(Iff(a, b), Imp(a, b) if name == "Iff.mp" else Imp(b, a))
        if name == "absurd":
            a, b = m(), m()
            return Imp(a, Imp(Not(a), b))
        if name == "False.elim":
            return Imp(FALSE, m())
        if name == "id":
            a = m()
            return Imp(a, a)
        if name in ("True.intro", "trivial"):
            return TRUE
        raise ProofError(f"unknown identifier {name!r}")

    def project(self, t, field: str):
        """Type of `x.field` where `x : t` (structure projections and `.elim`)."""
        t = self.resolve(t)
        if isinstance(t, And) and field in ("1", "left", "2", "right"):
            return t.left if field in ("1", "left") else t.right
        if isinstance(t, Iff) and field in ("1", "mp", "2", "mpr"):
            return Imp(t.left, t.right) if field in ("1", "mp") else Imp(t.right, t.left)
        if isinstance(t, Or) and field == "elim":
            c = self.fresh()
            return Imp(Imp(t.left, c), Imp(Imp(t.right, c), c))
        if isinstance(t, Bot) and field == "elim":
            return self.fresh()
        what = "a metavariable" if isinstance(t, Meta) else show(self.zonk(t))
        raise ProofError(f"invalid field '.{field}' on a proof of {what}")

    # -- elaboration ---------------------------------------------------------------------
    def lookup(self, ctx: Context, name: str) -> Optional[Formula]:
        for hyp in reversed(ctx):
            if hyp.name == name:
                return hyp.type
        return None

    def elab(self, term: Term, ctx: Context, expected=None):
        """Type of `term` in `ctx`, unified with `expected` when given."""
        if isinstance(term, Var):
            base, *fields = term.name.split(".")
            local = self.lookup(ctx, base)
            if local is not None:
                t = local
                for f in fields:
                    t = self.project(t, f)
            else:
                t = self.constant(term.name)
            return self._expect(t, expected, term)
        if isinstance(term, Field):
            return self._expect(self.project(self.elab(term.term, ctx), term.field), expected, term)
        if isinstance(term, App):
            return self._elab_app(term, ctx, expected)
        if isinstance(term, Fun):
            return self._elab_fun(term, ctx, expected)
        if isinstance(term, Anon):
            return self._elab_anon(term, ctx, expected)
        if isinstance(term, Ascribe):
            self.elab(term.term, ctx, term.type)
            return self._expect(term.type, expected, term)
        if isinstance(term, By):
            if expected is None or self.has_meta(expected):
                raise ProofError("a `by` block needs a known expected type")
            self.run_block(ctx, self.zonk(expected), term.block)
            return expected
        raise ProofError(f"unsupported term {term!r}")

    def _expect(self, t, expected, term):
        if expected is not None and not self.unify(t, expected):
            raise ProofError(
                f"type mismatch: term has type {show(self.zonk_safe(t))} but is expected to have type "
                f"{show(self.zonk_safe(expected))}"
            )
        return t

    def zonk_safe(self, t):
        """For messages: metavariables print as `?m`."""
        t = self.zonk(t)
        if isinstance(t, Meta):
            return Atom(f"?m{t.serial}")
        if isinstance(t, Not):
            return Not(self.zonk_safe(t.arg))
        if isinstance(t, BINARY):
            return type(t)(self.zonk_safe(t.left), self.zonk_safe(t.right))
        return t

    def _elab_app(self, term: App, ctx: Context, expected):
        t = self.elab(term.fn, ctx)
        domains = []
        for _ in term.args:
            pi = self.as_pi(t)
            if pi is None:
                raise ProofError(f"function expected: too many arguments for a proof of {show(self.zonk_safe(t))}")
            domains.append(pi[0])
            t = pi[1]
        # Lean propagates the expected type to the result before elaborating arguments.
        self._expect(t, expected, term)
        for arg, dom in zip(term.args, domains):
            self.elab(arg, ctx, dom)
        return t

    def _elab_fun(self, term: Fun, ctx: Context, expected):
        if expected is None:
            raise ProofError("cannot elaborate `fun` without an expected type")
        result = expected
        t = expected
        for name, annotation in term.binders:
            pi = self.as_pi(t)
            if pi is None:
                raise ProofError(f"`fun` where a proof of {show(self.zonk_safe(t))} is expected (not an implication)")
            dom, t = pi
            if annotation is not None and not self.unify(annotation, dom):
                raise ProofError(f"binder type {show(annotation)} does not match {show(self.zonk_safe(dom))}")
            ctx = ctx + (Hyp(name, annotation if annotation is not None else dom),)
        self.elab(term.body, ctx, t)
        return result

    def _elab_anon(self, term: Anon, ctx: Context, expected):
        t = self.resolve(expected) if expected is not None else None
        items = term.items
        if isinstance(t, Top) and not items:
            return t
        if isinstance(t, (And, Iff)) and len(items) >= 2:
            fields = (t.left, t.right) if isinstance(t, And) else (Imp(t.left, t.right), Imp(t.right, t.left))
            self.elab(items[0], ctx, fields[0])
            rest = items[1] if len(items) == 2 else Anon(items[1:])  # ⟨a, b, c⟩ = ⟨a, ⟨b, c⟩⟩
            self.elab(rest, ctx, fields[1])
            return t
        what = "unknown" if t is None or isinstance(t, Meta) else show(self.zonk_safe(t))
        raise ProofError(f"anonymous constructor ⟨...⟩ with {len(items)} items does not fit expected type {what}")
