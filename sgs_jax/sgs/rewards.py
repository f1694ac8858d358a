"""Rewards and selection rules of SGS (method.md §4–§6), host-side and pure.

Solver: per-rollout rewards (correct only, `try` ban, length penalty replacing the
weight) and the three selection rules (REINFORCE½, CISPO, Expert Iteration).
Conjecturer: the p70 rule, Eq. 3 Guide score with mean fill-in, the product reward
R_solve · R_guide and its min-max normalisation. Guide replies are parsed here too.
The jnp losses that consume these weights live in `sgs_jax.rl.objectives`.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Iterable, Mapping, Sequence

import numpy as np

from sgs_jax.sgs.types import Attempt, GuideScores, Rollout, TrainingSample
from sgs_jax.verify.rules import contains_try  # the one `try` detector (method.md §4 step 8), shared with verify

MAX_STORED_PROOFS = 16  # a target keeps at most this many verified proofs (method.md §3)
CISPO_STD_EPS = 1e-6
RELEVANCE_RANGE = (0, 5)
REDUNDANCY_RANGE = (0, 1)
COMPLEXITY_RANGE = (0, 4)

# ---------------------------------------------------------------- Guide scores (Section 6)


def guide_score(relevance: int, redundancy: int, complexity: int) -> float:
    """Eq. 3: 0 when complexity is 3 or 4, else max(0, relevance + (2 - complexity) +
    (1 - redundancy)); a raw score in 0..8. Raises ValueError on out-of-range scores."""
    for name, value, (low, high) in (
        ("relevance", relevance, RELEVANCE_RANGE),
        ("redundancy", redundancy, REDUNDANCY_RANGE),
        ("complexity", complexity, COMPLEXITY_RANGE),
    ):
        if not low <= value <= high:
            raise ValueError(f"{name} score {value!r} outside {low}..{high}")
    if complexity >= 3:
        return 0.0
    return float(max(0, relevance + (2 - complexity) + (1 - redundancy)))


def _last_tagged_integer(text: str, name: str) -> int | None:
    # The last `<begin_NAME>` wins; its value runs to the next `<end_NAME>`.
    begins = list(re.finditer(rf"<\s*begin_{name}\s*>", text))
    if not begins:
        return None
    end = re.compile(rf"<\s*end_{name}\s*>").search(text, begins[-1].end())
    if end is None:
        return None
    value = text[begins[-1].end() : end.start()].strip()
    return int(value) if re.fullmatch(r"[+-]?\d{1,6}", value) else None


def parse_guide_reply(text: str) -> GuideScores | None:
    """The three scores of a Guide reply, or None when any is missing, not an integer,
    or out of range. Uses the last occurrence of each tag; spaces and newlines around
    the number (and inside the angle brackets) are tolerated. Never raises."""
    if not isinstance(text, str):
        return None
    values = []
    for name, (low, high) in (
        ("relevance_score", RELEVANCE_RANGE),
        ("redundancy_score", REDUNDANCY_RANGE),
        ("conclusion_complexity_score", COMPLEXITY_RANGE),
    ):
        value = _last_tagged_integer(text, name)
        if value is None or not low <= value <= high:
            return None
        values.append(value)
    return GuideScores(*values)


# ------------------------------------------------------------ Conjecturer (Section 4.7)


def p70_threshold(solve_rates: Sequence[float]) -> float:
    """sorted(r)[floor(0.7 n)] over the n rates strictly inside (0, 1); 0 when n = 0.

    floor(0.7 n) is computed exactly as (7 n) // 10 (the float product 0.7 * n rounds
    below the integer for n = 90, 170, 180, ...)."""
    inside = sorted(r for r in solve_rates if 0.0 < r < 1.0)
    return inside[(7 * len(inside)) // 10] if inside else 0.0


def min_max_normalize(values: Sequence[float]) -> list[float]:
    """(v - min) / (max - min) per value; all 1.0 when max == min (one value included)."""
    if not values:
        return []
    low, high = min(values), max(values)
    if high == low:
        return [1.0] * len(values)
    return [(v - low) / (high - low) for v in values]


def fill_unparsable(scores: Sequence[float | None]) -> list[float]:
    """Replace each None by the mean of the parsed (non-None) scores; 0 when none parsed."""
    parsed = [s for s in scores if s is not None]
    fill = float(np.mean(parsed)) if parsed else 0.0
    return [fill if s is None else float(s) for s in scores]


def _guide_value(score) -> float | None:
    # A guide score may come raw (Eq. 3 value) or as the parsed triple.
    if score is None:
        return None
    if isinstance(score, (tuple, list)):
        return guide_score(*score)
    value = float(score)
    if not math.isfinite(value):
        raise ValueError(f"guide score {score!r} is not finite")
    return value


def conjecturer_rewards(
    solve_rates: Sequence[float], guide_scores: Sequence | None = None
) -> list[float | None]:
    """The normalised Conjecturer reward of each conjecture, None when not kept.

    solve_rates[i]: s of conjecture i in [0, 1]. Kept iff 0 < s <= p70 (`p70_threshold`).
    guide_scores[i]: Eq. 3 value, or a (relevance, redundancy, complexity) triple, or
    None when the Guide reply was unparsable (gets the mean of the kept conjectures'
    parsed scores); entries of conjectures that are not kept are ignored.
    guide_scores=None: the No Guide ablation (R_guide = 1).
    R = (1 - s) * R_guide, min-max normalised over the kept conjectures.
    """
    rates = [float(s) for s in solve_rates]
    if any(not 0.0 <= s <= 1.0 for s in rates):
        raise ValueError(f"solve rates must lie in [0, 1], got {rates}")
    if guide_scores is not None and len(guide_scores) != len(rates):
        raise ValueError(f"{len(guide_scores)} guide scores for {len(rates)} conjectures")
    threshold = p70_threshold(rates)
    kept = [i for i, s in enumerate(rates) if 0.0 < s <= threshold]
    if guide_scores is None:
        guide = [1.0] * len(kept)
    else:
        guide = fill_unparsable([_guide_value(guide_scores[i]) for i in kept])
    normalized = min_max_normalize([(1.0 - rates[i]) * g for i, g in zip(kept, guide)])
    rewards: list[float | None] = [None] * len(rates)
    for i, reward in zip(kept, normalized):
        rewards[i] = reward
    return rewards


def conjecturer_samples(
    rollouts: Sequence[Rollout], rewards: Sequence[float | None], max_tokens: int
) -> list[TrainingSample]:
    """Training samples of the Conjecturer: each kept conjecture's rollout, its reward as
    weight (replaced by the length penalty when that applies). group = input index."""
    if len(rollouts) != len(rewards):
        raise ValueError(f"{len(rollouts)} rollouts for {len(rewards)} rewards")
    return [
        TrainingSample(rollout, apply_length_penalty(reward, rollout.num_generated_tokens, max_tokens), i)
        for i, (rollout, reward) in enumerate(zip(rollouts, rewards))
        if reward is not None
    ]


# ----------------------------------------------------------------- Solver (Sections 4-5)


def length_penalty(num_generated_tokens: int, max_tokens: int) -> float | None:
    """None when L <= 0.8 L_max, else the weight that replaces the reward:
    max(-1, -(L - 0.8 L_max) / (0.2 L_max)). L, L_max in tokens."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if num_generated_tokens < 0:
        raise ValueError(f"num_generated_tokens must be >= 0, got {num_generated_tokens}")
    # 5 L > 4 L_max is L > 0.8 L_max without rounding.
    if 5 * num_generated_tokens <= 4 * max_tokens:
        return None
    return max(-1.0, -(num_generated_tokens - 0.8 * max_tokens) / (0.2 * max_tokens))


def apply_length_penalty(weight: float, num_generated_tokens: int, max_tokens: int) -> float:
    """`weight`, or the length penalty when it applies (it replaces, never adds)."""
    penalty = length_penalty(num_generated_tokens, max_tokens)
    return float(weight) if penalty is None else penalty


def solve_rate(attempts: Sequence[Attempt]) -> float:
    """s(x) = (1/k) sum v(y) over the k attempts of one problem."""
    if not attempts:
        raise ValueError("solve rate of a problem with no attempts")
    return sum(a.verified for a in attempts) / len(attempts)


def solver_reward(attempt: Attempt, max_tokens: int, token_aware_try: bool = False) -> float:
    """1 for a verified proof without `try`, else 0; replaced by the length penalty
    when the rollout is longer than 0.8 max_tokens."""
    base = 1.0 if attempt.verified and not contains_try(attempt.proof, token_aware_try) else 0.0
    return apply_length_penalty(base, attempt.rollout.num_generated_tokens, max_tokens)


def reinforce_half_samples(
    groups: Sequence[Sequence[Attempt]], max_tokens: int, token_aware_try: bool = False
) -> list[TrainingSample]:
    """REINFORCE½ data: the verified attempts of problems with 0 < s <= 0.5, weighted by
    `solver_reward`. groups[g] holds the k attempts of problem g; group = g."""
    samples = []
    for g, attempts in enumerate(groups):
        if 0.0 < solve_rate(attempts) <= 0.5:
            samples += [
                TrainingSample(a.rollout, solver_reward(a, max_tokens, token_aware_try), g)
                for a in attempts
                if a.verified
            ]
    return samples


def group_advantages(rewards: Sequence[float]) -> np.ndarray:
    """CISPO advantages (r_i - mean r) / (std r + 1e-6), population std. Shape [k]."""
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean()) / (r.std() + CISPO_STD_EPS)


def cispo_samples(
    groups: Sequence[Sequence[Attempt]], max_tokens: int, token_aware_try: bool = False
) -> list[TrainingSample]:
    """CISPO data: every attempt of problems with 0 < s < 1 whose rewards are not all
    zero, with its group advantage as weight. groups[g] holds problem g's attempts."""
    samples = []
    for g, attempts in enumerate(groups):
        if not 0.0 < solve_rate(attempts) < 1.0:
            continue
        rewards = [solver_reward(a, max_tokens, token_aware_try) for a in attempts]
        if all(r == 0.0 for r in rewards):
            continue
        samples += [
            TrainingSample(a.rollout, float(adv), g) for a, adv in zip(attempts, group_advantages(rewards))
        ]
    return samples


def expert_iteration_samples(
    groups: Sequence[Sequence[Attempt]],
    stored_proof_counts: Mapping[str, int],
    max_tokens: int,
    token_aware_try: bool = False,
) -> list[TrainingSample]:
    """Expert Iteration data of one iteration: the verified attempts of problems with
    s > 0 and fewer than 16 stored proofs (`stored_proof_counts[problem_id]`, 0 when
    absent), weighted by `solver_reward` (1 unless `try` or too long)."""
    samples = []
    for g, attempts in enumerate(groups):
        stored = stored_proof_counts.get(attempts[0].rollout.problem_id, 0) if attempts else 0
        if solve_rate(attempts) > 0.0 and stored < MAX_STORED_PROOFS:
            samples += [
                TrainingSample(a.rollout, solver_reward(a, max_tokens, token_aware_try), g)
                for a in attempts
                if a.verified
            ]
    return samples


class ExpertIterationBuffer:
    """The Expert Iteration training pool: samples of the last `window` iterations."""

    def __init__(self, window: int = 3):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._iterations: collections.deque[tuple[TrainingSample, ...]] = collections.deque(maxlen=window)

    def add_iteration(self, samples: Iterable[TrainingSample]) -> None:
        """Append one iteration's samples; the oldest iteration falls out past `window`."""
        self._iterations.append(tuple(samples))

    def by_iteration(self) -> list[tuple[TrainingSample, ...]]:
        """The buffered iterations' samples, oldest first (for checkpoints)."""
        return list(self._iterations)

    def samples(self) -> list[TrainingSample]:
        """All buffered samples, oldest iteration first."""
        return [s for iteration in self._iterations for s in iteration]
