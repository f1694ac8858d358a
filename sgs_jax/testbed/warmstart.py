"""Supervised warm-start sets for the three roles, in the real roles' prompt formats.

- Solver: prompt = the Solver prompt for (header, statement); completion = a ```lean4
  block with the statement and the prover's proof.
- Conjecturer: prompt = the Conjecturer prompt for a target; completion = a ```lean4
  block with a lemma taken from a sequent of the target's derivation (the one the
  teacher scores best), ending in `:= by sorry`.
- Guide: prompt = the Guide prompt for (target, conjecture); completion = the teacher's
  reply. Conjectures mix useful lemmas with random, redundant and disjunction-heavy ones.
Each line of a JSONL file is {"messages": [{"role": "user", "content": ...}], "completion": ...}.
The prompt builders are parameters; the defaults mirror SPEC Sections 4 and 6 and the
packaged templates of `sgs_jax/sgs/prompts.py` (the lead may pass those functions in).

    python -m sgs_jax.testbed.warmstart --out runs/warmstart
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import random
from typing import Callable, Iterable

from sgs_jax.testbed.formula import Bot, Or, Top, atoms, unfold_not
from sgs_jax.testbed.generator import DEFAULT_MIX, ATOM_NAMES, HYP_NAMES, generate, random_formula
from sgs_jax.testbed.parser import Statement, parse_statement
from sgs_jax.testbed.prover import prove_statement
from sgs_jax.testbed.teacher import score

PromptBuilder = Callable[..., str]
# Regenerate with: python -m sgs_jax.testbed.warmstart --write-corpus 1024 --seed 1
CORPUS_PATH = pathlib.Path(__file__).resolve().parent / "data" / "warmstart_corpus.jsonl.gz"


def solver_prompt(header: str, statement: str) -> str:
    """SPEC Section 4 step 3 (DeepSeek-Prover-V2 format)."""
    return f"Complete the following Lean 4 code:\n\n```lean4\n{header}{statement}\n```"


def conjecturer_prompt(header: str, statement: str) -> str:
    """SPEC Section 4 step 2: show the target, ask for a related, simpler, useful lemma."""
    return (
        f"Here is a Lean 4 theorem that we want to prove:\n\n```lean4\n{header}{statement}\n```\n\n"
        "Write one new Lean 4 theorem that would help with proving it. It must be related and "
        "useful, easier to prove, and not the same theorem renamed. Do not prove it: end the "
        "statement with `:= by sorry`. Put the new theorem, and nothing else, in one ```lean4 "
        "code block at the end of your answer."
    )


def guide_prompt(target: str, conjecture: str) -> str:
    """SPEC Section 6: rubric, target and conjecture (statements without header)."""
    return (
        "You are reviewing an auxiliary conjecture that was proposed to help prove a target theorem.\n\n"
        f"Target theorem:\n```lean4\n{target}\n```\n\nProposed conjecture:\n```lean4\n{conjecture}\n```\n\n"
        "Score relevance (0-5), redundancy (0 or 1) and conclusion complexity (0-4), then write:\n"
        "<begin_relevance_score> N <end_relevance_score>\n"
        "<begin_redundancy_score> N <end_redundancy_score>\n"
        "<begin_conclusion_complexity_score> N <end_conclusion_complexity_score>"
    )


def _row(prompt: str, completion: str) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "completion": completion}


def solver_example(header: str, statement: str, proof: str, build: PromptBuilder = solver_prompt) -> dict:
    """proof: the tactic lines after `:= by`, already indented."""
    return _row(build(header, statement), f"```lean4\n{statement}\n{proof}\n```")


def _guide_value(s) -> int:
    # Eq. 3 of SPEC Section 6, used here only to rank candidate lemmas.
    if s.complexity >= 3:
        return 0
    return max(0, s.relevance + (2 - s.complexity) + (1 - s.redundancy))


def lemma_candidates(target: Statement) -> list[Statement]:
    """Statements of the non-trivial sequents on the prover's derivation of `target`."""
    result = prove_statement(target)
    out, seen = [], set()
    for hyps, goal in result.sequents[1:]:
        if isinstance(goal, (Top, Bot)) or any(unfold_not(h) == unfold_not(goal) for h in hyps):
            continue
        used = set().union(atoms(goal), *(atoms(h) for h in hyps))
        key = (hyps, goal)
        if key in seen or not atoms(goal):
            continue
        seen.add(key)
        names = tuple(a for a in target.atoms if a in used)
        out.append(Statement(f"{target.name}_aux", names, tuple(zip(HYP_NAMES, hyps)), goal))
    return out


def best_lemma(target: Statement) -> Statement | None:
    """The candidate lemma with the highest teacher value (None if none scores > 0)."""
    best, best_value = None, 0
    for cand in lemma_candidates(target):
        value = _guide_value(score(target.lean(), cand.lean()))
        if value > best_value:
            best, best_value = cand, value
    return best


def conjecturer_example(header: str, target: Statement, lemma: Statement,
                        build: PromptBuilder = conjecturer_prompt) -> dict:
    return _row(build(header, target.lean()), f"```lean4\n{lemma.lean()} sorry\n```")


def bad_conjectures(rng: random.Random, target: Statement) -> list[Statement]:
    """Conjectures the Guide should dislike: unrelated, redundant, disjunction-heavy."""
    names = ATOM_NAMES[:5]
    junk = [random_formula(rng, names, 2) for _ in range(4)]
    disj = junk[0]
    for f in junk[1:]:
        disj = Or(disj, f)
    base_hyps = target.hypotheses
    extra = random_formula(rng, names, 1)
    return [
        Statement(f"{target.name}_aux", names, tuple(zip(HYP_NAMES, junk[:1])), junk[1]),
        Statement(f"{target.name}_aux", names, tuple(zip(HYP_NAMES, [f for _, f in base_hyps] + [extra])),
                  target.conclusion),
        Statement(f"{target.name}_aux", names, (), disj),
    ]


def corpus_record(header: str, text: str, rng: random.Random) -> dict | None:
    """The prompt-free material of one statement (None if unprovable): its proof, the
    best lemma for the Conjecturer, and (conjecture, teacher reply) pairs for the Guide."""
    target = parse_statement(text)
    result = prove_statement(target)
    if not result.provable:
        return None
    lemma = best_lemma(target)
    pairs = bad_conjectures(rng, target) + ([lemma] if lemma is not None else [])
    return {
        "header": header,
        "statement": text,
        "proof": result.proof_text(),
        "lemma": None if lemma is None else lemma.lean(),
        "guide": [[conj.lean(), score(text, conj.lean()).reply()] for conj in pairs],
    }


def rows_from_records(
    records: Iterable[dict],
    builders: tuple[PromptBuilder, PromptBuilder, PromptBuilder] = (solver_prompt, conjecturer_prompt, guide_prompt),
) -> dict[str, list[dict]]:
    """Warm-start rows for 'solver', 'conjecturer' and 'guide' from corpus records."""
    build_solver, build_conj, build_guide = builders
    sets: dict[str, list[dict]] = {"solver": [], "conjecturer": [], "guide": []}
    for rec in records:
        header, text = rec["header"], rec["statement"]
        sets["solver"].append(solver_example(header, text, rec["proof"], build_solver))
        if rec["lemma"] is not None:
            sets["conjecturer"].append(_row(build_conj(header, text), f"```lean4\n{rec['lemma']} sorry\n```"))
        for conj, reply in rec["guide"]:
            sets["guide"].append(_row(build_guide(text, conj), reply))
    return sets


def build_sets(targets: Iterable[tuple[str, str]], seed: int = 0,
               builders: tuple[PromptBuilder, PromptBuilder, PromptBuilder] = (solver_prompt, conjecturer_prompt, guide_prompt),
               ) -> dict[str, list[dict]]:
    """Warm-start rows for 'solver', 'conjecturer' and 'guide' from (header, statement) pairs."""
    rng = random.Random(seed)
    records = [corpus_record(header, text, rng) for header, text in targets]
    return rows_from_records([r for r in records if r is not None], builders)


def load_corpus(path: pathlib.Path | str = CORPUS_PATH) -> list[dict]:
    """The packaged warm-start corpus (statements disjoint from the default target set)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_corpus(count: int, seed: int, path: pathlib.Path | str = CORPUS_PATH) -> int:
    """Generate `count` fresh statements (prefix `warm`) and write their records, gzipped."""
    items = generate(DEFAULT_MIX, count, seed, prefix="warm")
    rng = random.Random(seed)
    records = [r for r in (corpus_record("", it.statement.lean(), rng) for it in items) if r is not None]
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return len(records)


def write_jsonl(rows: list[dict], path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write Solver/Conjecturer/Guide warm-start JSONL sets.")
    ap.add_argument("--out", type=pathlib.Path, help="write the three JSONL sets here")
    ap.add_argument("--write-corpus", type=int, metavar="N", help="regenerate the packaged corpus with N statements")
    ap.add_argument("--count", type=int, default=400, help="fresh statements (disjoint seed from the target set)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.write_corpus:
        print(f"{write_corpus(args.write_corpus, args.seed)} records -> {CORPUS_PATH}")
        return
    if args.out is None:
        ap.error("--out or --write-corpus is required")
    items = generate(DEFAULT_MIX, args.count, args.seed, prefix="warm")
    sets = build_sets((("", it.statement.lean()) for it in items), seed=args.seed)
    for role, rows in sets.items():
        write_jsonl(rows, args.out / f"{role}.jsonl")
        print(f"{role}: {len(rows)} rows -> {args.out / (role + '.jsonl')}")


if __name__ == "__main__":
    main()
