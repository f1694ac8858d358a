"""The training step: micro-batch accumulation, sharding, parity with transformers + torch.

Tolerances (fp32): parameters after an update 1e-5 absolute; losses and gradient norms
1e-5 relative.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from sgs_jax.models import create_model, load_hf, tiny
from sgs_jax.parallel import make_mesh
from sgs_jax.rl.optimizer import OptimizerConfig
from sgs_jax.rl.batching import group_batches
from sgs_jax.rl.train_step import TrainConfig, Trainer
from tests.models.hf_reference import make_hf_model
from tests.rl.train_support import completion_logprobs, random_examples, weighted_nll_batch_tokens

# Heads, KV heads, MLP and vocabulary all divide by 2, so tensor=2 really shards them.
CONFIG = tiny(num_heads=8, num_kv_heads=4, head_dim=4, vocab_size=96, intermediate_size=64)


def _params(trainer):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(trainer.params))]


def _train_config(micro, **kw):
    # Adam's first step moves each weight by about lr * sign(grad), whatever the gradient's
    # size, so weights with near-zero gradients amplify rounding: lr 1e-3 keeps the 1e-5
    # comparison meaningful (updates are ~100x the tolerance) yet robust.
    kw.setdefault("optimizer", OptimizerConfig(learning_rate=1e-3))
    return TrainConfig(micro_batch_size=micro, max_seq_len=16, min_bucket=16, **kw)


@pytest.fixture(scope="module")
def single_device():
    """One update on one device: 32 sequences in 4 micro-batches of 8."""
    examples = random_examples(32, 96, seed=5)
    model = create_model(CONFIG, seed=1)
    trainer = Trainer(model, _train_config(8))
    metrics = trainer.step(examples)
    return examples, metrics, _params(trainer)


# 2x2x2 exercises all three mesh axes in the default run; pure FSDP over 8 is one more
# ~15 s compile on 2 cores, so it runs with --runslow.
@pytest.mark.parametrize(
    "shape",
    [dict(data=2, fsdp=2, tensor=2), pytest.param(dict(data=1, fsdp=8, tensor=1), marks=pytest.mark.slow)],
    ids=["2x2x2", "1x8x1"],
)
def test_sharded_step_equals_single_device(single_device, shape):
    examples, metrics, expected = single_device
    mesh = make_mesh(**shape)
    trainer = Trainer(create_model(CONFIG, seed=1, mesh=mesh), _train_config(8), mesh)
    got = trainer.step(examples)
    assert got["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    assert got["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
    for a, b in zip(_params(trainer), expected):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    initial = [np.asarray(x) for x in jax.tree_util.tree_leaves(nnx.state(create_model(CONFIG, seed=1)))]
    assert max(np.abs(a - b).max() for a, b in zip(expected, initial)) > 5e-4  # the update is real


def test_full_remat_accumulates_into_the_accumulator_inside_the_backward():
    """Under full remat the layers' backward adds into the accumulator in place
    (`Llama.hidden_states(layer_grad_acc=...)`): from a random non-zero accumulator it gives
    the accumulator plus the plain gradient."""
    examples = random_examples(32, 96, seed=5)
    plain = Trainer(create_model(CONFIG, seed=1), _train_config(8))
    remat = Trainer(create_model(CONFIG.replace(remat_policy="full"), seed=1), _train_config(8))
    assert remat.programs._accumulate_in_backward and not plain.programs._accumulate_in_backward
    batch = remat.micro_batches(examples)[0]

    def noisy_acc():  # a fresh one per call: the accumulator is donated
        grads, sums = plain.programs.abstract_acc
        noise = lambda g: jax.random.normal(jax.random.key(3), g.shape, g.dtype)  # noqa: E731
        return jax.tree_util.tree_map(noise, grads), jax.tree_util.tree_map(lambda m: jnp.zeros(m.shape, m.dtype), sums)

    got = remat.programs.accumulate(remat.params, noisy_acc(), batch)[0]
    want = plain.programs.accumulate(plain.params, noisy_acc(), batch)[0]
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_start_equals_accumulating_into_zeros(remat):
    """A step's first micro-batch runs `start`, which builds the accumulator from that
    micro-batch's gradient alone: the numbers `accumulate` gives from a zeroed one."""
    trainer = Trainer(create_model(CONFIG.replace(remat_policy=remat), seed=1), _train_config(8))
    batch = trainer.micro_batches(random_examples(32, 96, seed=5))[0]
    zeros = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), trainer.programs.abstract_acc)
    got = trainer.programs.start(trainer.params, batch)
    want = trainer.programs.accumulate(trainer.params, zeros, batch)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-7, rtol=0)
    assert max(float(np.abs(np.asarray(a)).max()) for a in jax.tree_util.tree_leaves(got[0])) > 1e-4  # a real gradient


def test_offloaded_remat_on_a_mesh_gives_the_no_remat_update(single_device):
    """`offload` is full remat (the same in-place accumulation) with the saved layer inputs in
    host memory (CPU devices have a pinned_host memory too): 4 sharded micro-batches on 2x2x2
    give the single-device no-remat update."""
    examples, metrics, expected = single_device
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = Trainer(create_model(CONFIG.replace(remat_policy="offload"), seed=1, mesh=mesh), _train_config(8), mesh)
    assert sharded.programs._accumulate_in_backward
    got_metrics = sharded.step(examples)
    assert got_metrics["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    assert got_metrics["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
    for a, b in zip(_params(sharded), expected):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_four_micro_batches_equal_one_big_batch(single_device):
    """Batch-token normalisation over the whole batch, zero-weight sequences counted in the
    denominator. The big batch also runs with full remat: that must not change anything."""
    examples, metrics, four_micro_params = single_device
    assert metrics["num_micro_batches"] == 4
    assert any(e.weight == 0 for e in examples)  # their tokens must count in the denominator
    model = create_model(CONFIG, seed=1)
    reference_loss = weighted_nll_batch_tokens(lambda ids, mask: model(ids, mask), examples)
    big = Trainer(create_model(CONFIG.replace(remat_policy="full"), seed=1), _train_config(32))
    whole = big.step(examples)
    assert whole["num_micro_batches"] == 1
    for m in (metrics, whole):
        assert m["loss"] == pytest.approx(reference_loss, rel=1e-5)
        assert m["token_count"] == sum(len(e.completion_ids) for e in examples)
    assert metrics["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    for a, b in zip(four_micro_params, _params(big)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    # A fresh optimiser state per iteration: step count back to 0, moments zero.
    big.reset_optimizer()
    assert all(float(np.abs(np.asarray(x)).max()) == 0 for x in jax.tree_util.tree_leaves(big.opt_state))


def test_cispo_group_normalisation_accumulates_exactly():
    """CISPO with the official per-group normaliser: 3 micro-batches == NumPy reference."""
    examples = random_examples(12, 96, seed=7, with_old=True, groups=3)
    model = create_model(CONFIG, seed=2)
    lps = completion_logprobs(lambda ids, mask: model(ids, mask), examples)
    group_tokens = {g: sum(len(e.completion_ids) for e in examples if e.group == g) for g in range(3)}
    expected = 0.0
    for e, lp in zip(examples, lps):
        w = np.clip(np.exp(lp - np.asarray(e.old_logprobs)), 0.0, 4.0)
        expected -= e.weight * np.sum(w * lp) / (group_tokens[e.group] * 3)
    trainer = Trainer(model, _train_config(4, objective="cispo", normalization="group_tokens"))
    metrics = trainer.step(examples)
    assert metrics["num_micro_batches"] == 3
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
    ratios = np.concatenate([np.exp(lp - np.asarray(e.old_logprobs)) for e, lp in zip(examples, lps)])
    assert metrics["clip_fraction"] == pytest.approx(np.mean((ratios < 0) | (ratios > 4)), abs=1e-6)
    assert metrics["mean_ratio"] == pytest.approx(np.mean(ratios), rel=1e-4)


def test_cispo_epoch_batches_whole_groups_with_a_constant_group_count():
    """5 groups of 3, batch 6: batches of 2 whole groups (the last holds 1), each step's loss
    the NumPy per-group loss divided by 2 groups, the last batch's too (SPEC Section 5)."""
    examples = random_examples(15, 96, seed=11, with_old=True, groups=5)
    model = create_model(CONFIG, seed=3)
    lps = completion_logprobs(lambda ids, mask: model(ids, mask), examples)
    logprob = {id(e): lp for e, lp in zip(examples, lps)}
    # lr 1e-30: the weights do not move, so every step's loss is a function of the same model.
    config = _train_config(4, objective="cispo", normalization="group_tokens", batch_size=6,
                           optimizer=OptimizerConfig(learning_rate=1e-30))
    steps = Trainer(model, config).train_epoch(examples, seed=4)
    batches, per_batch = group_batches(examples, 6, seed=4)
    assert per_batch == 2 and [len(b) for b in batches] == [6, 6, 3] and len(steps) == 3
    for batch, metrics in zip(batches, steps):
        groups = {e.group for e in batch}
        assert all(sum(x.group == g for x in batch) == 3 for g in groups)  # whole groups only
        group_tokens = {g: sum(len(e.completion_ids) for e in batch if e.group == g) for g in groups}
        expected = 0.0
        for e in batch:
            lp = logprob[id(e)]
            w = np.clip(np.exp(lp - np.asarray(e.old_logprobs)), 0.0, 4.0)
            expected -= e.weight * np.sum(w * lp) / (group_tokens[e.group] * 2)
        assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
        assert metrics["token_count"] == sum(group_tokens.values())


def test_cispo_needs_old_logprobs():
    trainer = Trainer(create_model(CONFIG, seed=0), _train_config(4, objective="cispo"))
    with pytest.raises(ValueError, match="old_logprobs"):
        trainer.step(random_examples(2, 96))


def _torch_reference(hf, examples, lr, steps):
    """Weighted NLL (batch-token normalised) with torch autograd; Adam(0.9, 0.95) + clip 1.0."""
    opt = torch.optim.Adam(hf.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    losses, norms = [], []
    total = sum(len(e.completion_ids) for e in examples)
    for _ in range(steps):
        opt.zero_grad()
        loss = 0.0
        for e in examples:
            seq = torch.tensor(np.concatenate([e.prompt_ids, e.completion_ids])[None].astype(np.int64))
            logp = torch.log_softmax(hf(input_ids=seq).logits[0].double(), -1)
            p = len(e.prompt_ids)
            picked = logp[torch.arange(p - 1, seq.shape[1] - 1), seq[0, p:]]
            loss = loss - e.weight * picked.sum() / total
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)))
        losses.append(float(loss))
        opt.step()
    return losses, norms


def test_loss_grad_norm_and_updates_match_transformers_and_torch(tmp_path):
    hf = make_hf_model(seed=4)
    hf.save_pretrained(tmp_path / "before")
    model = load_hf(tmp_path / "before")
    weights = [4.0, 0.0, 4.0, 2.0, -1.5, 4.0]  # large enough that clipping is active
    examples = random_examples(6, 101, seed=9, weights=weights)
    trainer = Trainer(model, TrainConfig(micro_batch_size=2, max_seq_len=16, min_bucket=16,
                                         optimizer=OptimizerConfig(learning_rate=1e-4)))
    ours = [trainer.step(examples) for _ in range(2)]
    losses, norms = _torch_reference(hf, examples, 1e-4, 2)
    assert norms[0] > 1.0  # the clip really acts
    for m, loss, norm in zip(ours, losses, norms):
        assert m["loss"] == pytest.approx(loss, rel=1e-5)
        assert m["grad_norm"] == pytest.approx(norm, rel=1e-5)
    hf.save_pretrained(tmp_path / "after")
    expected = nnx.state(load_hf(tmp_path / "after"))
    for a, b in zip(_params(trainer), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(a, np.asarray(b), atol=2e-6, rtol=0)


@pytest.mark.slow  # one more compile (~15 s on 2 cores); the optimiser-level check is fast
def test_bf16_params_train_with_fp32_state():
    model = create_model(CONFIG.replace(dtype="bfloat16", param_dtype="bfloat16"), seed=1)
    trainer = Trainer(model, _train_config(8))
    before = _params(trainer)
    metrics = trainer.step(random_examples(8, 96))
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert {x.dtype for x in jax.tree_util.tree_leaves(trainer.params)} == {np.dtype("bfloat16")}
    moments = [x for x in jax.tree_util.tree_leaves(trainer.opt_state) if x.ndim]
    assert moments and {x.dtype for x in moments} == {np.dtype("float32")}
    assert any(not np.array_equal(a, b) for a, b in zip(before, _params(trainer)))
    # The caller's model object sees the trained parameters.
    np.testing.assert_array_equal(np.asarray(model.lm_head.kernel[...]), np.asarray(trainer.params["lm_head"]["kernel"][...]))


def test_roles_that_differ_only_in_host_settings_share_programs():
    """Solver and Conjecturer with the same objective and optimiser run the same compiled
    programs: batch size, length cap, buckets, normalisation and the shuffle seed are host-side."""
    solver = Trainer(create_model(CONFIG, seed=1), _train_config(4))
    conjecturer = Trainer(create_model(CONFIG, seed=2), TrainConfig(
        micro_batch_size=4, max_seq_len=48, min_bucket=16, batch_size=8, normalization="sequence",
        reset_optimizer=False, optimizer=OptimizerConfig(learning_rate=1e-3)))
    assert conjecturer.programs is solver.programs
    programs = solver.programs
    solver.step(random_examples(8, 96, seed=3))  # two micro-batches: start, then accumulate
    compiled = (programs.start._cache_size(), programs.accumulate._cache_size())
    assert compiled == (1, 1)
    conjecturer.train_epoch(random_examples(8, 96, seed=4), seed=7)  # same 16-token bucket
    assert (programs.start._cache_size(), programs.accumulate._cache_size()) == compiled  # nothing new compiled
    other = Trainer(create_model(CONFIG, seed=1), _train_config(4, objective="expert_iteration"))
    assert other.programs is not solver.programs


def test_micro_batch_that_does_not_split_over_the_mesh_fails_before_work():
    mesh = make_mesh(data=1, fsdp=8, tensor=1)
    with pytest.raises(ValueError, match=r"micro_batch_size=4 rows .*fsdp=8 = 8 devices"):
        Trainer(create_model(CONFIG, seed=1, mesh=mesh), _train_config(4), mesh)


def test_epoch_metrics_weight_per_token_means_by_each_steps_tokens():
    """Hand-computed: a clip fraction of 0.5 over 10 tokens and 0 over 30 is 5/40 over the
    epoch, not the mean of the two steps (0.25); the loss is a per-step value."""
    from sgs_jax.rl.train_step import epoch_metric

    steps = [{"loss": 1.0, "clip_fraction": 0.5, "token_count": 10.0},
             {"loss": 3.0, "clip_fraction": 0.0, "token_count": 30.0}]
    assert epoch_metric(steps, "clip_fraction") == pytest.approx(0.125, abs=1e-12)
    assert epoch_metric(steps, "loss") == pytest.approx(2.0, abs=1e-12)
    assert epoch_metric(steps, "mean_importance_weight") is None
