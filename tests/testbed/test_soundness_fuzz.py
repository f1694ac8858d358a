"""Soundness fuzzing: random statements and random (mostly wrong) tactic scripts.

Nothing that is not a classical tautology may ever be accepted (checked by truth tables),
and every proof the prover emits must be accepted."""

import random

from sgs_jax.testbed.checker import check_parsed
from sgs_jax.testbed.formula import And, Imp, Or, is_classical_tautology, show
from sgs_jax.testbed.generator import random_formula
from sgs_jax.testbed.parser import Statement
from sgs_jax.testbed.prover import prove_statement

ATOMS = ("p", "q", "r")
TEMPLATES = [
    "intro h1", "intro h2", "intro _", "intros", "exact {x}", "exact {x} {y}", "apply {x}", "constructor",
    "left", "right", "assumption", "exfalso", "contradiction", "trivial", "cases {x}",
    "rcases {x} with a | b", "obtain ⟨a, b⟩ := {x}", "have h3 : {f} := {x} {y}", "exact ⟨{x}, {y}⟩",
    "exact Or.inl {x}", "exact Or.inr {x}", "exact absurd {x} {y}", "exact {x}.1", "exact {x}.2",
    "exact fun h => {x}", "exact ({x} {y}).elim", "exact False.elim {x}", "show {f}", "have := {x}.mp {y}",
    "exact {x}.elim (fun a => {y}) (fun b => {y})", "exact id {x}",
]

CLOSERS = ["assumption", "trivial", "contradiction", "exact {x}", "exact {x} {y}", "intros\n  assumption"]


def random_script(rng, statement):
    names = [n for n, _ in statement.hypotheses] * 3 + ["h1", "h2", "h3", "a", "b", "this"]
    lines = []
    steps = [rng.choice(TEMPLATES) for _ in range(rng.randint(0, 4))]
    for t in steps + [rng.choice(CLOSERS)]:
        lines.append("  " + t.format(x=rng.choice(names), y=rng.choice(names),
                                     f=show(random_formula(rng, ATOMS, rng.randint(0, 2)))))
    return "\n".join(lines)


def random_statement(rng, i):
    hyps = tuple((f"h₀{j}", random_formula(rng, ATOMS, rng.randint(0, 2))) for j in range(rng.randint(0, 3)))
    concl = random_formula(rng, ATOMS, rng.randint(0, 3))
    if hyps and rng.random() < 0.3:  # a conclusion close to a hypothesis makes acceptance reachable
        concl = rng.choice([hyps[0][1], Imp(concl, hyps[0][1]), And(hyps[0][1], concl), Or(concl, hyps[-1][1])])
    return Statement(f"fz{i}", ATOMS, hyps, concl)


def test_random_scripts_never_prove_non_tautologies():
    rng = random.Random(1234)
    accepted = 0
    for i in range(1500):
        st = random_statement(rng, i)
        taut = is_classical_tautology(tuple(f for _, f in st.hypotheses), st.conclusion)
        for _ in range(8):
            result = check_parsed(st, random_script(rng, st))
            if result.ok:
                accepted += 1
                assert taut, (st.lean(), result)
    assert accepted > 100  # the fuzzer does reach acceptance, so the check is not vacuous


def test_near_miss_proofs_on_perturbed_statements():
    # A valid proof replayed on a statement with one formula changed, or with one line
    # dropped or one name swapped: close to right, usually wrong, never unsound.
    rng = random.Random(7)
    accepted = rejected = 0
    for i in range(400):
        st = random_statement(rng, i)
        result = prove_statement(st)
        if not result.provable:
            continue
        lines = list(result.proof)
        for _ in range(6):
            kind = rng.randrange(3)
            target, proof_lines = st, list(lines)
            if kind == 0:
                target = Statement(st.name, st.atoms, st.hypotheses, random_formula(rng, ATOMS, rng.randint(0, 3)))
            elif kind == 1 and len(proof_lines) > 1:
                del proof_lines[rng.randrange(len(proof_lines))]
            else:
                j = rng.randrange(len(proof_lines))
                names = [n for n, _ in st.hypotheses] + [f"h{k}" for k in range(1, 12)]
                proof_lines[j] = proof_lines[j].replace(rng.choice(names), rng.choice(names))
            check = check_parsed(target, "\n".join("  " + l for l in proof_lines))
            if check.ok:
                accepted += 1
                assert is_classical_tautology(tuple(f for _, f in target.hypotheses), target.conclusion), target.lean()
            else:
                rejected += 1
    assert accepted > 50 and rejected > 50


def test_prover_proofs_are_accepted_and_prover_is_sound():
    rng = random.Random(99)
    provable = 0
    for i in range(600):
        st = random_statement(rng, i)
        result = prove_statement(st)
        if result.provable:
            provable += 1
            assert is_classical_tautology(tuple(f for _, f in st.hypotheses), st.conclusion)
            check = check_parsed(st, result.proof_text())
            assert check.ok, (st.lean(), result.proof_text(), check.reason)
    assert provable > 100
