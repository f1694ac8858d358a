"""Packed micro-batches (`TrainConfig.pack_length`): the layout, the model on packed rows,
and a packed optimiser step against the unpacked one (fp32, 1e-5)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sgs_jax.models import create_model, tiny
from sgs_jax.models.llama import segment_positions
from sgs_jax.parallel import make_mesh
from sgs_jax.rl.batching import (
    SequenceExample,
    batch_scale,
    length_buckets,
    make_micro_batches,
    pack_micro_batches,
    padding_fraction,
)
from sgs_jax.rl.logprobs import token_logprobs
from sgs_jax.rl.optimizer import OptimizerConfig
from sgs_jax.rl.train_step import TrainConfig, Trainer
from tests.rl.train_support import random_examples

CONFIG = tiny(num_heads=8, num_kv_heads=4, head_dim=4, vocab_size=96, intermediate_size=64)


def _examples_of_lengths(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [SequenceExample(rng.integers(3, 90, n // 4 + 1), rng.integers(3, 90, n - n // 4), float(i % 3)) for i, n in enumerate(lengths)]


def _unpacked_rows(batch):
    """{(row, segment): (input_ids, targets, loss_mask, weights, scale)} of a packed batch."""
    out = {}
    for row in range(batch.segment_ids.shape[0]):
        for seg in sorted(set(batch.segment_ids[row]) - {0}):
            span = batch.segment_ids[row] == seg
            out[row, seg] = tuple(x[row, span] for x in (batch.input_ids, batch.targets, batch.loss_mask, batch.weights, batch.scale))
    return out


def test_packing_lays_every_sequence_out_once_in_balanced_rows():
    """Every sequence lands once, whole, in one row, with its own targets, loss mask and
    per-token weight and scale; rows hold at most the largest bucket; micro-batches are
    as few as fit, padded to their fullest row's bucket."""
    lengths = [237, 234, 225, 200, 165, 140, 136, 131]  # the training benchmark's 256-token batch
    examples = _examples_of_lengths([n + 1 for n in lengths])
    scale = batch_scale(examples)
    buckets = length_buckets(1024, 64)
    packed = pack_micro_batches(examples, scale, 1, buckets)
    assert [b.shape for b in packed] == [(1, 768), (1, 768)]  # 1,468 tokens in 1,536 slots
    unpacked = make_micro_batches(examples, scale, 4, length_buckets(256, 64))
    assert sum(b.input_ids.size for b in unpacked) == 1792
    found = {}
    for batch in packed:
        assert batch.weights.shape == batch.scale.shape == batch.segment_ids.shape
        for (row, seg), (ids, targets, loss, weight, sc) in _unpacked_rows(batch).items():
            found[tuple(ids)] = (targets, loss, weight, sc)
        # Segments are numbered 1, 2, ... from the row's start, each one contiguous run, padding after.
        for row in batch.segment_ids:
            runs = [s for i, s in enumerate(row) if i == 0 or s != row[i - 1]]
            assert runs == list(range(1, len(runs) + (0 if row[-1] == 0 else 1))) + ([0] if row[-1] == 0 else [])
        np.testing.assert_array_equal(batch.attention_mask, batch.segment_ids > 0)
    assert len(found) == len(examples)
    for e, s in zip(examples, scale):
        seq = np.concatenate([e.prompt_ids, e.completion_ids])
        targets, loss, weight, sc = found[tuple(seq[:-1])]
        np.testing.assert_array_equal(targets, seq[1:])
        np.testing.assert_array_equal(loss, np.arange(e.num_inputs) >= len(e.prompt_ids) - 1)
        assert (weight == e.weight).all() and (sc == np.float32(s)).all()


def test_packing_opens_a_micro_batch_when_no_row_fits_and_rejects_long_sequences():
    examples = _examples_of_lengths([60, 60, 60])  # 59 inputs each: two never share a 64-token row
    batches = pack_micro_batches(examples, batch_scale(examples), 1, (32, 64))
    assert [b.shape for b in batches] == [(1, 64)] * 3
    assert [sorted(set(b.segment_ids[0]) - {0}) for b in batches] == [[1]] * 3
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        pack_micro_batches(_examples_of_lengths([70]), np.ones(1), 1, (32, 64))
    assert pack_micro_batches([], np.ones(0), 1, (32, 64)) == []
    with pytest.raises(ValueError, match="pack_length"):
        TrainConfig(max_seq_len=64, pack_length=32)


def test_packing_keeps_the_layout_with_fewer_slots():
    """A large batch (300 sequences of 99-1,999 tokens, 2 rows of 8,192): rows filled to the
    full length, only the last micro-batch short, 1% padding. A small one (the benchmark's
    1,024-token batch, 1 row of up to 4,096): two equally full rows of 3,584 (four buckets
    per octave), where filling would leave 3,806 + 3,124 tokens in 4,096 + 3,584 slots."""
    rng = np.random.default_rng(0)
    large = _examples_of_lengths(list(rng.integers(100, 2000, 300)))
    batches = pack_micro_batches(large, batch_scale(large), 2, length_buckets(8192, 64, per_octave=4))
    assert [b.shape[1] for b in batches[:-1]] == [8192] * (len(batches) - 1) and batches[-1].shape[1] < 8192
    assert padding_fraction(batches) < 0.02
    assert sorted(e for b in batches for e in b.segment_ids.reshape(-1) if e).count(1) >= len(batches)
    assert sum(int(b.attention_mask.sum()) for b in batches) == sum(e.num_inputs for e in large)
    small = _examples_of_lengths([1020, 949, 948, 893, 814, 801, 769, 744])
    batches = pack_micro_batches(small, batch_scale(small), 1, length_buckets(4096, 64, per_octave=4))
    assert [b.shape for b in batches] == [(1, 3584), (1, 3584)]


def test_segment_positions_restart_at_each_sequence():
    segments = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0], [1, 2, 2, 2, 2, 2, 2, 2]])
    want = [[0, 1, 2, 0, 1, 0, 0, 1], [0, 0, 1, 2, 3, 4, 5, 6]]
    np.testing.assert_array_equal(np.asarray(segment_positions(segments)), want)


_ALONE_EXAMPLES = dict(n=7, vocab=96, seed=4, max_prompt=5, max_completion=20)


@functools.cache
def _alone_reference():
    """Each of the test's sequences run alone (attention `xla`, no packing): its log-probs
    by input ids, and the gradient of their weighted sum over completions. Computed once
    for every backend's test (one program of seven sequences: the test's longest compile)."""
    model = create_model(CONFIG.replace(attention="xla", head_dim=16), seed=3)
    examples = random_examples(**_ALONE_EXAMPLES)

    def alone_total(model):
        total, pieces = 0.0, {}
        for e in examples:
            seq = np.concatenate([e.prompt_ids, e.completion_ids])
            ids, targets = jnp.asarray(seq[None, :-1]), jnp.asarray(seq[None, 1:])
            one = token_logprobs(model, ids, jnp.ones_like(ids, bool), targets)[0]
            p = len(e.prompt_ids)
            total = total + e.weight * jnp.sum(one[p - 1 :])
            pieces[tuple(seq[:-1])] = one
        return total, pieces

    (_, pieces), grads = nnx.jit(nnx.value_and_grad(alone_total, has_aux=True))(model)
    return {ids: np.asarray(lp) for ids, lp in pieces.items()}, [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)]


@pytest.mark.parametrize("attention", ["xla", "blockwise", "auto"])
def test_packed_logprobs_equal_each_sequence_alone(attention):
    """Each sequence's log-probabilities and the gradient of their weighted sum, from packed
    rows, equal those of the sequence run alone (fp32, 1e-5)."""
    model = create_model(CONFIG.replace(attention=attention, head_dim=16), seed=3)
    examples = random_examples(**_ALONE_EXAMPLES)
    (batch,) = pack_micro_batches(examples, batch_scale(examples), 2, length_buckets(128, 16))

    def packed_total(model):
        lp = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.targets, segment_ids=batch.segment_ids)
        return jnp.sum(lp * batch.loss_mask * batch.weights), lp

    (_, lp), grads = nnx.jit(nnx.value_and_grad(packed_total, has_aux=True))(model)
    lp = np.asarray(lp)
    pieces, want_grads = _alone_reference()
    for (row, seg), (ids, *_) in _unpacked_rows(batch).items():
        np.testing.assert_allclose(lp[row, batch.segment_ids[row] == seg], pieces[tuple(ids)], atol=1e-5, rtol=0)
    for got, want in zip(jax.tree_util.tree_leaves(grads), want_grads):
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


def _params(trainer):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(trainer.params))]


def _config(**kw):
    return TrainConfig(max_seq_len=16, min_bucket=16, optimizer=OptimizerConfig(learning_rate=1e-3), **kw)


@pytest.mark.parametrize(
    "objective, kw",
    [("reinforce_half", {}), ("cispo", dict(with_old=True, groups=4)), ("sft", {})],
)
def test_packed_step_equals_the_unpacked_step(objective, kw):
    """One optimiser step on packed rows (2 rows of up to 48 tokens) gives the unpacked
    step's loss, metrics and updated parameters (fp32, 1e-5), in fewer micro-batches."""
    examples = random_examples(24, 96, seed=11, **kw)
    normalization = "group_tokens" if objective == "cispo" else "batch_tokens"
    results = {}
    for name, extra in (("unpacked", dict(micro_batch_size=4)), ("packed", dict(micro_batch_size=2, pack_length=48))):
        trainer = Trainer(create_model(CONFIG, seed=1), _config(objective=objective, normalization=normalization, **extra))
        results[name] = trainer.step(examples), _params(trainer)
    (unpacked, want), (packed, got) = results["unpacked"], results["packed"]
    assert packed["num_micro_batches"] < unpacked["num_micro_batches"]
    assert packed["padding_fraction"] < unpacked["padding_fraction"]
    for name in set(unpacked) - {"num_micro_batches", "padding_fraction"}:
        assert packed[name] == pytest.approx(unpacked[name], rel=1e-5, abs=1e-7), name
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_sharded_packed_step_equals_single_device():
    """Packed rows split over a 2x2x2 mesh (rows over data x fsdp) give the one-device update."""
    examples = random_examples(24, 96, seed=12)
    config = _config(micro_batch_size=4, pack_length=32)
    single = Trainer(create_model(CONFIG, seed=1), config)
    want_metrics = single.step(examples)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = Trainer(create_model(CONFIG, seed=1, mesh=mesh), config, mesh)
    got_metrics = sharded.step(examples)
    assert got_metrics["loss"] == pytest.approx(want_metrics["loss"], rel=1e-5)
    for a, b in zip(_params(sharded), _params(single)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
