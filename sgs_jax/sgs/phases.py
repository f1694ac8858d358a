"""The phases of one SGS iteration (method.md §4): conjecture, prove + verify, guide.

Each phase samples with a role's current weights through the shared `Sampler`, turns model
text into typed results with the pure extraction and reward functions, and never raises
on model garbage: malformed outputs are counted and dropped. Verification is submitted
chunk by chunk while the next chunk is still being sampled, so Lean runs on the host CPUs
while the devices generate.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Sequence

import numpy as np

from sgs_jax.models.tokenizer import encode_chat
from sgs_jax.sampling import Completions, Sampler, SamplingParams
from sgs_jax.sampling.shapes import bucket_for
from sgs_jax.sgs import extraction, prompts
from sgs_jax.sgs.progress import sampler_callback
from sgs_jax.sgs.types import Attempt, ChatMessage, Conjecture, GuideScores, Problem, Rollout, Target, token_array
from sgs_jax.sgs.rewards import parse_guide_reply, solve_rate
from sgs_jax.verify import Status, Verifier, VerifyRequest


@dataclasses.dataclass
class PhaseContext:
    """What every phase needs: the sampler, tokenizer, verifier and settings.

    sampler: the Solver's mesh's Sampler (every role's under roles.placement=shared).
    role_samplers: role name -> the Sampler of a role on a sub-mesh of its own (the Guide
    or the Conjecturer under split; a Sampler's programs are compiled for one mesh); `for_role` picks.
    """

    sampler: Sampler
    tokenizer: Any
    verifier: Verifier
    templates: prompts.PromptTemplates
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    progress: Any = None  # a sgs_jax.sgs.progress.RunProgress to show sampling progress (None: quiet)
    role_samplers: dict[str, Sampler] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg, sampler: Sampler, tokenizer, verifier: Verifier, templates: prompts.PromptTemplates,
                    role_samplers: dict[str, Sampler] | None = None) -> "PhaseContext":
        """The context of a run (or of an evaluation with a run's settings): sampling from `cfg.sampling`."""
        return cls(sampler=sampler, tokenizer=tokenizer, verifier=verifier, templates=templates,
                   temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p, top_k=cfg.sampling.top_k,
                   role_samplers=dict(role_samplers or {}))

    def for_role(self, role: str) -> "PhaseContext":
        """This context with `role`'s Sampler (its own sub-mesh's, else `sampler`)."""
        sampler = self.role_samplers.get(role)
        return self if sampler is None else dataclasses.replace(self, sampler=sampler)


def phase_seed(seed: int, iteration: int, phase: str) -> int:
    """A distinct, reproducible sampling seed per (run seed, iteration, phase)."""
    return (seed * 1_000_003 + iteration * 7919 + zlib.crc32(phase.encode())) % (2**31 - 1)


@dataclasses.dataclass(frozen=True)
class Sampled:
    """Prompts that could be sampled, with their token ids and completions.

    indices[i]: position in the caller's list of the i-th sampled prompt (prompts that do
    not fit the length cap are skipped and counted in `skipped`). prompt_ids[i]: its ids
    (read-only int32 array). completions: columnar, rows prompt-major (prompt i's samples
    are `completions.rows_of(i)`).
    """

    indices: tuple[int, ...]
    prompt_ids: tuple[np.ndarray, ...]
    completions: Completions
    skipped: int

    def groups(self):
        """(caller's index, prompt ids, row indices of its samples) per sampled prompt."""
        per_prompt = len(self.completions) // max(1, len(self.indices))
        for i, (index, ids) in enumerate(zip(self.indices, self.prompt_ids)):
            yield index, ids, range(i * per_prompt, (i + 1) * per_prompt)


def sample_messages(
    ctx: PhaseContext,
    model,
    messages: Sequence[Sequence[ChatMessage]],
    num_samples: int,
    max_new_tokens: int,
    max_total_len: int | None,
    seed: int,
) -> Sampled:
    """Encode chat prompts, drop those that cannot fit, and sample `num_samples` each.

    max_total_len: cap on prompt + generation (the Solver's); None caps generation alone
    (`max_new_tokens` after the longest prompt, whose length is rounded up to its prompt
    bucket so that the sampler's page-table width, a compiled shape, changes only with it).
    """
    encoded = [encode_chat(ctx.tokenizer, [m.as_dict() for m in msgs]) for msgs in messages]
    if max_total_len is None:
        longest = max((len(e) for e in encoded), default=1)
        max_total_len = max_new_tokens + bucket_for(longest, ctx.sampler.prompt_buckets)
    params = SamplingParams(
        temperature=ctx.temperature,
        top_p=ctx.top_p,
        top_k=ctx.top_k,
        max_new_tokens=max_new_tokens,
        max_total_len=max_total_len,
        num_samples=num_samples,
        seed=seed,
    )
    problems = ctx.sampler.validate_prompts(encoded, params)
    indices = tuple(i for i in range(len(encoded)) if i not in problems)
    ids = tuple(token_array(encoded[i]) for i in indices)
    completions = (ctx.sampler.generate(model, ids, params, tokenizer=ctx.tokenizer, progress=sampler_callback(ctx.progress))
                   if ids else Completions.empty())
    return Sampled(indices, ids, completions, len(problems))


# ---- conjecture ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ConjecturePhase:
    """kept: conjectures after extraction and dedup; rollouts[i] produced kept[i].
    prompt_ids: target id -> the Conjecturer prompt's token ids."""

    kept: tuple[Conjecture, ...]
    rollouts: tuple[Rollout, ...]
    prompt_ids: dict[str, np.ndarray]
    generated: int  # Conjecturer samples drawn (malformed ones included)
    malformed: int
    duplicates: int
    skipped_prompts: int
    tokens: int


def conjecture_phase(
    ctx: PhaseContext,
    model,
    targets: Sequence[Target],
    all_target_statements: Sequence[str],
    per_target: int,
    condition_on_target: bool,
    max_new_tokens: int,
    seed: int,
) -> ConjecturePhase:
    """One (or `per_target`) conjecture per unsolved target; extract, then drop duplicates."""
    messages = [prompts.conjecturer_messages(t, condition_on_target, ctx.templates) for t in targets]
    sampled = sample_messages(ctx, model, messages, per_target, max_new_tokens, None, seed)
    out = sampled.completions
    candidates, rollouts, malformed = [], {}, 0
    prompt_ids = {}
    for index, ids, rows in sampled.groups():
        target = targets[index]
        prompt_ids[target.id] = ids
        for row in rows:
            result = extraction.extract_conjecture(out.text(row) or "")
            if not result.ok:
                malformed += 1
                continue
            conjecture = Conjecture.create(target.id, result.text)
            if conjecture.id not in rollouts:
                rollouts[conjecture.id] = Rollout.from_row(target.id, out, row)
            candidates.append(conjecture)
    kept, dropped = extraction.dedup_conjectures(candidates, all_target_statements)
    generated, tokens = len(out), int(out.lengths.sum())
    return ConjecturePhase(
        kept=kept,
        rollouts=tuple(rollouts[c.id] for c in kept),
        prompt_ids=prompt_ids,
        generated=generated,
        malformed=malformed,
        duplicates=len(dropped),
        skipped_prompts=sampled.skipped,
        tokens=tokens,
    )


@dataclasses.dataclass(frozen=True)
class StatementCheck:
    """conjectures: the phase with its ill-formed conjectures (and their rollouts) dropped.
    ill_formed: dropped. errors: checks that ended in a system error or timeout (kept)."""

    conjectures: ConjecturePhase
    ill_formed: int
    errors: int


def statement_check_phase(ctx: PhaseContext, conj: ConjecturePhase, headers: dict[str, str]) -> StatementCheck:
    """Elaborate every kept conjecture with `sorry` (`Verifier.check_statement`) under its
    target's header, and drop those that do not elaborate before k proofs are spent on
    them. A check that could not decide (system error, timeout) keeps the conjecture."""
    futures = [ctx.verifier.check_statement(headers[c.target_id], c.statement) for c in conj.kept]
    statuses = [f.result().status for f in futures]
    undecided = (Status.SYSTEM_ERROR, Status.TIMEOUT)
    keep = [s is Status.VERIFIED or s in undecided for s in statuses]
    checked = dataclasses.replace(
        conj,
        kept=tuple(c for c, k in zip(conj.kept, keep) if k),
        rollouts=tuple(r for r, k in zip(conj.rollouts, keep) if k),
    )
    return StatementCheck(checked, keep.count(False), sum(s in undecided for s in statuses))


# ---- prove + verify -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProvePhase:
    """attempts[i]: the k attempts of problems[i] (empty when its prompt could not fit).
    prompt_ids: problem id -> Solver prompt token ids. entropies: mean per-token entropy
    of each sample (nats). status_counts: verification outcomes by status."""

    attempts: tuple[tuple[Attempt, ...], ...]
    prompt_ids: dict[str, np.ndarray]
    entropies: tuple[float, ...]
    status_counts: dict[str, int]
    extraction_failures: int
    skipped_prompts: int
    tokens: int
    verify_seconds: float

    def solve_rates(self) -> list[float]:
        """s(x) per problem; 0 for problems that could not be attempted."""
        return [solve_rate(group) if group else 0.0 for group in self.attempts]


def prove_phase(
    ctx: PhaseContext,
    model,
    problems: Sequence[Problem],
    k: int,
    max_total_len: int,
    seed: int,
    chunk_problems: int,
) -> ProvePhase:
    """k proofs per problem, verified as each chunk of problems finishes sampling."""
    pending: list[tuple[int, Rollout, str | None, Any]] = []  # (problem index, rollout, proof, future)
    prompt_ids: dict[str, np.ndarray] = {}
    entropies: list[float] = []
    skipped = failures = tokens = 0
    # One pool for the phase's chunks: allocating it per chunk costs more than a short chunk's
    # decoding; released before training, which needs the memory.
    with ctx.sampler.keep_pool():
        for start in range(0, len(problems), chunk_problems):
            chunk = problems[start : start + chunk_problems]
            messages = [prompts.solver_messages(p, ctx.templates) for p in chunk]
            # The cap is on prompt + generation; `max_new_tokens` never binds before it.
            sampled = sample_messages(ctx, model, messages, k, max_total_len, max_total_len, seed + start)
            skipped += sampled.skipped
            out = sampled.completions
            tokens += int(out.lengths.sum())
            entropies += out.mean_entropies()[out.lengths > 0].tolist()
            for local, ids, rows in sampled.groups():
                problem = chunk[local]
                prompt_ids[problem.id] = ids
                for row in rows:
                    rollout = Rollout.from_row(problem.id, out, row)
                    result = extraction.extract_proof(rollout.text)
                    future = None
                    if result.ok:
                        future = ctx.verifier.submit(VerifyRequest(problem.header, problem.statement, result.text))
                    else:
                        failures += 1
                    pending.append((start + local, rollout, result.text, future))
    groups: list[list[Attempt]] = [[] for _ in problems]
    counts: dict[str, int] = {s.value: 0 for s in Status}
    verify_seconds = 0.0
    for index, rollout, proof, future in pending:
        verified = False
        if future is not None:
            verdict = future.result()
            counts[verdict.status.value] += 1
            verify_seconds += verdict.time_s
            verified = verdict.verified
        groups[index].append(Attempt(rollout, proof, verified))
    return ProvePhase(
        attempts=tuple(tuple(g) for g in groups),
        prompt_ids=prompt_ids,
        entropies=tuple(entropies),
        status_counts=counts,
        extraction_failures=failures,
        skipped_prompts=skipped,
        tokens=tokens,
        verify_seconds=verify_seconds,
    )


# ---- guide --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GuidePhase:
    """scores[i]: parsed rubric scores of pair i, None when the reply was unparsable.
    replies[i]: the reply's text (None when the prompt did not fit)."""

    scores: tuple[GuideScores | None, ...]
    parse_failures: int
    tokens: int
    replies: tuple[str | None, ...] = ()


def guide_phase(
    ctx: PhaseContext,
    model,
    pairs: Sequence[tuple[str, str]],
    max_new_tokens: int,
    seed: int,
) -> GuidePhase:
    """Score (target statement, conjecture statement) pairs with the frozen Guide."""
    if not pairs:
        return GuidePhase((), 0, 0)
    messages = [prompts.guide_messages(target, conj, ctx.templates) for target, conj in pairs]
    sampled = sample_messages(ctx, model, messages, 1, max_new_tokens, None, seed)
    scores: list[GuideScores | None] = [None] * len(pairs)
    replies: list[str | None] = [None] * len(pairs)
    for index, _, rows in sampled.groups():
        replies[index] = sampled.completions.text(rows[0]) or ""
        scores[index] = parse_guide_reply(replies[index])
    return GuidePhase(tuple(scores), sum(s is None for s in scores), int(sampled.completions.lengths.sum()), tuple(replies))
