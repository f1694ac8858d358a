"""Solver rewards and selection rules: length penalty, `try` ban, REINFORCE½, CISPO, Expert Iteration."""

import dataclasses
import json
import math

import numpy as np
import pytest

from sgs_jax.sgs.rewards import (
    ExpertIterationBuffer,
    cispo_samples,
    contains_try,
    expert_iteration_samples,
    expert_iteration_targets,
    group_advantages,
    length_penalty,
    reinforce_half_samples,
    solve_rate,
    solver_reward,
)
from sgs_jax.sgs.types import Attempt, Problem, Rollout, StoredProofSample, Target, TrainingSample

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
    return Rollout(problem_id, tuple(range(seed, seed + length)), f"out{seed}", (-0.5,) * length, "stop")


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
    # p1 (s = 0.5) and p4 (s = 0.25) qualify; p3's only proof uses `try`: dropped, no slot.
    expected = [TrainingSample(a.rollout, 1.0, 1) for a in GROUPS[1][:4]]
    expected += [TrainingSample(GROUPS[4][1].rollout, -0.75, 4), TrainingSample(GROUPS[4][3].rollout, 1.0, 4)]
    assert samples == expected


# (verdicts, proofs of the verified attempts, expected (attempt index, weight) per sample);
# k = 4, L_MAX = 100, every rollout 10 tokens. The plain `try` test is the default.
REINFORCE_TRY_CASES = [
    ([1, 0, 0, 0], {0: "\n  try simp"}, []),  # the only proof: dropped, the problem gives nothing
    ([1, 1, 0, 0], {0: "\n  try simp", 1: "\n  simp"}, [(1, 1.0)]),
    ([1, 1, 0, 0], {0: "\n  exact symmetry h", 1: "\n  simp"}, [(1, 1.0)]),  # plain test: a name hit
    ([1, 1, 0, 0], {0: "\n  simp -- try later", 1: "\n  /- try -/ rfl"}, [(0, 1.0), (1, 1.0)]),  # comments
    ([1, 1, 1, 0], {0: "\n  try simp", 1: "\n  simp", 2: "\n  simp"}, []),  # s = 0.75 > 0.5: not selected
]


@pytest.mark.parametrize("verdicts, proofs, expected", REINFORCE_TRY_CASES)
def test_reinforce_half_drops_try_proofs(verdicts, proofs, expected):
    attempts = group("p", verdicts, proofs=proofs)
    samples = reinforce_half_samples([attempts], L_MAX)
    assert [(attempts.index(next(a for a in attempts if a.rollout == s.rollout)), s.weight) for s in samples] == expected
    assert all(s.group == 0 for s in samples)


def test_token_aware_try_keeps_names_that_contain_try():
    attempts = group("p", [1, 1, 0, 0], proofs={0: "\n  exact symmetry h", 1: "\n  try simp"})
    assert [s.rollout for s in reinforce_half_samples([attempts], L_MAX, token_aware_try=True)] == [attempts[0].rollout]


@pytest.mark.parametrize("select", [reinforce_half_samples, cispo_samples], ids=["reinforce_half", "cispo"])
def test_a_problem_without_attempts_gives_no_data(select):
    """A problem whose prompt did not fit was never attempted (no attempts): it is left
    out, and the other problems keep their samples and group indices."""
    with_gap = [GROUPS[0], (), *GROUPS[1:]]
    shifted = [dataclasses.replace(s, group=s.group + (s.group >= 1)) for s in select(GROUPS, L_MAX)]
    assert select(with_gap, L_MAX) == shifted and shifted


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


def test_cispo_keeps_try_proofs_as_reward_zero():
    attempts = group("p", [1, 1, 0, 0], proofs={0: "\n  try simp", 1: "\n  simp"})
    samples = cispo_samples([attempts], L_MAX)
    assert [s.rollout for s in samples] == [a.rollout for a in attempts]  # all k stay
    np.testing.assert_allclose([s.weight for s in samples], group_advantages([0.0, 1.0, 0.0, 0.0]), rtol=1e-13)


def test_expert_iteration_samples_only_targets_below_the_proof_cap():
    targets = [Target(f"t{i}", "", f"theorem t{i} : True := by") for i in range(4)]
    counts = {"t0": 16, "t1": 15, "t3": 0}  # t2 absent: no stored proofs
    assert [t.id for t in expert_iteration_targets(targets, counts, 16)] == ["t1", "t2", "t3"]
    assert [t.id for t in expert_iteration_targets(targets, counts, 15)] == ["t2", "t3"]


PROMPTS = {"p0": (1,), "p1": (1, 2), "p2": (1, 3)}


def test_expert_iteration_samples_are_the_newly_stored_proofs():
    groups = [
        group("p0", [1, 1, 1, 0], proofs={0: "\n  simp", 1: "\n  simp", 2: "\n  rfl"}),  # two distinct proofs
        group("p1", [1, 1, 0, 0], proofs={0: "\n  try simp", 1: "\n  ring"}, lengths={1: 95}),
        group("p2", [1, 0, 0, 0], proofs={0: "\n  omega"}),
        [],  # a prompt that was skipped: no attempts
    ]
    # p0 stored both of its proofs; p1 both (the `try` one is stored but not trained on);
    # p2's proof was already in its store, so nothing is new.
    new = {"p0": ["\n  simp", "\n  rfl"], "p1": ["\n  try simp", "\n  ring"], "p2": []}
    samples = expert_iteration_samples(groups, new, PROMPTS)
    assert [(s.rollout, s.proof, tuple(s.prompt_ids.tolist()), s.weight, s.group) for s in samples] == [
        (groups[0][0].rollout, "\n  simp", (1,), 1.0, 0),  # the first rollout of a duplicated proof
        (groups[0][2].rollout, "\n  rfl", (1,), 1.0, 0),
        (groups[1][1].rollout, "\n  ring", (1, 2), 1.0, 1),  # weight 1: no length penalty on stored proofs
    ]


def _stored(problem_id, proof, seed=0):
    return StoredProofSample(make_rollout(problem_id, seed=seed), 1.0, 0, proof, PROMPTS[problem_id])


def test_expert_iteration_buffer_keeps_three_iterations_deduplicated():
    buffer = ExpertIterationBuffer(window=3)
    iterations = [
        [_stored("p0", "a"), _stored("p1", "b")],
        [_stored("p0", "c")],
        [_stored("p0", "a", seed=5), _stored("p2", "a")],  # p0's "a" again (a recurring conjecture)
        [_stored("p1", "d")],
    ]
    buffer.add_iteration(iterations[0])
    buffer.add_iteration(iterations[1])
    buffer.add_iteration(iterations[2])
    assert buffer.samples() == [iterations[0][0], iterations[0][1], iterations[1][0], iterations[2][1]]
    buffer.add_iteration(iterations[3])  # the first iteration falls out; the later copy of "a" stays
    assert buffer.samples() == [iterations[1][0], iterations[2][0], iterations[2][1], iterations[3][0]]
    assert [list(it) for it in buffer.by_iteration()] == iterations[1:]
    with pytest.raises(ValueError):
        ExpertIterationBuffer(window=0)


def test_expert_iteration_buffer_round_trips_through_json():
    buffer = ExpertIterationBuffer(window=3)
    buffer.add_iteration([_stored("p0", "a"), _stored("p1", "b", seed=2)])
    buffer.add_iteration([])
    restored = ExpertIterationBuffer(window=3)
    restored.load_json(json.loads(json.dumps(buffer.to_json())))
    assert restored.to_json() == buffer.to_json()  # every field (rollouts hold arrays: compared by value here)


def test_expert_iteration_buffer_refuses_samples_without_prompts():
    with pytest.raises(TypeError, match="StoredProofSample"):
        ExpertIterationBuffer().add_iteration([TrainingSample(make_rollout("p0"), 1.0, 0)])
    with pytest.raises(ValueError, match="prompt token ids"):
        StoredProofSample(make_rollout("p0"), 1.0, 0, "a", ())


def test_types_reject_inconsistent_data():
    with pytest.raises(ValueError, match="disagree"):
        Rollout("p", (1, 2), "x", (0.0,), "stop")
    with pytest.raises(ValueError, match="cannot be verified"):
        Attempt(make_rollout("p"), None, True)
    with pytest.raises(ValueError, match="origin"):
        Problem("p", "", "theorem p : True := by", "synthetic", "p")
