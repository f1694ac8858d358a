"""Losses and gradients of rl/objectives.py against an independent loop-based NumPy reference.

The reference writes each formula of SPEC Sections 4.9 and 5 as explicit Python loops,
including the analytic gradient w.r.t. logprobs (the clipped importance weight is a
constant under stop-gradient). Tolerances: 1e-12 relative in fp64, 1e-5 in fp32.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgs_jax.rl.objectives import (
    cispo_loss,
    expert_iteration_loss,
    reinforce_half_loss,
    sequence_scale,
)

NORMALIZATIONS = ["batch_tokens", "sequence", "group_tokens"]


# ------------------------------------------------------------------ NumPy reference


def ref_scale(mask, normalization, group_ids):
    counts = [int(sum(1 for v in row if v)) for row in mask]
    if normalization == "batch_tokens":
        return [1.0 / max(sum(counts), 1)] * len(counts)
    if normalization == "sequence":
        nonempty = sum(1 for c in counts if c > 0)
        return [1.0 / (max(c, 1) * max(nonempty, 1)) for c in counts]
    group_tokens = {}
    for g, c in zip(group_ids, counts):
        group_tokens[g] = group_tokens.get(g, 0) + c
    num_groups = sum(1 for t in group_tokens.values() if t > 0)
    return [1.0 / (max(group_tokens[g], 1) * max(num_groups, 1)) for g in group_ids]


def ref_weighted_nll(logprobs, mask, weights, normalization, group_ids=None):
    scale = ref_scale(mask, normalization, group_ids)
    loss, grad = 0.0, np.zeros(logprobs.shape)
    for i in range(logprobs.shape[0]):
        for t in range(logprobs.shape[1]):
            if mask[i][t]:
                loss -= scale[i] * weights[i] * logprobs[i, t]
                grad[i, t] = -scale[i] * weights[i]
    return loss, grad


def ref_cispo(logprobs, old, mask, advantages, eps_low, eps_high, normalization, group_ids=None):
    scale = ref_scale(mask, normalization, group_ids)
    loss, grad = 0.0, np.zeros(logprobs.shape)
    low = high = tokens = weight_sum = 0
    for i in range(logprobs.shape[0]):
        for t in range(logprobs.shape[1]):
            if not mask[i][t]:
                continue
            ratio = np.exp(logprobs[i, t] - old[i, t])
            weight = min(max(ratio, 1 - eps_low), 1 + eps_high)
            loss -= scale[i] * advantages[i] * weight * logprobs[i, t]
            grad[i, t] = -scale[i] * advantages[i] * weight
            low += ratio < 1 - eps_low
            high += ratio > 1 + eps_high
            tokens += 1
            weight_sum += weight
    metrics = {
        "clip_fraction_low": low / max(tokens, 1),
        "clip_fraction_high": high / max(tokens, 1),
        "clip_fraction": (low + high) / max(tokens, 1),
        "mean_importance_weight": weight_sum / max(tokens, 1),
        "token_count": tokens,
    }
    return loss, grad, metrics


# ------------------------------------------------------------------ inputs


def random_batch(seed, dtype=np.float64):
    """Prompt-masked rows, a single-token row, an all-padding row, garbage at masked spots."""
    rng = np.random.default_rng(seed)
    batch, tokens = 7, 9
    mask = np.zeros((batch, tokens), bool)
    spans = [(2, 9), (0, 1), (3, 4), (0, 0), (1, 6), (4, 9), (0, 9)]  # (start, end) of generated tokens
    for i, (start, end) in enumerate(spans):
        mask[i, start:end] = True
    logprobs = -rng.exponential(1.0, (batch, tokens))
    # Old logprobs far enough off to push ratios below 0.8 and above 1.28.
    old = logprobs + rng.normal(0.0, 0.6, (batch, tokens))
    logprobs = np.where(mask, logprobs, -np.inf)  # padding may hold anything
    old = np.where(mask, old, np.nan)
    weights = rng.normal(0.0, 1.0, batch)
    weights[2] = 0.0  # a zero-weight sequence still counts in the denominator
    group_ids = np.array([5, 5, 9, 9, 2, 2, 2])
    advantages = weights.copy()
    advantages[4:] = 0.0  # an all-zero group
    return {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in dict(
        logprobs=logprobs, old=old, mask=mask, weights=weights, advantages=advantages).items()} | {"group_ids": group_ids}


def grad_of(loss_fn, logprobs):
    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(logprobs))
    return float(loss), np.asarray(grad), {k: float(v) for k, v in metrics.items()}


PRECISIONS = [(np.float64, 1e-12, 1e-12), (np.float32, 1e-5, 1e-6)]  # dtype, rtol, atol


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize("dtype, rtol, atol", PRECISIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_half_matches_reference(normalization, dtype, rtol, atol, seed):
    b = random_batch(seed, dtype)
    groups = b["group_ids"] if normalization == "group_tokens" else None
    with jax.enable_x64(dtype == np.float64):
        fn = lambda lp: reinforce_half_loss(lp, b["mask"], b["weights"], normalization, group_ids=groups)  # noqa: E731
        loss, grad, metrics = grad_of(jax.jit(fn), b["logprobs"])
    ref_loss, ref_grad = ref_weighted_nll(b["logprobs"].astype(np.float64), b["mask"], b["weights"], normalization, b["group_ids"])
    np.testing.assert_allclose(loss, ref_loss, rtol=rtol, atol=atol)
    np.testing.assert_allclose(grad, ref_grad, rtol=rtol, atol=atol)
    assert np.all(grad[~b["mask"]] == 0.0) and np.isfinite(loss)
    assert metrics["token_count"] == b["mask"].sum() and metrics["sequence_count"] == 6


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize("eps_low, eps_high", [(1.0, 3.0), (0.2, 0.28)])
@pytest.mark.parametrize("dtype, rtol, atol", PRECISIONS)
def test_cispo_matches_reference(normalization, eps_low, eps_high, dtype, rtol, atol):
    b = random_batch(3, dtype)
    groups = b["group_ids"] if normalization == "group_tokens" else None
    with jax.enable_x64(dtype == np.float64):
        fn = functools.partial(
            cispo_loss, old_logprobs=b["old"], mask=b["mask"], advantages=b["advantages"],
            eps_low=eps_low, eps_high=eps_high, normalization=normalization, group_ids=groups,
        )
        loss, grad, metrics = grad_of(fn, b["logprobs"])
    ref_loss, ref_grad, ref_metrics = ref_cispo(
        b["logprobs"].astype(np.float64), b["old"].astype(np.float64), b["mask"], b["advantages"],
        eps_low, eps_high, normalization, b["group_ids"],
    )
    np.testing.assert_allclose(loss, ref_loss, rtol=rtol, atol=atol)
    np.testing.assert_allclose(grad, ref_grad, rtol=rtol, atol=atol)
    for name, value in ref_metrics.items():
        np.testing.assert_allclose(metrics[name], value, rtol=rtol, atol=atol)
    assert np.all(grad[4:] == 0.0)  # the all-zero-advantage group gets no gradient
    if eps_low < 1.0:  # the random ratios reach both ends of the clipping range
        assert metrics["clip_fraction_low"] > 0 and metrics["clip_fraction_high"] > 0


def test_hand_computed_values():
    logprobs = jnp.array([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0]])
    weights = jnp.array([1.0, 2.0])
    # batch tokens: -(1 * -3 + 2 * -3) / 3 = 3; sequence: (3/2 + 2 * 3/1) / 2 = 3.75
    assert float(reinforce_half_loss(logprobs, mask, weights)[0]) == pytest.approx(3.0, abs=1e-6)
    assert float(reinforce_half_loss(logprobs, mask, weights, "sequence")[0]) == pytest.approx(3.75, abs=1e-6)
    # CISPO with ratio exp(0.5) in range and exp(-2) clipped up to 0.5 (eps_low 0.5):
    old = logprobs - jnp.array([[0.5, -2.0, 0.0], [0.0, 0.0, 0.0]])
    loss, metrics = cispo_loss(logprobs, old, mask, jnp.array([1.0, -1.0]), eps_low=0.5, eps_high=3.0)
    expected = -(np.exp(0.5) * -1.0 + 0.5 * -2.0 - 1.0 * -3.0) / 3
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    assert float(metrics["clip_fraction_low"]) == pytest.approx(1 / 3)
    assert float(metrics["mean_importance_weight"]) == pytest.approx((np.exp(0.5) + 0.5 + 1.0) / 3, abs=1e-6)


def test_expert_iteration_defaults_to_unit_weights():
    b = random_batch(4, np.float32)
    ones = np.ones(b["logprobs"].shape[0], np.float32)
    for normalization in ("batch_tokens", "sequence"):
        ei, _ = expert_iteration_loss(b["logprobs"], b["mask"], normalization=normalization)
        ref, _ = ref_weighted_nll(b["logprobs"].astype(np.float64), b["mask"], ones, normalization)
        np.testing.assert_allclose(float(ei), ref, rtol=1e-5)


def test_cispo_with_equal_policies_is_weighted_nll():
    b = random_batch(5, np.float32)
    cispo, metrics = cispo_loss(b["logprobs"], b["logprobs"], b["mask"], b["advantages"])
    nll, _ = reinforce_half_loss(b["logprobs"], b["mask"], b["advantages"])
    np.testing.assert_allclose(float(cispo), float(nll), rtol=1e-6)
    assert float(metrics["clip_fraction"]) == 0.0 and float(metrics["mean_importance_weight"]) == 1.0


def test_cispo_importance_weight_has_no_gradient():
    b = random_batch(6, np.float32)
    grad_old = jax.grad(lambda old: cispo_loss(b["logprobs"], old, b["mask"], b["advantages"])[0])(jnp.asarray(b["old"]))
    assert np.all(np.asarray(grad_old) == 0.0)


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_micro_batches_with_global_scale_sum_to_the_full_loss(normalization):
    b = random_batch(7, np.float32)
    groups = jnp.asarray(b["group_ids"]) if normalization == "group_tokens" else None
    scale = sequence_scale(jnp.asarray(b["mask"]), normalization, groups)
    full_fn = lambda lp: cispo_loss(lp, b["old"], b["mask"], b["advantages"], normalization=normalization, group_ids=groups)  # noqa: E731
    full_loss, full_grad, _ = grad_of(full_fn, b["logprobs"])
    parts, grads = [], []
    for rows in (slice(0, 2), slice(2, 5), slice(5, 7)):
        part_fn = lambda lp, r=rows: cispo_loss(  # noqa: E731
            lp, b["old"][r], b["mask"][r], b["advantages"][r], normalization=normalization,
            group_ids=None if groups is None else groups[r], scale=scale[r])
        loss, grad, _ = grad_of(part_fn, b["logprobs"][rows])
        parts.append(loss)
        grads.append(grad)
    np.testing.assert_allclose(sum(parts), full_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.concatenate(grads), full_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_numpy_scale_equals_the_jax_one(normalization):
    """Host-side callers pass NumPy masks (computed in NumPy, nothing compiled): same values."""
    b = random_batch(7, np.float32)
    groups = b["group_ids"] if normalization == "group_tokens" else None
    host = sequence_scale(np.asarray(b["mask"]), normalization, groups)
    device = sequence_scale(jnp.asarray(b["mask"]), normalization, None if groups is None else jnp.asarray(groups))
    assert isinstance(host, np.ndarray) and host.dtype == np.float32
    np.testing.assert_allclose(host, np.asarray(device), rtol=1e-7, atol=0)


def test_all_masked_batch_is_zero_not_nan():
    logprobs = jnp.full((2, 3), -jnp.inf)
    mask = jnp.zeros((2, 3), bool)
    for normalization, groups in (("batch_tokens", None), ("sequence", None), ("group_tokens", jnp.array([0, 1]))):
        loss, grad, metrics = grad_of(
            lambda lp: cispo_loss(lp, lp, mask, jnp.ones(2), normalization=normalization, group_ids=groups), logprobs)
        assert loss == 0.0 and np.all(grad == 0.0) and all(np.isfinite(v) for v in metrics.values())


def test_bf16_logprobs_compute_in_fp32():
    b = random_batch(8, np.float32)
    lp16 = jnp.asarray(b["logprobs"], jnp.bfloat16)
    loss, _ = reinforce_half_loss(lp16, b["mask"], b["weights"])
    ref, _ = ref_weighted_nll(np.asarray(lp16.astype(jnp.float32), np.float64), b["mask"], b["weights"], "batch_tokens")
    assert loss.dtype == jnp.float32
    np.testing.assert_allclose(float(loss), ref, rtol=1e-5)


def test_bad_arguments_are_rejected():
    mask = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="unknown normalization"):
        sequence_scale(mask, "per_token")
    with pytest.raises(ValueError, match="group_ids"):
        sequence_scale(mask, "group_tokens")
    with pytest.raises(ValueError, match="group_ids"):
        sequence_scale(mask, "sequence", jnp.array([0, 1]))
