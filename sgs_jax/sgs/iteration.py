"""One SGS iteration (Algorithm 1, full batch): phases in order, rewards, updates, metrics.

`run_iteration` is the whole of method.md §4 steps 1-10 for one iteration; it mutates
only the target set (new proofs), the Expert Iteration buffer and the role weights (through
their trainers), and returns the iteration's metrics.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from sgs_jax import metrics as M
from sgs_jax.analysis.statements import summarize_statements
from sgs_jax.faults import fault_point
from sgs_jax.rl.batching import SequenceExample
from sgs_jax.sgs import rewards
from sgs_jax.sgs.phases import PhaseContext, conjecture_phase, guide_phase, phase_seed, prove_phase
from sgs_jax.sgs.roles import CONJECTURER, GUIDE, SOLVER, Roles
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


def _train(trainer, examples: list[SequenceExample], seed: int, prefix: str) -> dict[str, float]:
    if trainer is None or not examples:
        return {f"{prefix}/train_sequences": float(len(examples) if trainer else 0)}
    steps = trainer.train_epoch(examples, seed=seed)
    fault_point("training")
    out = {f"{prefix}/train_sequences": float(len(examples)), f"{prefix}/optimizer_steps": float(len(steps))}
    for key in ("loss", "grad_norm", "clip_fraction", "mean_importance_weight"):
        values = [s[key] for s in steps if key in s]
        if values:
            out[f"{prefix}/{key}"] = float(np.mean(values))
    return out


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
        with roles.rollout_weights(CONJECTURER) as weights:
            conj = conjecture_phase(
                ctx, weights, unsolved, [t.statement for t in target_set.targets],
                settings.conjectures_per_target, settings.condition_on_target,
                settings.conjecturer_max_new_tokens, phase_seed(seed, iteration, "conjecture"),
            )
        fault_point("sampling")
    kept = conj.kept if conj else ()
    # 3-6: prove every target (Expert Iteration: those with room in their proof store) and
    # every kept conjecture, verify, solve rates
    targets = target_set.targets
    if settings.solver_objective == "expert_iteration":
        stored_counts = {t.id: len(target_set.proofs[t.id]) for t in targets}
        targets = rewards.expert_iteration_targets(targets, stored_counts, target_set.max_proofs)
    problems = [Problem.from_target(t) for t in targets]
    problems += [Problem.from_conjecture(c, target_set.by_id[c.target_id].header) for c in kept]
    with roles.rollout_weights(SOLVER) as weights:
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
    # 7: Conjecturer rewards (p70 rule, Guide scores, product, min-max)
    conj_rates = rates[num_targets:]
    conj_examples: list[SequenceExample] = []
    if conj is not None and kept:
        keep_idx = rewards.kept_conjectures(conj_rates, settings.keep_quantile)
        guide_scores = None
        if settings.use_guide:
            pairs = [(target_set.by_id[kept[i].target_id].statement, kept[i].statement) for i in keep_idx]
            with roles.rollout_weights(GUIDE) as weights:
                guided = guide_phase(ctx, weights, pairs, settings.guide_max_new_tokens, phase_seed(seed, iteration, "guide"))
            guide_scores = [None] * len(kept)
            for i, score in zip(keep_idx, guided.scores):
                guide_scores[i] = score
            parsed = [s for s in guided.scores if s is not None]
            out[M.GUIDE_PARSE_FAILURES] = float(guided.parse_failures)
            if parsed:
                out[M.GUIDE_RELEVANCE] = float(np.mean([s.relevance for s in parsed]))
                out[M.GUIDE_REDUNDANCY] = float(np.mean([s.redundancy for s in parsed]))
                out[M.GUIDE_CONCLUSION_COMPLEXITY] = float(np.mean([s.complexity for s in parsed]))
        conj_rewards = rewards.conjecturer_rewards(conj_rates, guide_scores, settings.keep_quantile)
        conj_samples = rewards.conjecturer_samples(conj.rollouts, conj_rewards, settings.conjecturer_max_new_tokens)
        conj_examples = [SequenceExample.from_training_sample(conj.prompt_ids[s.rollout.problem_id], s) for s in conj_samples]
    # 8: Solver data
    solver_samples, solver_examples = _solver_data(settings, proved, new_proofs, ei_buffer)
    # 9: updates (one epoch each; a shared model trains on both sets at once)
    if roles.shared:
        with roles.training(SOLVER) as trainer:
            out.update(_train(trainer, solver_examples + conj_examples, seed + iteration, "solver"))
    else:
        with roles.training(SOLVER) as trainer:
            out.update(_train(trainer, solver_examples, seed + iteration, "solver"))
        if settings.train_conjecturer:
            with roles.training(CONJECTURER) as trainer:
                out.update(_train(trainer, conj_examples, seed + iteration + 1, "conjecturer"))
    # 10: bookkeeping
    conj_generated = conj.generated if conj else 0
    out[M.ITERATION_SOLVE_RATE] = sum(r > 0 for r in rates[:num_targets]) / len(target_set)
    out[M.CUMULATIVE_SOLVE_RATE] = target_set.solved_fraction()
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
        shape = summarize_statements([c.statement for c in kept])
        if shape.parsed:
            out[M.CONJECTURE_DISJUNCTIVE_FRACTION] = shape.disjunctive_fraction
            out[M.CONJECTURE_MEAN_CONCLUSION_LENGTH] = shape.mean_conclusion_length
            out[M.CONJECTURE_MEAN_CLAUSES] = shape.mean_clauses
    out["synthetic_solve_rates"] = list(conj_rates)
    out["examples"] = {  # the run logs the first run.log_examples of each
        "conjectures": [c.statement for c in kept],
        "proofs": [a.proof for g in proved.attempts for a in g if a.verified],
    }
    out["iteration/seconds"] = time.perf_counter() - start
    return out

