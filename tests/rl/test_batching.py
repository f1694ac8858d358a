"""Micro-batch construction: layout of one row, bucketing, padding rows, batch normaliser."""

import numpy as np
import pytest

from sgs_jax.rl.batching import (
    SequenceExample,
    batch_scale,
    bucket_for,
    group_batches,
    length_buckets,
    make_micro_batches,
    padding_fraction,
)
from sgs_jax.sgs.types import Rollout, TrainingSample


def test_row_layout_by_hand():
    ex = SequenceExample((5, 6, 7), (8, 9), weight=0.5, old_logprobs=(-1.0, -2.0))
    (batch,) = make_micro_batches([ex], np.array([0.25]), micro_batch_size=2, buckets=(6,), pad_id=0)
    # sequence 5 6 7 8 9: inputs 5 6 7 8, targets 6 7 8 9; completion targets at 2 and 3.
    np.testing.assert_array_equal(batch.input_ids, [[5, 6, 7, 8, 0, 0], [0] * 6])
    np.testing.assert_array_equal(batch.targets, [[6, 7, 8, 9, 0, 0], [0] * 6])
    np.testing.assert_array_equal(batch.attention_mask, [[1, 1, 1, 1, 0, 0], [0] * 6])
    np.testing.assert_array_equal(batch.loss_mask, [[0, 0, 1, 1, 0, 0], [0] * 6])
    np.testing.assert_array_equal(batch.old_logprobs, [[0, 0, -1, -2, 0, 0], [0] * 6])
    np.testing.assert_array_equal(batch.weights, [0.5, 0.0])  # the filler row weighs nothing
    np.testing.assert_array_equal(batch.scale, [0.25, 0.0])


def test_single_token_prompt_and_completion():
    (batch,) = make_micro_batches([SequenceExample((1,), (4,))], np.array([1.0]), 1, (4,))
    np.testing.assert_array_equal(batch.input_ids, [[1, 0, 0, 0]])
    np.testing.assert_array_equal(batch.targets, [[4, 0, 0, 0]])
    np.testing.assert_array_equal(batch.loss_mask, [[1, 0, 0, 0]])


def test_sorted_by_length_and_bucketed():
    lengths = [3, 17, 9, 30, 5, 12]  # model inputs = prompt 1 + completion - 1
    examples = [SequenceExample((1,), tuple(range(3, 3 + n))) for n in lengths]
    batches = make_micro_batches(examples, np.ones(6), micro_batch_size=2, buckets=length_buckets(32, 8))
    assert [b.shape for b in batches] == [(2, 32), (2, 12), (2, 8)]
    assert [int(b.attention_mask.sum()) for b in batches] == [30 + 17, 12 + 9, 5 + 3]
    assert padding_fraction(batches) == pytest.approx(1 - 76 / (64 + 24 + 16))
    # Every example lands exactly once.
    assert sorted(int(b.loss_mask[r].sum()) for b in batches for r in range(2)) == sorted(lengths)


def test_length_buckets_two_per_octave():
    assert length_buckets(512, 64) == (64, 96, 128, 192, 256, 384, 512)
    assert length_buckets(100, 64) == (64, 96, 100)
    assert bucket_for(97, length_buckets(512, 64)) == 128
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        bucket_for(513, length_buckets(512, 64))


def test_batch_scale_against_hand_values():
    examples = [SequenceExample((1,), (3,) * n, group=g) for n, g in [(2, 0), (3, 0), (5, 1)]]
    np.testing.assert_allclose(batch_scale(examples, "batch_tokens"), [0.1] * 3, rtol=1e-7)
    np.testing.assert_allclose(batch_scale(examples, "sequence"), [1 / 6, 1 / 9, 1 / 15], rtol=1e-6)
    # group 0 has 5 tokens, group 1 has 5; two groups.
    np.testing.assert_allclose(batch_scale(examples, "group_tokens"), [0.1, 0.1, 0.1], rtol=1e-6)
    # A batch with fewer groups than a full one still divides by the constant count (4 here).
    np.testing.assert_allclose(batch_scale(examples, "group_tokens", num_groups=4), [0.05] * 3, rtol=1e-6)
    with pytest.raises(ValueError, match="num_groups"):
        batch_scale(examples, "batch_tokens", num_groups=4)


def _grouped(num_groups, size):
    """num_groups groups of `size` examples; example j of group g has completion length g+1."""
    return [SequenceExample((1,), (3,) * (g + 1), group=g, weight=float(j)) for g in range(num_groups) for j in range(size)]


@pytest.mark.parametrize(
    "num_groups, size, batch_size, per_batch, batch_groups",
    [
        (16, 8, 64, 8, [8, 8]),  # the paper's batch: exactly 8 groups of 8
        (11, 8, 64, 8, [8, 3]),  # the last batch holds the groups left
        (5, 2, 4, 2, [2, 2, 1]),
        (3, 4, 4, 1, [1, 1, 1]),  # one group per batch
        (0, 8, 64, 64, []),  # no data: no batches
    ],
)
def test_group_batches_cut_on_group_boundaries(num_groups, size, batch_size, per_batch, batch_groups):
    examples = _grouped(num_groups, size)
    batches, got_per_batch = group_batches(examples, batch_size, seed=3)
    assert got_per_batch == per_batch
    assert [len({e.group for e in b}) for b in batches] == batch_groups
    assert all(len(b) == size * n for b, n in zip(batches, batch_groups))
    seen = [e.group for b in batches for e in b]
    assert sorted(seen) == sorted(e.group for e in examples)  # every example exactly once
    for b in batches:  # each group whole and in its input order
        for g in {e.group for e in b}:
            assert [e.weight for e in b if e.group == g] == [float(j) for j in range(size)]
    assert group_batches(examples, batch_size, seed=3) == (batches, per_batch)  # deterministic


def test_group_batches_shuffle_groups_with_the_seed():
    examples = _grouped(16, 2)
    orders = {tuple(e.group for b in group_batches(examples, 4, seed)[0] for e in b[::2]) for seed in range(5)}
    assert len(orders) > 1


def test_group_batches_refuse_uneven_groups():
    with pytest.raises(ValueError, match="multiple of the CISPO group size 8"):
        group_batches(_grouped(2, 8), 60, seed=0)
    with pytest.raises(ValueError, match="same size"):
        group_batches(_grouped(2, 8)[:-1], 64, seed=0)


def test_bad_examples_are_rejected_clearly():
    with pytest.raises(ValueError, match="completion token"):
        SequenceExample((1,), ())
    with pytest.raises(ValueError, match="prompt token"):
        SequenceExample((), (3,))
    with pytest.raises(ValueError, match="old_logprobs"):
        SequenceExample((1,), (3, 4), old_logprobs=(-1.0,))
    with pytest.raises(ValueError, match="finite"):
        SequenceExample((1,), (3,), weight=float("nan"))
    with pytest.raises(ValueError, match="exceeds"):
        make_micro_batches([SequenceExample((1,) * 10, (3,))], np.ones(1), 1, (8,))


def test_from_training_sample_keeps_tokens_weight_logprobs_group():
    rollout = Rollout("p", (7, 8, 2), "text", (-0.1, -0.2, -0.3), "stop")
    ex = SequenceExample.from_training_sample([1, 5], TrainingSample(rollout, -0.5, 4))
    assert ex.prompt_ids.tolist() == [1, 5] and ex.completion_ids.tolist() == [7, 8, 2]
    assert (ex.weight, ex.group) == (-0.5, 4)
    np.testing.assert_allclose(ex.old_logprobs, [-0.1, -0.2, -0.3], rtol=1e-6)
    # The example holds the rollout's own (read-only) arrays: no per-token copy.
    assert np.shares_memory(ex.completion_ids, rollout.token_ids) and not ex.completion_ids.flags.writeable
