"""Rewards and selection rules of SGS (method.md §4–§6), host-side and pure.

Solver: per-rollout rewards (correct only, `try` ban, length penalty replacing the
weight) and the three selection rules (REINFORCE½, CISPO, Expert Iteration with its buffer
of stored proofs). Conjecturer: the p70 rule (quantile `sgs.keep_quantile`), Eq. 3 Guide score with mean fill-in, the product reward
R_solve · R_guide and its min-max normalisation. Guide replies are parsed here too.
The jnp losses that consume these weights live in `sgs_jax.rl.objectives`.
"""

from __future__ import annotations

import collections
import fractions
import math
import re
from typing import Iterable, Mapping, Sequence

import numpy as np

from sgs_jax.sgs.types import Attempt, GuideScores, Rollout, StoredProofSample, Target, TrainingSample
from sgs_jax.verify.rules import contains_try  # the one `try` detector (method.md §4 step 8), shared with verify

DEFAULT_KEEP_QUANTILE = 0.7  # method.md §4 step 7's p70 (configs/base.py sgs.keep_quantile)
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


def p70_threshold(solve_rates: Sequence[float], quantile: float = DEFAULT_KEEP_QUANTILE) -> float:
    """sorted(r)[floor(q n)] over the n rates strictly inside (0, 1); 0 when n = 0.

    quantile q in (0, 1) (method.md §4 step 7: 0.7). floor(q n) is exact: q is read as the decimal it
    prints as (0.7 -> 7/10), so at 0.7 it is (7 n) // 10 (the float product 0.7 * n rounds
    below the integer for n = 90, 170, 180, ...)."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"keep quantile must lie in (0, 1), got {quantile!r}")
    inside = sorted(r for r in solve_rates if 0.0 < r < 1.0)
    return inside[math.floor(fractions.Fraction(repr(float(quantile))) * len(inside))] if inside else 0.0


def kept_conjectures(solve_rates: Sequence[float], quantile: float = DEFAULT_KEEP_QUANTILE) -> list[int]:
    """Indices of the conjectures the p70 rule keeps: 0 < s <= `p70_threshold`."""
    threshold = p70_threshold(solve_rates, quantile)
    return [i for i, s in enumerate(solve_rates) if 0.0 < s <= threshold]


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
    solve_rates: Sequence[float], guide_scores: Sequence | None = None, quantile: float = DEFAULT_KEEP_QUANTILE
) -> list[float | None]:
    """The normalised Conjecturer reward of each conjecture, None when not kept.

    solve_rates[i]: s of conjecture i in [0, 1]. Kept iff 0 < s <= p70 (`kept_conjectures`
    with `quantile`).
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
    kept = kept_conjectures(rates, quantile)
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
    """REINFORCE½ data: the verified attempts of problems with 0 < s <= 0.5, weight 1
    (replaced by the length penalty when too long). A proof containing `try` is dropped
    (it takes no batch slot and no share of the token denominator), as the official trainer
    skips it. groups[g] holds the k attempts of problem g (none when its prompt did not fit:
    no data); group = g."""
    samples = []
    for g, attempts in enumerate(groups):
        if attempts and 0.0 < solve_rate(attempts) <= 0.5:
            samples += [
                TrainingSample(a.rollout, apply_length_penalty(1.0, a.rollout.num_generated_tokens, max_tokens), g)
                for a in attempts
                if a.verified and not contains_try(a.proof, token_aware_try)
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
    zero, with its group advantage as weight. groups[g] holds problem g's attempts (none
    when its prompt did not fit: no data)."""
    samples = []
    for g, attempts in enumerate(groups):
        if not attempts or not 0.0 < solve_rate(attempts) < 1.0:
            continue
        rewards = [solver_reward(a, max_tokens, token_aware_try) for a in attempts]
        if all(r == 0.0 for r in rewards):
            continue
        samples += [
            TrainingSample(a.rollout, float(adv), g) for a, adv in zip(attempts, group_advantages(rewards))
        ]
    return samples


def expert_iteration_targets(
    targets: Sequence[Target], stored_proof_counts: Mapping[str, int], max_proofs: int
) -> list[Target]:
    """The targets Expert Iteration samples: those with fewer than `max_proofs` stored
    proofs (`stored_proof_counts[id]`, counted before this iteration's proofs are recorded)."""
    return [t for t in targets if stored_proof_counts.get(t.id, 0) < max_proofs]


def expert_iteration_samples(
    groups: Sequence[Sequence[Attempt]],
    new_proofs: Mapping[str, Sequence[str]],
    prompt_ids: Mapping[str, Sequence[int]],
    token_aware_try: bool = False,
) -> list[StoredProofSample]:
    """One iteration's Expert Iteration data: one weight-1 sample per proof that entered a
    problem's store this iteration, de-duplicated, without `try` proofs.

    groups[g]: the attempts of problem g. new_proofs[problem id]: the distinct proof texts
    stored this iteration (a target: what `TargetSet.record_proof` added; a conjecture: its
    distinct verified proofs). prompt_ids[problem id]: the Solver prompt's token ids. Each
    proof's training sequence is the first verified rollout that produced it.
    """
    samples = []
    for g, attempts in enumerate(groups):
        if not attempts:
            continue
        problem_id = attempts[0].rollout.problem_id
        wanted = set(new_proofs.get(problem_id, ()))
        for a in attempts:
            if a.verified and a.proof in wanted and not contains_try(a.proof, token_aware_try):
                wanted.discard(a.proof)
                samples.append(StoredProofSample(a.rollout, 1.0, g, a.proof, prompt_ids[problem_id]))
    return samples


class ExpertIterationBuffer:
    """The Expert Iteration training pool: the stored proofs of the last `window`
    iterations (`sgs.ei_buffer_iterations`), one sample per distinct (problem, proof)."""

    def __init__(self, window: int = 3):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._iterations: collections.deque[tuple[StoredProofSample, ...]] = collections.deque(maxlen=window)

    def add_iteration(self, samples: Iterable[StoredProofSample]) -> None:
        """Append one iteration's samples; the oldest iteration falls out past `window`."""
        samples = tuple(samples)
        for s in samples:
            if not isinstance(s, StoredProofSample):
                raise TypeError(
                    f"Expert Iteration buffer entries are StoredProofSample (proof text and prompt ids), got "
                    f"{type(s).__name__}; a checkpoint that lacks them cannot resume Expert Iteration"
                )
        self._iterations.append(samples)

    def by_iteration(self) -> list[tuple[StoredProofSample, ...]]:
        """The buffered iterations' samples, oldest first (for checkpoints)."""
        return list(self._iterations)

    def to_json(self) -> list[list[dict]]:
        """Checkpoint form: per buffered iteration, oldest first, its samples' dicts."""
        return [[s.to_json() for s in iteration] for iteration in self._iterations]

    def load_json(self, data: Iterable[Iterable[dict]]) -> None:
        """Append the iterations of a `to_json` result (restoring a checkpoint)."""
        for iteration in data:
            self.add_iteration(StoredProofSample.from_json(d) for d in iteration)

    def samples(self) -> list[StoredProofSample]:
        """The training data: every buffered sample, oldest iteration first, keeping the
        first sample of each (problem, proof) pair."""
        seen: set[tuple[str, str]] = set()
        out = []
        for iteration in self._iterations:
            for s in iteration:
                key = (s.rollout.problem_id, s.proof)
                if key not in seen:
                    seen.add(key)
                    out.append(s)
        return out
