"""Random target sets of provable propositional statements, in the D3k JSON format.

Knobs (`Knobs`): number of atoms, of premises, formula depth, and distractor premises
(extra hypotheses that the proof does not need). A statement is kept only if it is
intuitionistically provable, its premises are satisfiable (no ex-falso freebies), its
conclusion is not literally a premise, and it is new. Each entry records the prover's
proof length as `difficulty`.

    python -m sgs_jax.testbed.generator --out sgs_jax/testbed/data/targets.json
regenerates the packaged default set (fixed seed; `--count`, `--seed`, or a single knob
setting with `--atoms/--premises/--depth/--distractors`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import random
from typing import Iterable, Optional

from sgs_jax.testbed.formula import (FALSE, TRUE, And, Atom, Formula, Iff, Imp, Not, Or, evaluate,
                                     atoms as atoms_of, unfold_not)
from sgs_jax.testbed.parser import Statement
from sgs_jax.testbed.prover import SearchBudgetExceeded, prove_statement

ATOM_NAMES = ("p", "q", "r", "s", "t", "u")
HYP_NAMES = tuple(f"h{d}" for d in "₀₁₂₃₄₅₆₇₈₉")
MAX_LENGTH = 60  # longer proofs do not fit a tiny model's context
DEFAULT_PATH = pathlib.Path(__file__).resolve().parent / "data" / "targets.json"

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
    statement: Statement
    proof: str
    difficulty: int
    knobs: Knobs


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
                 max_nodes: int = 20_000, max_length: int = MAX_LENGTH) -> Optional[Generated]:
    """Rejection-sample one provable statement with these knobs whose prover proof has
    2..max_length tactics (None if none found)."""
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
        try:
            result = prove_statement(statement, max_nodes)
        except SearchBudgetExceeded:
            continue
        if result.provable and 2 <= result.length <= max_length:
            return Generated(statement, result.proof_text(), result.length, knobs)
    return None


def generate(knob_list: list[Knobs], count: int, seed: int, prefix: str = "prop") -> list[Generated]:
    """`count` distinct statements, cycling through `knob_list`, reproducible from `seed`."""
    rng = random.Random(seed)
    out, seen = [], set()
    attempts = 0
    while len(out) < count and attempts < count * 20:
        knobs = knob_list[attempts % len(knob_list)]
        attempts += 1
        item = generate_one(rng, knobs, f"{prefix}_{len(out):04d}")
        if item is None:
            continue
        key = (item.statement.hypotheses, item.statement.conclusion)
        if key in seen:
            continue
        seen.add(key)
        out.append(item)
    return out


# The default mix: from one-step exercises to multi-premise, distractor-laden ones.
DEFAULT_MIX = [
    Knobs(atoms=2, premises=0, depth=2),
    Knobs(atoms=2, premises=1, depth=2),
    Knobs(atoms=3, premises=2, depth=2),
    Knobs(atoms=3, premises=2, depth=2, distractors=1),
    Knobs(atoms=3, premises=1, depth=3),
    Knobs(atoms=3, premises=3, depth=3, distractors=1),
    Knobs(atoms=4, premises=3, depth=3),
    Knobs(atoms=4, premises=2, depth=4, distractors=2),
]


def to_d3k_json(items: list[Generated], source: str = "prop_testbed") -> dict:
    """The D3k target-set format, plus `difficulty` (prover proof length) and `knobs`."""
    targets = {}
    for item in items:
        sid = item.statement.name
        targets[sid] = {
            "id": sid,
            "header": "",
            "theorem": item.statement.lean(),
            "tag": "statement",
            "source": source,
            "proofs": [],
            "difficulty": item.difficulty,
            "knobs": dataclasses.asdict(item.knobs),
        }
    return {"iterations": [], "target_statements": targets}


def load_targets(path: pathlib.Path | str = DEFAULT_PATH) -> dict:
    """The `target_statements` mapping of a target-set file (the packaged one by default)."""
    return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))["target_statements"]


def difficulty_histogram(entries: Iterable[dict]) -> dict[int, int]:
    """Count of statements per `difficulty` value."""
    hist: dict[int, int] = {}
    for e in entries:
        hist[e["difficulty"]] = hist.get(e["difficulty"], 0) + 1
    return dict(sorted(hist.items()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--count", type=int, default=320)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--atoms", type=int)
    ap.add_argument("--premises", type=int)
    ap.add_argument("--depth", type=int)
    ap.add_argument("--distractors", type=int)
    args = ap.parse_args(argv)
    single = [args.atoms, args.premises, args.depth, args.distractors]
    if any(v is not None for v in single):
        base = Knobs()
        knob_list = [Knobs(*(v if v is not None else getattr(base, f.name)
                             for v, f in zip(single, dataclasses.fields(Knobs))))]
    else:
        knob_list = DEFAULT_MIX
    items = generate(knob_list, args.count, args.seed)
    data = to_d3k_json(items)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    hist = difficulty_histogram(data["target_statements"].values())
    print(f"wrote {len(items)} statements to {args.out}")
    print("difficulty (prover proof length): count")
    for lo in range(0, max(hist) + 1, 5):
        n = sum(c for length, c in hist.items() if lo <= length < lo + 5)
        if n:
            print(f"  {lo:3d}-{lo + 4:<3d}: {n:4d} {'#' * (n // 2)}")


if __name__ == "__main__":
    main()
