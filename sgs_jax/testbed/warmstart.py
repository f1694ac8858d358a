"""Supervised warm-start sets for the three roles, in the real roles' prompt formats.

- Solver: prompt = the Solver prompt for (header, statement); completion = a ```lean4
  block with the statement and its pruned prover proof.
- Conjecturer: prompt = the Conjecturer prompt for a target; completion = a ```lean4
  block with a lemma ending in `:= by sorry`: one of the best few sequents of the
  target's derivation (ranked by the Guide teacher) or, for a small share of targets
  (`HACK_ROW_FRACTION`), one of the reward hacks of `hacks.py`, as a pretrained prover
  writes padded and trivial statements now and then. Without these the hacks would lie
  outside what the Conjecturer ever samples, and no reward could teach them.
- Guide: prompt = the Guide prompt for (target, conjecture); completion = the teacher's
  reply. Conjectures mix useful lemmas, the three hacks, and random, redundant and
  disjunction-heavy ones.
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

from sgs_jax.testbed.formula import Bot, Formula, Or, Top, atoms, conjuncts, unfold_not
from sgs_jax.testbed.hacks import provable
from sgs_jax.testbed.generator import (ATOM_NAMES, CORPUS_DISJUNCTIVE_FRACTION, DEFAULT_MIX, HYP_NAMES, candidate_pool,
                                       generate, random_formula, statement_body)
from sgs_jax.testbed.parser import Statement, parse_statement
from sgs_jax.testbed.prover import prove_statement
from sgs_jax.testbed.prune import prune_proof
from sgs_jax.testbed.teacher import score

PromptBuilder = Callable[..., str]
# Regenerate with: python -m sgs_jax.testbed.warmstart --write-corpus 4096 --seed 1
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


LEMMAS_PER_TARGET = 3  # lemmas a corpus record keeps: the statement's best few
ROW_LEMMAS = 2  # of which each statement's Conjecturer rows teach at most this many
GOOD_LEMMA_VALUE = 5  # Eq. 3 value (0..8) a lemma needs to be taught (the best one is kept regardless)
GUIDE_LEMMAS = 2  # useful lemmas among each statement's Guide pairs
HACK_ROW_FRACTION = 0.1  # share of Conjecturer rows that are hacks (one hack per chosen statement)


def _guide_value(s) -> int:
    # Eq. 3 of SPEC Section 6, used here only to rank candidate lemmas.
    if s.complexity >= 3:
        return 0
    return max(0, s.relevance + (2 - s.complexity) + (1 - s.redundancy))


def _conjecture(target: Statement, hyps: Iterable[Formula], conclusion: Formula) -> Statement:
    """A statement named after `target`, binding exactly the atoms it uses (target order)."""
    hyps = tuple(hyps)
    used = set().union(atoms(conclusion), *(atoms(h) for h in hyps))
    names = tuple(a for a in target.atoms if a in used)
    return Statement(f"{target.name}_aux", names, tuple(zip(HYP_NAMES, hyps)), conclusion)


def needed_hypotheses(hyps: tuple[Formula, ...], goal: Formula) -> tuple[Formula, ...]:
    """`hyps` without those `hyps ⊢ goal` does not need (dropped greedily, last first)."""
    kept = list(hyps)
    for i in reversed(range(len(kept))):
        rest = tuple(kept[:i] + kept[i + 1 :])
        if provable(rest, goal):
            kept = list(rest)
    return tuple(kept)


def lemma_candidates(target: Statement) -> list[Statement]:
    """Statements of the non-trivial sequents on the prover's derivation of `target`,
    each with only the hypotheses it needs."""
    result = prove_statement(target)
    out, seen = [], set()
    for hyps, goal in result.sequents[1:]:
        if isinstance(goal, (Top, Bot)) or any(unfold_not(h) == unfold_not(goal) for h in hyps):
            continue
        hyps = needed_hypotheses(hyps, goal)
        key = (hyps, goal)
        if key in seen or not atoms(goal) or len(hyps) > len(HYP_NAMES):
            continue
        seen.add(key)
        out.append(_conjecture(target, hyps, goal))
    return out


def ranked_lemmas(target: Statement) -> list[tuple[Statement, int]]:
    """Candidate lemmas with their teacher value (Eq. 3), best first (ties: derivation order)."""
    scored = [(cand, _guide_value(score(target.lean(), cand.lean()))) for cand in lemma_candidates(target)]
    return sorted(scored, key=lambda sv: -sv[1])


def good_lemmas(ranked: list[tuple[Statement, int]], limit: int = LEMMAS_PER_TARGET) -> list[Statement]:
    """The lemmas worth teaching: up to `limit` of value >= GOOD_LEMMA_VALUE, and at least
    the best one when it scores above 0."""
    good = [lemma for lemma, value in ranked if value >= GOOD_LEMMA_VALUE][:limit]
    if not good and ranked and ranked[0][1] > 0:
        good = [ranked[0][0]]
    return good


def hack_conjectures(rng: random.Random, target: Statement, lemma: Statement) -> list[Statement]:
    """One conjecture per reward hack of `hacks.py`, built around a useful `lemma`:
    its conclusion padded with a given disjunct, a conjunct of a premise restated, and the
    lemma with a hypothesis it does not need."""
    hyps, goal = [f for _, f in lemma.hypotheses], lemma.conclusion
    given = [f for _, f in target.hypotheses] or hyps
    out = []
    if given:
        extra = rng.choice(given)
        padded = Or(goal, extra) if rng.random() < 0.5 else Or(extra, goal)
        out.append(_conjecture(target, hyps if extra in hyps else hyps + [extra], padded))
        premise = rng.choice(given)
        out.append(_conjecture(target, given, rng.choice(conjuncts(premise))))
    unused = [f for f in given if f not in hyps] or [random_formula(rng, target.atoms or ATOM_NAMES[:2], 1)]
    if len(hyps) < len(HYP_NAMES):
        out.append(_conjecture(target, hyps + [rng.choice(unused)], goal))
    return out


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
    """The prompt-free material of one statement (None if unprovable): its pruned proof,
    the lemmas to teach the Conjecturer, hack conjectures, and (conjecture, teacher
    reply) pairs for the Guide."""
    target = parse_statement(text)
    result = prove_statement(target)
    if not result.provable:
        return None
    lemmas = good_lemmas(ranked_lemmas(target))
    hacks = hack_conjectures(rng, target, lemmas[0]) if lemmas else []
    pairs = lemmas[:GUIDE_LEMMAS] + hacks + bad_conjectures(rng, target)
    return {
        "header": header,
        "statement": text,
        "proof": prune_proof(target, result.proof_text()),
        "lemmas": [lemma.lean() for lemma in lemmas],
        "hacks": [h.lean() for h in hacks],
        "guide": [[conj.lean(), score(text, conj.lean()).reply()] for conj in pairs],
    }


def rows_from_records(
    records: Iterable[dict],
    builders: tuple[PromptBuilder, PromptBuilder, PromptBuilder] = (solver_prompt, conjecturer_prompt, guide_prompt),
    hack_fraction: float = HACK_ROW_FRACTION,
    seed: int = 0,
    row_lemmas: int = ROW_LEMMAS,
) -> dict[str, list[dict]]:
    """Warm-start rows for 'solver', 'conjecturer' and 'guide' from corpus records.

    The Conjecturer rows are each statement's best `row_lemmas` lemmas plus hacks, one
    each for randomly chosen statements (seeded), a `hack_fraction` share of all rows."""
    build_solver, build_conj, build_guide = builders
    records = list(records)
    sets: dict[str, list[dict]] = {"solver": [], "conjecturer": [], "guide": []}

    def conj_row(rec: dict, lemma: str) -> dict:
        return _row(build_conj(rec["header"], rec["statement"]), f"```lean4\n{lemma} sorry\n```")

    for rec in records:
        sets["solver"].append(solver_example(rec["header"], rec["statement"], rec["proof"], build_solver))
        sets["conjecturer"] += [conj_row(rec, lemma) for lemma in rec["lemmas"][:row_lemmas]]
        sets["guide"] += [_row(build_guide(rec["statement"], conj), reply) for conj, reply in rec["guide"]]
    rng = random.Random(seed)
    with_hacks = [rec for rec in records if rec["hacks"]]
    wanted = round(hack_fraction / (1.0 - hack_fraction) * len(sets["conjecturer"])) if hack_fraction < 1 else 0
    for rec in rng.sample(with_hacks, min(wanted, len(with_hacks))):
        sets["conjecturer"].append(conj_row(rec, rng.choice(rec["hacks"])))
    return sets


def build_sets(targets: Iterable[tuple[str, str]], seed: int = 0,
               builders: tuple[PromptBuilder, PromptBuilder, PromptBuilder] = (solver_prompt, conjecturer_prompt, guide_prompt),
               ) -> dict[str, list[dict]]:
    """Warm-start rows for 'solver', 'conjecturer' and 'guide' from (header, statement) pairs."""
    rng = random.Random(seed)
    records = [corpus_record(header, text, rng) for header, text in targets]
    return rows_from_records([r for r in records if r is not None], builders, seed=seed)


def load_corpus(path: pathlib.Path | str = CORPUS_PATH) -> list[dict]:
    """The packaged warm-start corpus (statements disjoint from the target candidate pool)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def corpus_statements(count: int, seed: int) -> list[str]:
    """`count` fresh statements (prefix `warm`), none equal to a target candidate."""
    pool = {statement_body(g.statement.lean()) for g in candidate_pool()}
    items = generate(DEFAULT_MIX, count + count // 4, seed, prefix="warm", disjunctive_fraction=CORPUS_DISJUNCTIVE_FRACTION)
    return [text for text in (it.statement.lean() for it in items) if statement_body(text) not in pool][:count]


def write_corpus(count: int, seed: int, path: pathlib.Path | str = CORPUS_PATH) -> int:
    """Generate `count` fresh statements and write their records, gzipped."""
    rng = random.Random(seed)
    records = [r for r in (corpus_record("", text, rng) for text in corpus_statements(count, seed)) if r is not None]
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
    sets = build_sets((("", text) for text in corpus_statements(args.count, args.seed)), seed=args.seed)
    for role, rows in sets.items():
        write_jsonl(rows, args.out / f"{role}.jsonl")
        print(f"{role}: {len(rows)} rows -> {args.out / (role + '.jsonl')}")


if __name__ == "__main__":
    main()
