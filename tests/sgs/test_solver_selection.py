"""Solver rewards and selection rules: length penalty, `try` ban, REINFORCE½, CISPO, Expert Iteration."""

import math

import numpy as np
import pytest

from sgs_jax.sgs.rewards import (
    ExpertIterationBuffer,
    cispo_samples,
    contains_try,
    expert_iteration_samples,
    group_advantages,
    length_penalty,
    reinforce_half_samples,
    solve_rate,
    solver_reward,
)
from sgs_jax.sgs.types import Attempt, Problem, Rollout, TrainingSample

L_MAX = 100


@pytest.mark.parametrize(
    "length, max_tokens, expected",
    [
        (0, 100, None),
        (80, 100, None),  # exactly 0.8 L_max: no penalty
        (81, 100, -0.05),  # -(81 - 80) / 20
        (90, 100, -0.5),
        (100, 100, -1.0),
        (120, 100, -1.0),  # clamped at -1
        (6553, 8192, None),  # 0.8 * 8192 = 6553.6
        (6554, 8192, -0.4 / 1638.4),
        (8192, 8192, -1.0),
    ],
)
def test_length_penalty(length, max_tokens, expected):
    got = length_penalty(length, max_tokens)
    assert got is None if expected is None else math.isclose(got, expected, rel_tol=1e-12)


@pytest.mark.parametrize("length, max_tokens", [(10, 0), (10, -5), (-1, 100)])
def test_length_penalty_rejects_bad_input(length, max_tokens):
    with pytest.raises(ValueError):
        length_penalty(length, max_tokens)


@pytest.mark.parametrize(
    "proof, plain, token_aware",
    [
        ("\n  try simp\n  linarith", True, True),
        ("\n  (try norm_num)\n  ring", True, True),
        ("\n  first | try rfl | simp", True, True),
        ("\n  apply symmetry", True, False),  # plain test hits the name, token test does not
        ("\n  exact retry_lemma", True, False),
        ("\n  -- try this later\n  simp", False, False),
        ("\n  /- try\n  everything -/ simp", False, False),
        ("\n  nlinarith [sq_nonneg x]", False, False),
    ],
)
def test_contains_try(proof, plain, token_aware):
    assert contains_try(proof) is plain
    assert contains_try(proof, token_aware=True) is token_aware


def make_rollout(problem_id, length=10, seed=0):
    return Rollout(problem_id, tuple(range(seed, seed + length)), f"out{seed}", (-0.5,) * length, length, "stop")


def group(problem_id, verdicts, lengths=None, proofs=None):
    """k attempts of one problem: verdict per attempt, optional lengths and proofs."""
    attempts = []
    for i, verified in enumerate(verdicts):
        proof = (proofs or {}).get(i, "\n  simp") if verified else None
        length = (lengths or {}).get(i, 10)
        attempts.append(Attempt(make_rollout(problem_id, length, seed=i), proof, verified))
    return attempts


GROUPS = [
    group("p0", [0] * 8),  # s = 0
    group("p1", [1, 1, 1, 1, 0, 0, 0, 0]),  # s = 0.5: REINFORCE½ boundary
    group("p2", [1, 1, 1, 1, 1, 0, 0, 0]),  # s = 0.625
    group("p3", [1, 0, 0, 0, 0, 0, 0, 0], proofs={0: "\n  try simp"}),  # the one proof uses try
    group("p4", [0, 1, 0, 1, 0, 0, 0, 0], lengths={1: 95, 2: 90}),  # long correct and long failed
    group("p5", [1] * 8),  # s = 1
]


def test_solve_rate():
    assert [solve_rate(g) for g in GROUPS] == [0.0, 0.5, 0.625, 0.125, 0.25, 1.0]
    with pytest.raises(ValueError):
        solve_rate([])


def test_solver_reward():
    assert [solver_reward(a, L_MAX) for a in GROUPS[4][:4]] == [0.0, -0.75, -0.5, 1.0]
    assert solver_reward(GROUPS[3][0], L_MAX) == 0.0


def test_reinforce_half_selection():
    samples = reinforce_half_samples(GROUPS, L_MAX)
    expected = [TrainingSample(a.rollout, 1.0, 1) for a in GROUPS[1][:4]]
    expected += [TrainingSample(GROUPS[3][0].rollout, 0.0, 3)]  # `try` -> weight 0, still in the batch
    expected += [TrainingSample(GROUPS[4][1].rollout, -0.75, 4), TrainingSample(GROUPS[4][3].rollout, 1.0, 4)]
    assert samples == expected


def test_group_advantages_hand_computed():
    # rewards 1, 0, -0.5, 0: mean 0.125, population variance 1.1875 / 4
    std = math.sqrt(1.1875 / 4)
    expected = [(r - 0.125) / (std + 1e-6) for r in (1.0, 0.0, -0.5, 0.0)]
    np.testing.assert_allclose(group_advantages([1.0, 0.0, -0.5, 0.0]), expected, rtol=1e-13)
    np.testing.assert_array_equal(group_advantages([0.5, 0.5]), [0.0, 0.0])  # std 0: advantages 0


def test_cispo_selection():
    samples = cispo_samples(GROUPS, L_MAX)
    # p0 (s = 0) and p5 (s = 1) fall outside (0, 1); p3's rewards are all zero (try ban).
    assert [s.group for s in samples] == [1] * 8 + [2] * 8 + [4] * 8
    half = 0.5 / (0.5 + 1e-6)
    np.testing.assert_allclose([s.weight for s in samples[:8]], [half] * 4 + [-half] * 4, rtol=1e-12)
    rewards_p4 = [0.0, -0.75, -0.5, 1.0, 0.0, 0.0, 0.0, 0.0]
    mean = sum(rewards_p4) / 8
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards_p4) / 8)
    np.testing.assert_allclose([s.weight for s in samples[16:]], [(r - mean) / (std + 1e-6) for r in rewards_p4])
    assert [s.rollout for s in samples[16:]] == [a.rollout for a in GROUPS[4]]


def test_expert_iteration_selection():
    stored = {"p1": 16, "p2": 15, "p5": 3}
    samples = expert_iteration_samples(GROUPS, stored, L_MAX)
    # p0: s = 0; p1: 16 stored proofs already; p3 -> weight 0 (try); p5 counts although s = 1.
    assert [(s.group, s.weight) for s in samples] == (
        [(2, 1.0)] * 5 + [(3, 0.0)] + [(4, -0.75), (4, 1.0)] + [(5, 1.0)] * 8
    )


def test_expert_iteration_buffer_keeps_the_last_three_iterations():
    buffer = ExpertIterationBuffer(window=3)
    iterations = [[TrainingSample(make_rollout(f"p{i}", seed=j), 1.0, j) for j in range(i + 1)] for i in range(4)]
    for samples in iterations:
        buffer.add_iteration(samples)
    assert buffer.samples() == iterations[1] + iterations[2] + iterations[3]
    with pytest.raises(ValueError):
        ExpertIterationBuffer(window=0)


def test_types_reject_inconsistent_data():
    with pytest.raises(ValueError, match="disagree"):
        Rollout("p", (1, 2), "x", (0.0,), 2, "stop")
    with pytest.raises(ValueError, match="cannot be verified"):
        Attempt(make_rollout("p"), None, True)
    with pytest.raises(ValueError, match="origin"):
        Problem("p", "", "theorem p : True := by", "synthetic", "p")
