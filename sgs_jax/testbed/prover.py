"""A complete decision procedure for intuitionistic propositional logic that writes its
proof as a tactic script in the checker's subset.

The search is Dyckhoff's contraction-free sequent calculus G4ip (LJT, 1992): invertible
rules are applied eagerly, then the two non-invertible ones (`∨` on the right, and
`(C → D) → B` on the left) are tried with backtracking. Every G4ip rule maps to a few
core Lean 4 tactics (`intro`, `constructor`, `obtain`, `rcases`, `have`, `exact`), so a
found derivation is printed directly as a proof. G4ip terminates without loop checks;
failed sequents are memoised.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from sgs_jax.testbed.formula import FALSE, And, Atom, Bot, Formula, Iff, Imp, Not, Or, Top, show, unfold_not
from sgs_jax.testbed.parser import Statement

INDENT = "  "


class SearchBudgetExceeded(RuntimeError):
    """The search visited more sequents than allowed."""


@dataclasses.dataclass(frozen=True)
class ProverResult:
    """provable: a derivation exists. proof: tactic lines at column 0 (None if not
    provable). length: number of tactics in the proof (the difficulty measure).
    sequents: (hypotheses, goal) of every sequent on the derivation, root first."""

    provable: bool
    proof: Optional[tuple[str, ...]]
    length: int
    sequents: tuple[tuple[tuple[Formula, ...], Formula], ...] = ()

    def proof_text(self, indent: str = INDENT) -> str:
        """The proof as the body after `:= by` (one tactic per line, indented)."""
        return "\n".join(indent + line for line in self.proof or ())


@dataclasses.dataclass
class _Proof:
    lines: list[str]
    length: int
    sequents: list


def _as_imp(f: Formula):
    """(antecedent, consequent) of `a → b` or `¬a` (as `a → False`), else None."""
    if isinstance(f, Imp):
        return f.left, f.right
    if isinstance(f, Not):
        return f.arg, FALSE
    return None


def _join(lines: list[str], tactics: int, rest: _Proof) -> _Proof:
    """`lines` followed by `rest`; `have n : T := e` then `exact n` becomes `exact e`."""
    last = lines[-1] if lines else ""
    if last.startswith("have ") and len(rest.lines) == 1 and " := by" not in last:
        name, term = last[5:].split(" ", 1)[0], last.split(" := ", 1)[1]
        if rest.lines[0] == f"exact {name}":
            return _Proof(lines[:-1] + [f"exact {term}"], tactics, rest.sequents)
    return _Proof(lines + rest.lines, tactics + rest.length, rest.sequents)


def _focus(lines: list[str]) -> list[str]:
    return ["· " + lines[0]] + [INDENT + line for line in lines[1:]]


class Prover:
    """One search; `reserved` are names the proof must not reuse (atoms, hypotheses)."""

    def __init__(self, reserved: frozenset[str], max_nodes: int = 200_000):
        self.reserved, self.max_nodes = reserved, max_nodes
        self.nodes, self.counter = 0, 0
        self.failed: set = set()

    def fresh(self) -> str:
        while True:
            self.counter += 1
            name = f"h{self.counter}"
            if name not in self.reserved:
                return name

    def prove(self, hyps: tuple[tuple[str, Formula], ...], goal: Formula) -> Optional[_Proof]:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise SearchBudgetExceeded(f"more than {self.max_nodes} sequents")
        key = (frozenset(unfold_not(f) for _, f in hyps), unfold_not(goal))
        if key in self.failed:
            return None
        proof = self._prove(hyps, goal)
        if proof is None:
            self.failed.add(key)
        else:
            proof.sequents.insert(0, (tuple(f for _, f in hyps), goal))
        return proof

    def _add(self, hyps, name: str, f: Formula):
        if any(unfold_not(g) == unfold_not(f) for _, g in hyps):
            return hyps
        return hyps + ((name, f),)

    def _step(self, lines: list[str], hyps, goal, tactics: int = 1) -> Optional[_Proof]:
        rest = self.prove(hyps, goal)
        if rest is None:
            return None
        return _join(lines, tactics, rest)

    def _prove(self, hyps, goal: Formula) -> Optional[_Proof]:
        unfolded_goal = unfold_not(goal)
        for name, f in hyps:
            if unfold_not(f) == unfolded_goal:
                return _Proof([f"exact {name}"], 1, [])
        for name, f in hyps:
            if isinstance(f, Bot):
                return _Proof([f"exact False.elim {name}"], 1, [])
        # Invertible right rules.
        if isinstance(goal, Top):
            return _Proof(["exact True.intro"], 1, [])
        imp = _as_imp(goal)
        if imp is not None:
            n = self.fresh()
            return self._step([f"intro {n}"], self._add(hyps, n, imp[0]), imp[1])
        if isinstance(goal, (And, Iff)):
            parts = (goal.left, goal.right) if isinstance(goal, And) else (Imp(goal.left, goal.right), Imp(goal.right, goal.left))
            first = self.prove(hyps, parts[0])
            second = first and self.prove(hyps, parts[1])
            if not second:
                return None
            return _Proof(["constructor"] + _focus(first.lines) + _focus(second.lines),
                          1 + first.length + second.length, first.sequents + second.sequents)
        # Invertible left rules.
        for i, (name, f) in enumerate(hyps):
            rest = hyps[:i] + hyps[i + 1 :]
            step = self._left_invertible(name, f, rest, hyps, goal)
            if step is not False:
                return step
        # Non-invertible rules, with backtracking.
        if isinstance(goal, Or):
            for side, part in (("left", goal.left), ("right", goal.right)):
                proof = self._step([side], hyps, part)
                if proof is not None:
                    return proof
        for i, (name, f) in enumerate(hyps):
            imp = _as_imp(f)
            if imp is None or _as_imp(imp[0]) is None:
                continue
            (c, d), b = _as_imp(imp[0]), imp[1]
            rest = hyps[:i] + hyps[i + 1 :]
            dn, cdn, bn = self.fresh(), self.fresh(), self.fresh()
            inner = self.prove(self._add(rest, dn, Imp(d, b)), Imp(c, d))
            if inner is None:
                continue
            outer = self.prove(self._add(rest, bn, b), goal)
            if outer is None:
                continue
            used = inner.lines[0][6:] if len(inner.lines) == 1 and inner.lines[0].startswith("exact ") else ""
            if used and " " not in used and used != dn:
                # `C → D` is already a hypothesis: use it directly.
                return _join([f"have {bn} : {show(b)} := {name} {used}"], 1, outer)
            x = self.fresh()
            lines = [f"have {dn} : {show(Imp(d, b))} := fun {x} => {name} (fun _ => {x})",
                     f"have {cdn} : {show(Imp(c, d))} := by"] + [INDENT + line for line in inner.lines]
            return _join(lines + [f"have {bn} : {show(b)} := {name} {cdn}"], 3 + inner.length, outer)
        return None

    def _left_invertible(self, name: str, f: Formula, rest, hyps, goal):
        """The proof after one invertible left rule on hypothesis `name : f`; None when
        that rule applies but the rest fails; False when no invertible rule applies."""
        if isinstance(f, (And, Iff)):
            a, b = self.fresh(), self.fresh()
            parts = (f.left, f.right) if isinstance(f, And) else (Imp(f.left, f.right), Imp(f.right, f.left))
            return self._step([f"obtain ⟨{a}, {b}⟩ := {name}"], self._add(self._add(rest, a, parts[0]), b, parts[1]), goal)
        if isinstance(f, Or):
            a, b = self.fresh(), self.fresh()
            left = self.prove(self._add(rest, a, f.left), goal)
            right = left and self.prove(self._add(rest, b, f.right), goal)
            if not right:
                return None
            return _Proof([f"rcases {name} with {a} | {b}"] + _focus(left.lines) + _focus(right.lines),
                          1 + left.length + right.length, left.sequents + right.sequents)
        if isinstance(f, Top):
            return self.prove(rest, goal)
        imp = _as_imp(f)
        if imp is None:
            return False
        ante, cons = imp
        n = self.fresh()
        if isinstance(ante, Bot):
            return self.prove(rest, goal)
        if isinstance(ante, Top):
            return self._step([f"have {n} : {show(cons)} := {name} True.intro"], self._add(rest, n, cons), goal)
        if isinstance(ante, Atom):
            have = next((m for m, g in hyps if g == ante), None)
            if have is None:
                return False
            return self._step([f"have {n} : {show(cons)} := {name} {have}"], self._add(rest, n, cons), goal)
        if isinstance(ante, (And, Iff)):
            x, y = self.fresh(), self.fresh()
            if isinstance(ante, And):
                new = Imp(ante.left, Imp(ante.right, cons))
            else:
                new = Imp(Imp(ante.left, ante.right), Imp(Imp(ante.right, ante.left), cons))
            return self._step([f"have {n} : {show(new)} := fun {x} {y} => {name} ⟨{x}, {y}⟩"], self._add(rest, n, new), goal)
        if isinstance(ante, Or):
            m, x = self.fresh(), self.fresh()
            left, right = Imp(ante.left, cons), Imp(ante.right, cons)
            lines = [f"have {n} : {show(left)} := fun {x} => {name} (Or.inl {x})",
                     f"have {m} : {show(right)} := fun {x} => {name} (Or.inr {x})"]
            return self._step(lines, self._add(self._add(rest, n, left), m, right), goal, tactics=2)
        return False  # (C → D) → B: non-invertible


def prove_statement(statement: Statement, max_nodes: int = 200_000) -> ProverResult:
    """Decide `statement` and, if provable, produce its tactic proof.

    Raises SearchBudgetExceeded if the search visits more than `max_nodes` sequents."""
    reserved = frozenset(statement.atoms) | {name for name, _ in statement.hypotheses}
    prover = Prover(reserved, max_nodes)
    proof = prover.prove(tuple(statement.hypotheses), statement.conclusion)
    if proof is None:
        return ProverResult(False, None, 0)
    return ProverResult(True, tuple(proof.lines), proof.length, tuple(proof.sequents))


def is_provable(hypotheses: tuple[Formula, ...], conclusion: Formula, max_nodes: int = 200_000) -> bool:
    """Intuitionistic provability of `hypotheses ⊢ conclusion` (names do not matter)."""
    hyps = tuple((f"x{i}", f) for i, f in enumerate(hypotheses))
    return Prover(frozenset(), max_nodes).prove(hyps, conclusion) is not None
