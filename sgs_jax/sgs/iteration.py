"""One SGS iteration (Algorithm 1, full batch): phases in order, rewards, updates, metrics.

`run_iteration` is the whole of method.md §4 steps 1-10 for one iteration; it mutates
only the target set (new proofs), the Expert Iteration buffer and the role weights (through
their trainers), and returns the iteration's metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from sgs_jax import metrics as M
from sgs_jax.analysis.statements import summarize_statements
from sgs_jax.faults import fault_point
from sgs_jax.rl.batching import SequenceExample
from sgs_jax.rl.train_step import epoch_metric
from sgs_jax.sgs import rewards
from sgs_jax.sgs.phases import (GuidePhase, PhaseContext, conjecture_phase, guide_phase, phase_seed, prove_phase,
                                statement_check_phase)
from sgs_jax.sgs.progress import phase
from sgs_jax.sgs.roles import CONJECTURER, GUIDE, SOLVER, Roles
from sgs_jax.sgs.statement_facts import statement_fractions
from sgs_jax.sgs.target_set import TargetSet
from sgs_jax.sgs.types import TARGET, Problem


@dataclasses.dataclass(frozen=True)
class IterationSettings:
    """The loop's knobs, read once from the config (see configs/base.py for meanings)."""

    seed: int
    use_conjecturer: bool
    train_conjecturer: bool
    condition_on_target: bool
    use_guide: bool
    conjectures_per_target: int
    k: int
    keep_quantile: float
    solver_objective: str
    token_aware_try: bool
    solver_max_total_len: int
    conjecturer_max_new_tokens: int
    guide_max_new_tokens: int
    chunk_problems: int
    check_conjecture_statement: bool = False
    shadow_guide: bool = False
    exact_statement_facts: bool = False

    @classmethod
    def from_config(cls, cfg) -> "IterationSettings":
        return cls(
            seed=cfg.run.seed,
            use_conjecturer=cfg.sgs.use_conjecturer,
            train_conjecturer=cfg.sgs.train_conjecturer,
            condition_on_target=cfg.sgs.condition_on_target,
            use_guide=cfg.sgs.use_guide,
            conjectures_per_target=cfg.sgs.conjectures_per_target,
            k=cfg.sgs.proofs_per_problem,
            keep_quantile=cfg.sgs.keep_quantile,
            solver_objective=cfg.sgs.solver_objective,
            token_aware_try=cfg.sgs.token_aware_try,
            solver_max_total_len=cfg.sampling.solver_max_total_len,
            conjecturer_max_new_tokens=cfg.sampling.conjecturer_max_new_tokens,
            guide_max_new_tokens=cfg.sampling.guide_max_new_tokens,
            chunk_problems=prove_chunk_size(cfg.sampling.max_batch, cfg.sgs.proofs_per_problem),
            check_conjecture_statement=cfg.sgs.check_conjecture_statement,
            shadow_guide=cfg.guide.shadow_score and not cfg.sgs.use_guide,
            # The testbed's statements can be analysed exactly; Lean text only heuristically.
            exact_statement_facts=cfg.verify.backend == "prop",
        )


def prove_chunk_size(max_batch: int, k: int) -> int:
    """Problems per sampling call of the prove phase (k samples each): enough to keep the
    sampler's `max_batch` slots full, few enough that verification of one chunk overlaps
    the next one's sampling."""
    return max(1, 4 * max_batch // k)


def _solver_data(settings: IterationSettings, proved, new_proofs, ei_buffer) -> tuple[list, list[SequenceExample]]:
    """Step 8: the Solver's training samples and their sequences (method.md §4 step 8, §5)."""
    groups, max_tokens, try_rule = proved.attempts, settings.solver_max_total_len, settings.token_aware_try
    if settings.solver_objective == "expert_iteration":
        ei_buffer.add_iteration(rewards.expert_iteration_samples(groups, new_proofs, proved.prompt_ids, try_rule))
        samples = ei_buffer.samples()  # stored proofs of the last iterations, with their own prompts
        return samples, [SequenceExample.from_training_sample(s.prompt_ids, s) for s in samples]
    if settings.solver_objective == "cispo":
        samples = rewards.cispo_samples(groups, max_tokens, try_rule)
    else:
        samples = rewards.reinforce_half_samples(groups, max_tokens, try_rule)
    return samples, [SequenceExample.from_training_sample(proved.prompt_ids[s.rollout.problem_id], s) for s in samples]


# Metric names of the Guide's sub-score means: (rewarded Guide, shadow Guide).
_GUIDE_METRICS = {
    "parse_failures": (M.GUIDE_PARSE_FAILURES, M.GUIDE_SHADOW_PARSE_FAILURES),
    "relevance": (M.GUIDE_RELEVANCE, M.GUIDE_SHADOW_RELEVANCE),
    "redundancy": (M.GUIDE_REDUNDANCY, M.GUIDE_SHADOW_REDUNDANCY),
    "complexity": (M.GUIDE_CONCLUSION_COMPLEXITY, M.GUIDE_SHADOW_CONCLUSION_COMPLEXITY),
    "score": (M.GUIDE_SCORE, M.GUIDE_SHADOW_SCORE),
}


def _guide_metrics(guided: GuidePhase, shadow: bool) -> dict[str, float]:
    """Parse failures and the means of the sub-scores and of Eq. 3 over parsed replies."""
    names = {key: pair[shadow] for key, pair in _GUIDE_METRICS.items()}
    out = {names["parse_failures"]: float(guided.parse_failures)}
    parsed = [s for s in guided.scores if s is not None]
    if parsed:
        out[names["relevance"]] = float(np.mean([s.relevance for s in parsed]))
        out[names["redundancy"]] = float(np.mean([s.redundancy for s in parsed]))
        out[names["complexity"]] = float(np.mean([s.complexity for s in parsed]))
        out[names["score"]] = float(np.mean([rewards.guide_score(*s) for s in parsed]))
    return out


def _train(trainer, examples: list[SequenceExample], seed: int, prefix: str, progress=None,
           running: Future | None = None) -> dict[str, float]:
    """One epoch of `trainer` over `examples` (or, with `running`, the result of that epoch
    already started in a worker thread) and its metrics under `prefix`."""
    if trainer is None or not examples:
        return {f"{prefix}/train_sequences": float(len(examples) if trainer else 0)}
    with phase(progress, f"train {prefix.capitalize()}", len(examples), "sequences") as shown:
        steps = running.result() if running is not None else trainer.train_epoch(examples, seed=seed)
        shown.advance(len(examples))
    fault_point("training")
    out = {f"{prefix}/train_sequences": float(len(examples)), f"{prefix}/optimizer_steps": float(len(steps))}
    for key in ("loss", "grad_norm", "clip_fraction", "mean_importance_weight"):
        value = epoch_metric(steps, key)
        if value is not None:
            out[f"{prefix}/{key}"] = value
    return out


def _start_training(stack: contextlib.ExitStack, roles: Roles, role: str, examples: list[SequenceExample],
                    seed: int) -> tuple[Any, Future | None]:
    """Enter `role`'s training phase on `stack` and start its epoch over `examples` in a
    worker thread (`sgs-train-<role>`), for when nothing that runs meanwhile uses its
    devices; returns (its trainer or None, the running epoch or None)."""
    trainer = stack.enter_context(roles.training(role))
    if trainer is None or not examples:
        return trainer, None
    worker = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix=f"sgs-train-{role}"))
    return trainer, worker.submit(trainer.train_epoch, examples, seed=seed)


def run_iteration(
    iteration: int,
    ctx: PhaseContext,
    roles: Roles,
    target_set: TargetSet,
    settings: IterationSettings,
    ei_buffer: rewards.ExpertIterationBuffer,
) -> dict[str, Any]:
    """Steps 1-9 of method.md §4 for one iteration. Returns scalar metrics plus
    'synthetic_solve_rates' (a list, for the histogram) and 'examples' (kept conjectures and verified proofs)."""
    start = time.perf_counter()
    seed = settings.seed
    out: dict[str, Any] = {}
    # 1-2: unsolved targets -> conjectures
    unsolved = target_set.unsolved()
    conj = None
    if settings.use_conjecturer and unsolved:
        with phase(ctx.progress, "conjecture", len(unsolved) * settings.conjectures_per_target, "samples"), \
                roles.rollout_weights(CONJECTURER) as weights:
            conj = conjecture_phase(
                ctx.for_role(CONJECTURER), weights, unsolved, [t.statement for t in target_set.targets],
                settings.conjectures_per_target, settings.condition_on_target,
                settings.conjecturer_max_new_tokens, phase_seed(seed, iteration, "conjecture"),
            )
        fault_point("sampling")
    proposed = conj.kept if conj else ()  # after extraction and dedup: what the shape metrics describe
    if conj is not None and settings.check_conjecture_statement:
        with phase(ctx.progress, "statement check", len(conj.kept), "conjectures"):
            checked = statement_check_phase(ctx, conj, {t.id: t.header for t in target_set.targets})
        conj = checked.conjectures
        out[M.CONJECTURE_ILL_FORMED] = float(checked.ill_formed)
        out[M.CONJECTURE_STATEMENT_CHECK_ERRORS] = float(checked.errors)
    kept = conj.kept if conj else ()
    # 3-6: prove every target (Expert Iteration: those with room in their proof store) and
    # every kept conjecture, verify, solve rates
    targets = target_set.targets
    if settings.solver_objective == "expert_iteration":
        stored_counts = {t.id: len(target_set.proofs[t.id]) for t in targets}
        targets = rewards.expert_iteration_targets(targets, stored_counts, target_set.max_proofs)
    problems = [Problem.from_target(t) for t in targets]
    problems += [Problem.from_conjecture(c, target_set.by_id[c.target_id].header) for c in kept]
    with phase(ctx.progress, "prove + verify", len(problems) * settings.k, "samples"), roles.rollout_weights(SOLVER) as weights:
        proved = prove_phase(
            ctx, weights, problems, settings.k, settings.solver_max_total_len,
            phase_seed(seed, iteration, "prove"), settings.chunk_problems,
        )
    rates = proved.solve_rates()
    num_targets = len(targets)
    newly_solved = 0
    new_proofs: dict[str, list[str]] = {}  # problem id -> proofs stored this iteration
    for problem, group in zip(problems, proved.attempts):
        verified = list(dict.fromkeys(a.proof for a in group if a.verified))
        if problem.origin == TARGET:
            before = len(target_set.proofs[problem.id])
            for proof in verified:
                newly_solved += target_set.record_proof(problem.id, proof)
            verified = target_set.proofs[problem.id][before:]
        new_proofs[problem.id] = verified
    # 8: Solver data (before step 7: it does not depend on the Guide, so under split the
    # Solver trains while the Guide scores)
    solver_samples, solver_examples = _solver_data(settings, proved, new_proofs, ei_buffer)
    solver_seed, conj_seed = seed + iteration, seed + iteration + 1
    # 7: Conjecturer rewards (p70 rule, Guide scores, product, min-max), with the Solver's
    # update running meanwhile on its own devices when the Guide has a sub-mesh of its own
    conj_rates = rates[num_targets:]
    conj_examples: list[SequenceExample] = []
    guide_replies: list[str | None] = [None] * len(kept)  # for the logged examples
    solver_beside_guide = roles.on_own_mesh(GUIDE) and not roles.shared
    conjecturer_apart = roles.on_own_mesh(CONJECTURER) and settings.train_conjecturer
    with contextlib.ExitStack() as overlapped:
        solver_run = None
        if solver_beside_guide:
            solver, solver_run = _start_training(overlapped, roles, SOLVER, solver_examples, solver_seed)
        if conj is not None and kept:
            keep_idx = rewards.kept_conjectures(conj_rates, settings.keep_quantile)
            guide_scores = None
            if settings.use_guide or settings.shadow_guide:
                pairs = [(target_set.by_id[kept[i].target_id].statement, kept[i].statement) for i in keep_idx]
                with phase(ctx.progress, "Guide" if settings.use_guide else "shadow Guide", len(pairs), "replies"), \
                        roles.rollout_weights(GUIDE) as weights:
                    guided = guide_phase(ctx.for_role(GUIDE), weights, pairs, settings.guide_max_new_tokens,
                                         phase_seed(seed, iteration, "guide"))
                out.update(_guide_metrics(guided, shadow=not settings.use_guide))
                for i, reply in zip(keep_idx, guided.replies):
                    guide_replies[i] = reply
                if settings.use_guide:  # a shadow Guide's scores are logged, never rewarded
                    guide_scores = [None] * len(kept)
                    for i, score in zip(keep_idx, guided.scores):
                        guide_scores[i] = score
            conj_rewards = rewards.conjecturer_rewards(conj_rates, guide_scores, settings.keep_quantile)
            conj_samples = rewards.conjecturer_samples(conj.rollouts, conj_rewards, settings.conjecturer_max_new_tokens)
            conj_examples = [SequenceExample.from_training_sample(conj.prompt_ids[s.rollout.problem_id], s) for s in conj_samples]
        # 9: updates (one epoch each; a shared model trains on both sets at once). A
        # Conjecturer on its own devices trains in a worker beside the Solver's epoch; results
        # are taken in the sequential order, so metrics and fault points come in that order.
        conj_run = None
        if conjecturer_apart:
            conjecturer, conj_run = _start_training(overlapped, roles, CONJECTURER, conj_examples, conj_seed)
        if solver_beside_guide:
            out.update(_train(solver, solver_examples, solver_seed, "solver", ctx.progress, running=solver_run))
        elif roles.shared:
            with roles.training(SOLVER) as trainer:
                out.update(_train(trainer, solver_examples + conj_examples, solver_seed, "solver", ctx.progress))
        else:
            with roles.training(SOLVER) as trainer:
                out.update(_train(trainer, solver_examples, solver_seed, "solver", ctx.progress))
        if conjecturer_apart:
            out.update(_train(conjecturer, conj_examples, conj_seed, "conjecturer", ctx.progress, running=conj_run))
    if settings.train_conjecturer and not roles.shared and not conjecturer_apart:
        with roles.training(CONJECTURER) as trainer:
            out.update(_train(trainer, conj_examples, conj_seed, "conjecturer", ctx.progress))
    # 10: bookkeeping
    conj_generated = conj.generated if conj else 0
    out[M.ITERATION_SOLVE_RATE] = sum(r > 0 for r in rates[:num_targets]) / len(target_set)
    out[M.CUMULATIVE_SOLVE_RATE] = target_set.solved_fraction()
    # Per group, as above: a target not sampled (Expert Iteration's full stores) counts as unsolved.
    target_rates = dict(zip((p.id for p in problems[:num_targets]), rates[:num_targets]))
    for group, ids in target_set.groups().items():  # the hard split and the difficulty bands
        out[f"{M.CUMULATIVE_SOLVE_RATE}/{group}"] = target_set.solved_fraction(ids)
        out[f"{M.ITERATION_SOLVE_RATE}/{group}"] = float(np.mean([target_rates.get(i, 0.0) > 0 for i in ids])) if ids else 0.0
    out["targets/newly_solved"] = float(newly_solved)
    out["targets/sampled"] = float(num_targets)
    # Samples really drawn: a prompt skipped as too long has no attempts and adds nothing.
    out["iteration/generations"] = float(conj_generated + sum(len(group) for group in proved.attempts))
    out["iteration/tokens"] = float(proved.tokens + (conj.tokens if conj else 0))
    out[M.SOLVER_ENTROPY] = float(np.mean(proved.entropies)) if proved.entropies else 0.0
    from_targets = sum(s.rollout.problem_id in target_set.by_id for s in solver_samples)
    out[M.SOLVER_SAMPLES_TARGETS] = float(from_targets)
    out[M.SOLVER_SAMPLES_CONJECTURES] = float(len(solver_samples) - from_targets)
    out["solver/extraction_failures"] = float(proved.extraction_failures)
    out["solver/skipped_prompts"] = float(proved.skipped_prompts)
    total_verified = sum(proved.status_counts.values())
    out[M.VERIFY_SYSTEM_ERROR_RATE] = proved.status_counts["system_error"] / total_verified if total_verified else 0.0
    out[M.VERIFY_TIMEOUTS] = float(proved.status_counts["timeout"])
    out[M.VERIFY_SECONDS] = float(proved.verify_seconds)
    for status, count in proved.status_counts.items():
        out[f"verify/{status}"] = float(count)
    if conj is not None:
        out[M.CONJECTURE_MALFORMED] = float(conj.malformed)
        out["conjectures/duplicates"] = float(conj.duplicates)
        out["conjectures/generated"] = float(conj.generated)
        out[M.CONJECTURE_KEPT] = float(len(conj_examples))
        shape = summarize_statements([c.statement for c in proposed])
        if shape.parsed:
            out[M.CONJECTURE_DISJUNCTIVE_FRACTION] = shape.disjunctive_fraction
            out[M.CONJECTURE_MEAN_CONCLUSION_LENGTH] = shape.mean_conclusion_length
            out[M.CONJECTURE_MEAN_CLAUSES] = shape.mean_clauses
        out.update(statement_fractions([c.statement for c in proposed], exact=settings.exact_statement_facts))
    out["synthetic_solve_rates"] = list(conj_rates)
    out["examples"] = {  # the run logs the first run.log_examples of each (the conjecture lists are aligned)
        "conjectures": [c.statement for c in kept],
        "conjecture_solve_rates": [float(r) for r in conj_rates],
        "guide_replies": guide_replies,  # None: not scored (solve rate outside (0, p70], or no Guide)
        "proofs": [a.proof for g in proved.attempts for a in g if a.verified],
    }
    out["iteration/seconds"] = time.perf_counter() - start
    return out

