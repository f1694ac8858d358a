"""Guide scores, Guide reply parsing and the Conjecturer reward, on cases from SPEC 4.7 and 6."""

import math

import pytest

from sgs_jax.sgs.rewards import (
    conjecturer_rewards,
    conjecturer_samples,
    fill_unparsable,
    guide_score,
    kept_conjectures,
    min_max_normalize,
    p70_threshold,
    parse_guide_reply,
)
from sgs_jax.sgs.types import GuideScores, Rollout


@pytest.mark.parametrize(
    "relevance, redundancy, complexity, expected",
    [
        (5, 0, 0, 8.0),  # the best possible: 5 + 2 + 1
        (4, 0, 1, 6.0),
        (3, 1, 0, 5.0),
        (2, 1, 2, 2.0),
        (0, 1, 2, 0.0),  # lowest raw score below the complexity cut
        (5, 0, 3, 0.0),  # complexity 3 and 4 zero everything
        (5, 0, 4, 0.0),
    ],
)
def test_guide_score_eq3(relevance, redundancy, complexity, expected):
    assert guide_score(relevance, redundancy, complexity) == expected


@pytest.mark.parametrize("scores", [(6, 0, 0), (-1, 0, 0), (0, 2, 0), (0, -1, 0), (0, 0, 5), (0, 0, -1)])
def test_guide_score_rejects_out_of_range(scores):
    with pytest.raises(ValueError, match="outside"):
        guide_score(*scores)


def reply(relevance="4", redundancy="0", complexity="1", prefix="The conjecture is useful.\n"):
    return (
        f"{prefix}<begin_relevance_score>{relevance}<end_relevance_score>\n"
        f"<begin_redundancy_score>{redundancy}<end_redundancy_score>\n"
        f"<begin_conclusion_complexity_score>{complexity}<end_conclusion_complexity_score>"
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        (reply(), (4, 0, 1)),
        (reply(" 5 ", "\n1\n", "\t0  "), (5, 1, 0)),  # spaces and newlines around numbers
        (reply().replace("<begin_relevance_score>", "< begin_relevance_score >"), (4, 0, 1)),
        (reply("2", "1", "3", prefix="Draft: " + reply("5", "0", "0") + "\nOn reflection:\n"), (2, 1, 3)),
        (  # tags in another order
            "<begin_conclusion_complexity_score>4<end_conclusion_complexity_score>"
            "<begin_relevance_score>0<end_relevance_score><begin_redundancy_score>1<end_redundancy_score>",
            (0, 1, 4),
        ),
        (reply("+3"), (3, 0, 1)),
        (reply("6"), None),  # out of range
        (reply(redundancy="2"), None),
        (reply(complexity="5"), None),
        (reply("-1"), None),
        (reply("4.5"), None),  # not an integer
        (reply("four"), None),
        (reply(""), None),
        (reply("4 5"), None),
        (reply().replace("<end_redundancy_score>", ""), None),  # unterminated tag
        (reply().split("<begin_conclusion")[0], None),  # a score missing
        (reply(prefix=reply("5", "0", "0") + "<begin_relevance_score>oops<end_relevance_score>"), (4, 0, 1)),
        (reply("5") + "<begin_relevance_score> x <end_relevance_score>", None),  # last occurrence is bad
        (reply("5") + "<begin_relevance_score>3", None),  # last begin has no end
        ("", None),
        (None, None),
        (12, None),
    ],
)
def test_parse_guide_reply(text, expected):
    parsed = parse_guide_reply(text)
    assert parsed == expected
    if expected is not None:
        assert isinstance(parsed, GuideScores) and parsed.relevance == expected[0]


@pytest.mark.parametrize(
    "rates, expected",
    [
        ([], 0.0),
        ([0.0, 1.0, 0.0, 1.0], 0.0),  # no rate strictly inside (0, 1)
        ([0.5], 0.5),  # n = 1: index 0
        ([0.125, 0.25, 0.375], 0.375),  # n = 3: floor(2.1) = 2
        ([0.875, 0.125, 0.5, 0.25, 0.75, 0.0, 1.0], 0.75),  # n = 5: floor(3.5) = 3 of the sorted
        ([0.125, 0.25, 0.25, 0.25, 0.5, 0.5, 0.75, 0.875], 0.5),  # n = 8: index 5, a tie
        ([i / 100 for i in range(1, 91)], 0.64),  # n = 90: floor(63.0) = 63 exactly
    ],
)
def test_p70_threshold(rates, expected):
    assert p70_threshold(rates) == expected
    assert p70_threshold(rates, quantile=0.7) == expected


@pytest.mark.parametrize(
    "quantile, n, index",
    [
        (0.5, 4, 2),  # floor(2.0)
        (0.5, 5, 2),  # floor(2.5)
        (0.3, 10, 3),
        (0.9, 10, 9),  # floor(9.0) = 9, the largest index
        (0.7, 170, 119),  # 0.7 * 170 = 118.99999999999999 as a float; exactly 119
        (0.29, 100, 29),  # 0.29 * 100 = 28.999999999999996 as a float; exactly 29
        (0.999, 3, 2),  # never past the end
        (0.01, 3, 0),
    ],
)
def test_keep_quantile_index_is_exact(quantile, n, index):
    rates = [(i + 1) / (n + 1) for i in range(n)]  # n distinct rates inside (0, 1), sorted
    assert p70_threshold(rates, quantile) == rates[index]
    kept = kept_conjectures(rates + [0.0, 1.0], quantile)
    assert kept == list(range(index + 1))  # s = 0 and s = 1 are never kept


def test_keep_quantile_changes_the_conjecturer_reward():
    rates = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75]  # n = 6
    assert conjecturer_rewards(rates, None, quantile=0.5) == [1.0, 2 / 3, 1 / 3, 0.0, None, None]  # sorted[3]
    assert conjecturer_rewards(rates, None) == conjecturer_rewards(rates, None, quantile=0.7)


@pytest.mark.parametrize("quantile", [0.0, 1.0, -0.1, 1.5])
def test_keep_quantile_outside_the_open_interval_is_refused(quantile):
    with pytest.raises(ValueError, match="keep quantile"):
        p70_threshold([0.5], quantile)


def test_min_max_normalize_and_fill():
    assert min_max_normalize([]) == []
    assert min_max_normalize([2.0, 4.0, 3.0]) == [0.0, 1.0, 0.5]
    assert min_max_normalize([0.3, 0.3]) == [1.0, 1.0]  # max = min
    assert fill_unparsable([2.0, None, 4.0, None]) == [2.0, 3.0, 4.0, 3.0]
    assert fill_unparsable([None, None]) == [0.0, 0.0]


def test_conjecturer_rewards_hand_computed():
    rates = [0.0, 0.125, 0.25, 0.5, 0.75, 1.0, 0.875]  # p70 = 0.75: indices 1-4 kept
    scores = ["ignored", (5, 0, 0), None, (2, 1, 1), GuideScores(5, 0, 3), None, (4, 0, 0)]
    # parsed kept scores 8, 3, 0 -> the unparsable one gets 11/3.
    # R = (1 - s) * g: 0.875 * 8 = 7, 0.75 * 11/3 = 2.75, 0.5 * 3 = 1.5, 0.25 * 0 = 0.
    expected = [None, 1.0, 2.75 / 7, 1.5 / 7, 0.0, None, None]
    got = conjecturer_rewards(rates, scores)
    assert [g is None for g in got] == [e is None for e in expected]
    assert all(math.isclose(g, e, abs_tol=1e-12) for g, e in zip(got, expected) if e is not None)


def test_conjecturer_rewards_accept_raw_eq3_values():
    rates = [0.25, 0.5, 0.125]
    triples = [(4, 0, 1), (5, 1, 0), (0, 0, 3)]
    assert conjecturer_rewards(rates, triples) == conjecturer_rewards(rates, [guide_score(*t) for t in triples])


def test_ties_at_p70_are_all_kept():
    rates = [0.5, 0.125, 0.5, 0.25, 0.75, 0.875, 0.25, 0.25]  # n = 8, p70 = 0.5 (tie of two)
    rewards = conjecturer_rewards(rates)  # No Guide: R = 1 - s
    assert [r is not None for r in rewards] == [True, True, True, True, False, False, True, True]
    # R in {0.5, 0.875, 0.75}: min 0.5, max 0.875
    assert rewards[0] == rewards[2] == 0.0 and rewards[1] == 1.0
    assert math.isclose(rewards[3], 0.25 / 0.375) and rewards[3] == rewards[6] == rewards[7]


def test_no_rates_inside_the_open_interval_keeps_nothing():
    assert conjecturer_rewards([0.0, 1.0, 1.0, 0.0], [8.0, 8.0, 8.0, 8.0]) == [None] * 4
    assert conjecturer_rewards([]) == []


def test_all_guide_replies_unparsable_gives_all_ones():
    # Every kept score is filled with 0 (no parsed score), so R = 0 everywhere: max = min.
    # n = 4, p70 = sorted[2] = 0.5: the last is not kept.
    assert conjecturer_rewards([0.125, 0.25, 0.5, 0.875], [None] * 4) == [1.0, 1.0, 1.0, None]


def test_single_kept_conjecture_is_max_equals_min():
    assert conjecturer_rewards([0.5, 0.0], [3.0, None]) == [1.0, None]


def test_no_guide_is_one_minus_s_normalised():
    rates = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75]  # n = 6, p70 = sorted[4] = 0.625
    assert conjecturer_rewards(rates, None) == [1.0, 0.75, 0.5, 0.25, 0.0, None]


@pytest.mark.parametrize(
    "rates, scores, match",
    [([0.5, 1.5], None, r"\[0, 1\]"), ([-0.1], None, r"\[0, 1\]"), ([0.5, 0.25], [1.0], "2 conjectures"),
     ([0.5], [float("nan")], "not finite"), ([0.5], [(7, 0, 0)], "outside")],
)
def test_conjecturer_rewards_reject_bad_input(rates, scores, match):
    with pytest.raises(ValueError, match=match):
        conjecturer_rewards(rates, scores)


def rollout(length, problem_id="c"):
    return Rollout(problem_id, tuple(range(length)), "x", (0.0,) * length, "stop")


def test_conjecturer_samples_apply_the_length_penalty():
    rollouts = [rollout(10), rollout(10), rollout(90), rollout(100)]
    samples = conjecturer_samples(rollouts, [None, 0.25, 1.0, 0.0], max_tokens=100)
    assert [(s.rollout, s.weight, s.group) for s in samples] == [
        (rollouts[1], 0.25, 1), (rollouts[2], -0.5, 2), (rollouts[3], -1.0, 3)
    ]
    with pytest.raises(ValueError, match="rollouts"):
        conjecturer_samples(rollouts, [None], 100)
