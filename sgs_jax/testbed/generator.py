"""Random provable propositional statements, and the rules that make a target set of them.

Knobs (`Knobs`): number of atoms, of premises, formula depth, and distractor premises
(extra hypotheses that the proof does not need). A statement is kept only if it is
intuitionistically provable, its premises are satisfiable (no ex-falso freebies), its
conclusion is not given (`hacks.conclusion_in_premises`), and it is new. Its proof is the prover's
derivation with the unneeded steps pruned (`prune.prune_proof`); `difficulty` is that
proof's tactic count, and `band` the difficulty band it falls in (`BANDS`).

The packaged target set (`data/targets.json`) is chosen from `candidate_pool()` by
`select_targets`, with the packaged base model's measured solve rates; the builder that
runs the model is `python -m sgs_jax.sgs.testbed_targets` (docs/testbed.md). A single knob
setting can be sampled without a model:

    python -m sgs_jax.testbed.generator --out statements.json --atoms 4 --premises 3 --depth 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import random
from typing import Iterable, Optional, Sequence

from sgs_jax.testbed.formula import FALSE, TRUE, And, Atom, Formula, Iff, Imp, Not, Or, evaluate, atoms as atoms_of, unfold_not
from sgs_jax.testbed.hacks import conclusion_in_premises, is_disjunctive
from sgs_jax.testbed.parser import Statement, parse_statement
from sgs_jax.testbed.prover import SearchBudgetExceeded, prove_statement
from sgs_jax.testbed.prune import proof_length, prune_proof

ATOM_NAMES = ("p", "q", "r", "s", "t", "u")
HYP_NAMES = tuple(f"h{d}" for d in "₀₁₂₃₄₅₆₇₈₉")
MAX_LENGTH = 60  # longer proofs do not fit a tiny model's context
DEFAULT_PATH = pathlib.Path(__file__).resolve().parent / "data" / "targets.json"
# Difficulty bands (name, lowest, highest pruned proof length), logged per band as
# `cumulative_solve_rate/band/<name>`; of the packaged set the base model proves only
# `low` statements (docs/testbed.md has the measured composition).
BANDS = (("low", 0, 8), ("mid", 9, 16), ("high", 17, MAX_LENGTH))
# D3k's share of statements with a disjunctive conclusion is about 4-8% (method.md §3).
TARGET_DISJUNCTIVE_FRACTION = 0.06

# (connective, weight) for inner nodes: implication and conjunction dominate, as in
# textbook exercises; ↔ and the constants are rarer.
_CONNECTIVES = ((Imp, 5), (And, 3), (Or, 3), (Not, 2), (Iff, 1))


@dataclasses.dataclass(frozen=True)
class Knobs:
    """Difficulty knobs of one generated statement."""

    atoms: int = 3
    premises: int = 2
    depth: int = 2
    distractors: int = 0


@dataclasses.dataclass(frozen=True)
class Generated:
    """statement, its pruned prover proof (body after `:= by`), that proof's tactic
    count (`difficulty`) and the knobs it was drawn with."""

    statement: Statement
    proof: str
    difficulty: int
    knobs: Knobs


def band_of(difficulty: int) -> str:
    """The name of the difficulty band (`BANDS`) holding `difficulty`."""
    for name, low, high in BANDS:
        if low <= difficulty <= high:
            return name
    raise ValueError(f"difficulty {difficulty} lies outside every band {BANDS}")


def random_formula(rng: random.Random, names: tuple[str, ...], depth: int) -> Formula:
    """A random formula over `names` of depth at most `depth` (exactly `depth` on the
    leftmost path, so the depth knob is felt)."""
    if depth <= 0:
        roll = rng.random()
        return TRUE if roll < 0.02 else FALSE if roll < 0.05 else Atom(rng.choice(names))
    ctor = rng.choices([c for c, _ in _CONNECTIVES], [w for _, w in _CONNECTIVES])[0]
    if ctor is Not:
        return Not(random_formula(rng, names, depth - 1))
    sub = depth - 1 if rng.random() < 0.5 else rng.randint(0, depth - 1)
    return ctor(random_formula(rng, names, depth - 1), random_formula(rng, names, sub))


def satisfiable(formulas: Iterable[Formula], names: tuple[str, ...]) -> bool:
    formulas = list(formulas)
    for bits in range(1 << len(names)):
        valuation = {n: bool(bits >> i & 1) for i, n in enumerate(names)}
        if all(evaluate(f, valuation) for f in formulas):
            return True
    return False


def generate_one(rng: random.Random, knobs: Knobs, name: str, max_tries: int = 2000,
                 max_nodes: int = 20_000, min_length: int = 2, max_length: int = MAX_LENGTH,
                 disjunctive: bool | None = None) -> Optional[Generated]:
    """Rejection-sample one provable statement with these knobs whose pruned prover proof
    has min_length..max_length tactics (None if none found). `disjunctive`: require
    (True) or forbid (False) a disjunctive conclusion; None takes what comes."""
    names = ATOM_NAMES[: knobs.atoms]
    for _ in range(max_tries):
        premises = [random_formula(rng, names, rng.randint(1, knobs.depth)) for _ in range(knobs.premises)]
        conclusion = random_formula(rng, names, knobs.depth)
        if any(unfold_not(p) == unfold_not(conclusion) for p in premises) or len(set(premises)) < len(premises):
            continue
        used = set().union(atoms_of(conclusion), *(atoms_of(p) for p in premises))
        if len(used) < min(2, knobs.atoms) or not satisfiable(premises, names):
            continue
        distractors = [random_formula(rng, names, rng.randint(1, knobs.depth)) for _ in range(knobs.distractors)]
        hyps = premises + distractors
        if not satisfiable(hyps, names):
            continue
        atoms = tuple(n for n in names if n in set().union(used, *(atoms_of(d) for d in distractors)))
        statement = Statement(name, atoms, tuple(zip(HYP_NAMES, hyps)), conclusion)
        if conclusion_in_premises(statement):  # `q → p → p` and the like: nothing to prove
            continue
        if disjunctive is not None and is_disjunctive(statement) != disjunctive:
            continue
        try:
            result = prove_statement(statement, max_nodes)
        except SearchBudgetExceeded:
            continue
        if not (result.provable and min_length <= result.length):
            continue
        proof = prune_proof(statement, result.proof_text())
        length = proof_length(proof)
        if min_length <= length <= max_length:
            return Generated(statement, proof, length, knobs)
    return None


def generate(knob_list: list[Knobs], count: int, seed: int, prefix: str = "prop",
             disjunctive_fraction: float | None = None, min_length: int = 2, max_length: int = MAX_LENGTH) -> list[Generated]:
    """`count` distinct statements, cycling through `knob_list`, reproducible from `seed`.

    disjunctive_fraction: when set, the share of statements with a disjunctive conclusion
    is held at this value (each draw asks for one when the running share is below it);
    None keeps the knobs' natural share (about 45%)."""
    rng = random.Random(seed)
    out, seen = [], set()
    attempts = disjunctive_count = 0
    while len(out) < count and attempts < count * 20:
        knobs = knob_list[attempts % len(knob_list)]
        attempts += 1
        want = None
        if disjunctive_fraction is not None:
            want = disjunctive_count < disjunctive_fraction * (len(out) + 1)
        item = generate_one(rng, knobs, f"{prefix}_{len(out):04d}", min_length=min_length, max_length=max_length, disjunctive=want)
        if item is None:
            continue
        key = (item.statement.hypotheses, item.statement.conclusion)
        if key in seen:
            continue
        seen.add(key)
        disjunctive_count += is_disjunctive(item.statement)
        out.append(item)
    return out


# The warm-start corpus mix: from one-step exercises to multi-premise, distractor-laden ones.
DEFAULT_MIX = [
    Knobs(atoms=2, premises=0, depth=2),
    Knobs(atoms=2, premises=1, depth=2),
    Knobs(atoms=3, premises=2, depth=2),
    Knobs(atoms=3, premises=2, depth=2, distractors=1),
    Knobs(atoms=3, premises=1, depth=3),
    Knobs(atoms=3, premises=3, depth=3, distractors=1),
    Knobs(atoms=4, premises=3, depth=3),
    Knobs(atoms=4, premises=4, depth=3),
    Knobs(atoms=4, premises=3, depth=3, distractors=1),
    Knobs(atoms=5, premises=4, depth=3, distractors=1),
]
# The candidates the target set is chosen from: the corpus's harder knobs, multi-step.
POOL_MIX = [
    Knobs(atoms=3, premises=2, depth=2, distractors=1),
    Knobs(atoms=3, premises=3, depth=3, distractors=1),
    Knobs(atoms=4, premises=3, depth=3),
    Knobs(atoms=4, premises=4, depth=3),
    Knobs(atoms=4, premises=3, depth=3, distractors=1),
    Knobs(atoms=5, premises=4, depth=3, distractors=1),
]
POOL_SIZE = 1200
POOL_SEED = 0
POOL_MIN_LENGTH = 4  # one- to three-step exercises teach nothing about lemmas: the hard split's floor
# Two- and three-step statements beside the multi-step pool, a third of its size: what a
# small base model proves at iteration 1 (the packaged nano base proves 9 of 1,022
# multi-step candidates), so a target set can start at a 10-20% solve rate.
REACHABLE_FRACTION = 3
# Depth-2 knobs: the pool's deeper ones almost never give a proof this short (rejection
# sampling would take hours).
REACHABLE_MIX = [
    Knobs(atoms=3, premises=2, depth=2),
    Knobs(atoms=3, premises=2, depth=2, distractors=1),
    Knobs(atoms=4, premises=2, depth=2, distractors=1),
    Knobs(atoms=4, premises=3, depth=2, distractors=1),
]
REACHABLE_SEED_OFFSET = 17  # not 1: the corpus is `DEFAULT_MIX` from seed 1
CORPUS_DISJUNCTIVE_FRACTION = 0.12  # a little above the targets', so the models know disjunctions


def candidate_pool(count: int = POOL_SIZE, seed: int = POOL_SEED) -> list[Generated]:
    """The statements the packaged target set is chosen from (deterministic; the
    warm-start corpus excludes all of them): `count` multi-step ones (prefix `pool`),
    then `count // REACHABLE_FRACTION` of two or three steps (prefix `reach`)."""
    multi = generate(POOL_MIX, count, seed, prefix="pool", disjunctive_fraction=TARGET_DISJUNCTIVE_FRACTION,
                     min_length=POOL_MIN_LENGTH)
    short = generate(REACHABLE_MIX, count // REACHABLE_FRACTION, seed + REACHABLE_SEED_OFFSET, prefix="reach",
                     disjunctive_fraction=TARGET_DISJUNCTIVE_FRACTION, min_length=2, max_length=POOL_MIN_LENGTH - 1)
    return multi + short


def statement_body(statement: str) -> str:
    """A statement without its `theorem NAME` head, whitespace collapsed (equal bodies
    are the same problem)."""
    parts = statement.split(None, 2)
    return " ".join(parts[2].split()) if len(parts) == 3 else statement


# ---- choosing the target set ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A pool statement with what the selection needs.

    base_solve_rate: fraction of the base model's calibration samples that verified.
    useful_lemmas: lemmas on its derivation that the Guide teacher rates relevance >= 4
    (a Conjecturer that proposes one shortens the proof by a quarter or more)."""

    item: Generated
    base_solve_rate: float
    useful_lemmas: int

    @property
    def hard(self) -> bool:
        """The hard split: no calibration sample of the base model verified."""
        return self.base_solve_rate == 0.0


def expected_pass_at(rate: float, k: int) -> float:
    """P(at least one of k independent samples verifies) for a per-sample rate."""
    return 1.0 - (1.0 - rate) ** k


def select_targets(candidates: Sequence[Candidate], count: int, seed: int, iteration1_solve_rate: float = 0.15,
                   k: int = 8, disjunctive_fraction: float = TARGET_DISJUNCTIVE_FRACTION) -> list[Candidate]:
    """The target set, in file order.

    Base-solvable candidates (rate > 0) are drawn at random until the set's expected
    pass@k at iteration 1 (each target's `expected_pass_at(rate, k)`, hard ones counted
    as 0) reaches `iteration1_solve_rate`; the rest are hard candidates with at least one
    useful lemma (within a lemma's reach). Disjunctive conclusions are capped at
    `disjunctive_fraction` of the set. The order interleaves (hard, band) strata evenly,
    so any prefix (`targets.limit`) has about the set's composition. Raises ValueError
    when the pool cannot fill the set or its solvable candidates fall short of
    `iteration1_solve_rate`."""
    rng = random.Random(seed)
    pool = list(candidates)
    rng.shuffle(pool)
    max_disjunctive = math.floor(disjunctive_fraction * count)
    chosen: list[Candidate] = []
    disjunctive = 0
    expected = 0.0

    def take(c: Candidate) -> bool:
        nonlocal disjunctive
        d = is_disjunctive(c.item.statement)
        if d and disjunctive >= max_disjunctive:
            return False
        disjunctive += d
        chosen.append(c)
        return True

    for c in pool:
        if expected >= iteration1_solve_rate * count or len(chosen) == count:
            break
        if not c.hard and take(c):
            expected += expected_pass_at(c.base_solve_rate, k)
    for c in pool:
        if len(chosen) == count:
            break
        if c.hard and c.useful_lemmas > 0:
            take(c)
    if len(chosen) < count:
        raise ValueError(f"the pool holds only {len(chosen)} suitable candidates for {count} targets")
    if expected < iteration1_solve_rate * count:
        raise ValueError(f"the base model's solvable candidates give an expected pass@{k} of {expected / count:.1%} at "
                         f"iteration 1, below {iteration1_solve_rate:.0%}: a larger pool or a stronger base is needed")
    strata: dict[tuple[bool, str], list[Candidate]] = {}
    for c in chosen:
        strata.setdefault((c.hard, band_of(c.item.difficulty)), []).append(c)
    keyed = [((i + rng.random()) / len(group), c) for group in strata.values() for i, c in enumerate(group)]
    return [c for _, c in sorted(keyed, key=lambda kc: kc[0])]


def to_d3k_json(items: list[Generated], source: str = "prop_testbed",
                extra: Sequence[dict] | None = None) -> dict:
    """The D3k target-set format, plus `difficulty` (pruned prover proof length), `band`,
    `knobs` and, per item, the fields of `extra[i]` (the builder's `base_solve_rate`,
    `hard`, `useful_lemmas`)."""
    targets = {}
    for i, item in enumerate(items):
        sid = item.statement.name
        targets[sid] = {
            "id": sid,
            "header": "",
            "theorem": item.statement.lean(),
            "tag": "statement",
            "source": source,
            "proofs": [],
            "difficulty": item.difficulty,
            "band": band_of(item.difficulty),
            "knobs": dataclasses.asdict(item.knobs),
            **(extra[i] if extra else {}),
        }
    return {"iterations": [], "target_statements": targets}


def target_file(selected: Sequence[Candidate], prefix: str = "prop") -> dict:
    """The target-set file of selected candidates, renamed `prefix_0000`, ... in order."""
    items = [dataclasses.replace(c.item, statement=dataclasses.replace(c.item.statement, name=f"{prefix}_{i:04d}"))
             for i, c in enumerate(selected)]
    extra = [{"base_solve_rate": c.base_solve_rate, "hard": c.hard, "useful_lemmas": c.useful_lemmas} for c in selected]
    return to_d3k_json(items, extra=extra)


def load_targets(path: pathlib.Path | str = DEFAULT_PATH) -> dict:
    """The `target_statements` mapping of a target-set file (the packaged one by default)."""
    return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))["target_statements"]


def difficulty_histogram(entries: Iterable[dict]) -> dict[int, int]:
    """Count of statements per `difficulty` value."""
    hist: dict[int, int] = {}
    for e in entries:
        hist[e["difficulty"]] = hist.get(e["difficulty"], 0) + 1
    return dict(sorted(hist.items()))


def describe(entries: Sequence[dict]) -> str:
    """A short text summary of a target set: size, disjunctive share, bands, hard split."""
    n = len(entries)
    disjunctive = sum(is_disjunctive(parse_statement(e["theorem"])) for e in entries)
    lines = [f"{n} statements, {disjunctive / n:.1%} with a disjunctive conclusion"]
    for name, low, high in BANDS:
        band = [e for e in entries if low <= e["difficulty"] <= high]
        lines.append(f"  band {name:4s} (difficulty {low}-{high}): {len(band)}")
    if entries and "hard" in entries[0]:
        hard = sum(bool(e["hard"]) for e in entries)
        expected = sum(expected_pass_at(e["base_solve_rate"], 8) for e in entries) / n
        lines.append(f"  hard split: {hard} ({hard / n:.1%}); expected base pass@8 {expected:.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--count", type=int, default=320)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--atoms", type=int)
    ap.add_argument("--premises", type=int)
    ap.add_argument("--depth", type=int)
    ap.add_argument("--distractors", type=int)
    ap.add_argument("--disjunctive-fraction", type=float, default=TARGET_DISJUNCTIVE_FRACTION)
    args = ap.parse_args(argv)
    base = Knobs()
    single = [args.atoms, args.premises, args.depth, args.distractors]
    knob_list = [Knobs(*(v if v is not None else getattr(base, f.name) for v, f in zip(single, dataclasses.fields(Knobs))))]
    if all(v is None for v in single):
        knob_list = POOL_MIX
    items = generate(knob_list, args.count, args.seed, disjunctive_fraction=args.disjunctive_fraction)
    data = to_d3k_json(items)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(items)} statements to {args.out}")
    print(describe(list(data["target_statements"].values())))


if __name__ == "__main__":
    main()
