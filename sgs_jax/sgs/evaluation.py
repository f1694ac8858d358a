"""Best-of-n evaluation of a Solver on a target set: pass@k for every k <= n.

The Solver is asked exactly as in training, through `prove_phase`: the Solver prompt of
`prompts.solver_messages` under the chat template, the run's sampling settings, strict
proof extraction, and the trusted header + statement + extracted proof checked by the
verifier. Each target gets n samples, of which c verify. pass@k is estimated without bias
from (n, c) (Chen et al., 2021, "Evaluating Large Language Models Trained on Code"):

    pass@k = 1 - C(n - c, k) / C(n, k)

the probability that k of the n samples, drawn without replacement, include a verified
one. The set's pass@k is the mean over targets; pass@n is the fraction of targets with
c > 0. A target whose prompt does not fit the Solver's length cap counts as unsolved.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import numpy as np

from sgs_jax.sgs.iteration import prove_chunk_size
from sgs_jax.sgs.phases import PhaseContext, phase_seed, prove_phase
from sgs_jax.sgs.types import Problem, Target

EVAL_PHASE = "eval"  # the seed stream of evaluation (independent of the iteration evaluated)
PER_TARGET_FILE = "per_target.jsonl"
SUMMARY_FILE = "summary.json"
TABLE_FILE = "pass_at_k.md"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c verified samples out of n (1 <= k <= n)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i): no huge binomials for large n.
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


@dataclasses.dataclass(frozen=True)
class TargetResult:
    """One target's samples.

    n: samples drawn (0 when the prompt did not fit the length cap). extracted: samples
    with an extractable proof. c: verified samples. proofs: the distinct verified proofs
    (text after `:= by`), in sampling order.
    """

    id: str
    statement: str
    n: int
    extracted: int
    c: int
    proofs: tuple[str, ...]

    def pass_at(self, k: int) -> float:
        return pass_at_k(self.n, self.c, k) if self.n else 0.0

    def to_json(self, n: int) -> dict[str, Any]:
        """The JSONL record: pass@k for every k <= n (the requested n)."""
        record = {
            "id": self.id,
            "statement": self.statement,
            "n": self.n,
            "c": self.c,
            "extracted": self.extracted,
            "pass_at_k": {str(k): self.pass_at(k) for k in range(1, n + 1)},
            "proofs": list(self.proofs),
        }
        if not self.n:
            record["skipped"] = "the prompt does not fit sampling.solver_max_total_len"
        return record


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """n samples on each of `targets`. status_counts: verifier outcomes by status (only
    extracted proofs are verified). tokens: generated tokens."""

    n: int
    targets: tuple[TargetResult, ...]
    status_counts: dict[str, int]
    tokens: int

    def pass_at_k(self) -> dict[int, float]:
        """k -> the mean of the targets' pass@k, for k = 1..n."""
        return {k: float(np.mean([t.pass_at(k) for t in self.targets])) for k in range(1, self.n + 1)}

    @property
    def solved(self) -> int:
        return sum(t.c > 0 for t in self.targets)

    @property
    def skipped(self) -> int:
        return sum(t.n == 0 for t in self.targets)

    @property
    def extraction_failures(self) -> int:
        return sum(t.n - t.extracted for t in self.targets)


def evaluate_solver(
    ctx: PhaseContext, model, targets: Sequence[Target], n: int, max_total_len: int, seed: int, max_batch: int
) -> Evaluation:
    """Sample n proofs of every target with `model` (the Solver), verify, count.

    Seeds follow the training phases' discipline (`phase_seed`), on a stream of their own
    that does not depend on the iteration, so two Solvers evaluated with the same seed see
    the same sampling noise. max_total_len: the Solver's prompt + generation cap, tokens.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not targets:
        raise ValueError("no targets to evaluate")
    problems = [Problem.from_target(t) for t in targets]
    proved = prove_phase(ctx, model, problems, n, max_total_len, phase_seed(seed, 0, EVAL_PHASE), prove_chunk_size(max_batch, n))
    results = []
    for target, group in zip(targets, proved.attempts):
        proofs = tuple(dict.fromkeys(a.proof for a in group if a.verified))
        results.append(TargetResult(
            id=target.id,
            statement=target.statement,
            n=len(group),
            extracted=sum(a.proof is not None for a in group),
            c=sum(a.verified for a in group),
            proofs=proofs,
        ))
    return Evaluation(n, tuple(results), dict(proved.status_counts), proved.tokens)


def table_ks(n: int) -> list[int]:
    """The k shown in the Markdown table: powers of two below n, and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def markdown_table(evaluation: Evaluation, title: str) -> str:
    """A Markdown section: the title line, the counts, and a pass@k table."""
    rates = evaluation.pass_at_k()
    total = len(evaluation.targets)
    lines = [
        f"**{title}**",
        "",
        f"{total} targets, n = {evaluation.n} samples each; proved at least once: {evaluation.solved}"
        + (f"; {evaluation.skipped} prompts too long (counted unsolved)" if evaluation.skipped else ""),
        "",
        "| k | pass@k | targets (expected) |",
        "|---:|---:|---:|",
    ]
    for k in table_ks(evaluation.n):
        lines.append(f"| {k} | {rates[k]:.1%} | {rates[k] * total:.1f} |")
    return "\n".join(lines) + "\n"


def summary(evaluation: Evaluation, info: dict[str, Any]) -> dict[str, Any]:
    """The aggregate record (`summary.json`): `info` (what was evaluated, how) plus counts."""
    return {
        **info,
        "targets": len(evaluation.targets),
        "n": evaluation.n,
        "pass_at_k": {str(k): v for k, v in evaluation.pass_at_k().items()},
        "solved": evaluation.solved,
        "skipped_prompts": evaluation.skipped,
        "extraction_failures": evaluation.extraction_failures,
        "verify": evaluation.status_counts,
        "tokens": evaluation.tokens,
    }


def write_evaluation(evaluation: Evaluation, out_dir: str | os.PathLike, title: str, info: dict[str, Any]) -> dict[str, str]:
    """Write per-target JSONL, the summary JSON and the Markdown table; returns their paths."""
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in (PER_TARGET_FILE, SUMMARY_FILE, TABLE_FILE)}
    with open(paths[PER_TARGET_FILE], "w", encoding="utf-8") as f:
        for result in evaluation.targets:
            f.write(json.dumps(result.to_json(evaluation.n), ensure_ascii=False) + "\n")
    with open(paths[SUMMARY_FILE], "w", encoding="utf-8") as f:
        json.dump(summary(evaluation, info), f, indent=2)
    with open(paths[TABLE_FILE], "w", encoding="utf-8") as f:
        f.write(markdown_table(evaluation, title))
    return paths
