"""Every attention backend equals the einsum reference, forward and backward.

fp32: max |difference| <= 1e-5 (outputs and gradients of O(1) inputs). bf16 inputs:
within BF16_TOL of the fp32 reference, i.e. no worse than bf16 rounding of the inputs
and probabilities (the bf16 reference itself is ~1e-2 off). Compared on real query rows
(padding query rows are only required to be finite). splash runs in Pallas interpret mode
on CPU; native (the C++ CPU kernels) is skipped where no C++ compiler builds it; cuDNN needs
a GPU (skipped here) and `auto`'s choice is tested per platform.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sgs_jax.models import attention as A
from sgs_jax.models import create_model, native, tiny
from sgs_jax.models.config import ATTENTION_IMPLEMENTATIONS
from sgs_jax.parallel import activation_sharding, make_mesh
from sgs_jax.parallel.rules import compile_platform

TOL = 1e-5
BF16_TOL = 3e-2
SELF_BACKENDS = ["blockwise", "native", "xla", "splash"]


@pytest.fixture(autouse=True)
def _native_kernels_built(request):
    """Tests of the native backend need its kernels (built on first use)."""
    params = request.node.callspec.params.values() if hasattr(request.node, "callspec") else ()
    if "native" in params and not native.flash_attention_targets():
        pytest.skip("the native CPU kernels could not be built here (no C++ compiler?)")


def _inputs(batch, t, s, heads, kv_heads, dim, seed, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    make = lambda n, h: jnp.asarray(rng.normal(size=(batch, n, h, dim)), dtype)  # noqa: E731
    return make(t, heads), make(s, kv_heads), make(s, kv_heads), rng


def _padding(rng, batch, t, side):
    """[B, T] valid mask: row 0 unpadded, the others padded on `side` by random amounts."""
    valid = np.ones((batch, t), bool)
    for row in range(1, batch):
        n = int(rng.integers(1, t // 2))
        if side == "left":
            valid[row, :n] = False
        else:
            valid[row, t - n :] = False
    return valid


def _run(name, q, k, v, mask, **kw):
    return A.BACKENDS[name](q, k, v, mask, **kw)


def _grads(fn, q, k, v, weight):
    return jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * weight), argnums=(0, 1, 2))(q, k, v)


# (T, heads, kv_heads, head_dim, blockwise block, padding side): GQA, MHA, MQA; lengths
# that are and are not multiples of splash's 128 and of the blockwise block.
# Head dim 8 is not a multiple of 16: the native backend runs blockwise there. T = 200 and
# 96 end inside a 64-row tile of the native kernel; 64 and 128 dims take its other paths.
SELF_CASES = [(64, 4, 2, 16, 16, "left"), (96, 4, 4, 8, 32, "right"), (200, 8, 2, 16, None, "left"), (128, 6, 1, 32, 32, "right"),
              (130, 4, 2, 64, None, "right"), (70, 2, 1, 128, None, "left")]


@pytest.mark.parametrize("case", SELF_CASES, ids=lambda c: f"T{c[0]}_h{c[1]}kv{c[2]}_{c[5]}")
@pytest.mark.parametrize("backend", SELF_BACKENDS)
def test_self_attention_equals_reference(backend, case):
    block = case[4]
    q, k, v, valid, weight, ref, ref_grads = _self_case(case)
    mask = A.AttentionMask(kv_valid=jnp.asarray(valid))
    kw = {"block": block} if backend == "blockwise" else {}
    fn = lambda q, k, v: _run(backend, q, k, v, mask, **kw)  # noqa: E731
    out = jax.jit(fn)(q, k, v)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out)[valid], ref[valid], atol=TOL, rtol=0)
    grads = jax.jit(lambda q, k, v: _grads(fn, q, k, v, weight))(q, k, v)
    for got, want in zip(grads, ref_grads):
        assert np.isfinite(np.asarray(got)).all()
        np.testing.assert_allclose(np.asarray(got), want, atol=TOL, rtol=0)


@functools.cache
def _self_case(case):
    """(q, k, v, valid [B, T], loss weight, reference outputs, reference gradients) of a
    SELF_CASES case, the reference jitted once and shared by every backend's test. The
    loss weighs real query rows only."""
    t, heads, kv_heads, dim, _, side = case
    q, k, v, rng = _inputs(3, t, t, heads, kv_heads, dim, seed=t + heads)
    valid = _padding(rng, 3, t, side)
    ref_fn = lambda q, k, v: A.reference(q, k, v, A.AttentionMask(kv_valid=jnp.asarray(valid)))  # noqa: E731
    ref = np.asarray(jax.jit(ref_fn)(q, k, v))
    weight = jnp.asarray(rng.normal(size=ref.shape), jnp.float32) * jnp.asarray(valid)[:, :, None, None]
    ref_grads = [np.asarray(g) for g in jax.jit(lambda q, k, v: _grads(ref_fn, q, k, v, weight))(q, k, v)]
    return q, k, v, valid, weight, ref, ref_grads


@pytest.mark.parametrize("backend", SELF_BACKENDS)
def test_padding_inside_a_row_equals_reference(backend):
    """Padding keys in the middle of a row (its real keys not one contiguous run): real
    queries see every real key up to themselves, across the gap. The native kernels skip
    work outside each segment's first and last positions, a bound here rather than exact."""
    t = 160
    q, k, v, rng = _inputs(2, t, t, 4, 2, 16, seed=11)
    valid = np.ones((2, t), bool)
    valid[0, 40:110] = False  # a gap across a 64-row tile boundary
    valid[1, 3:5] = valid[1, 70:71] = False
    weight = jnp.asarray(rng.normal(size=q.shape), jnp.float32) * jnp.asarray(valid)[:, :, None, None]
    mask = A.AttentionMask(kv_valid=jnp.asarray(valid))

    def outputs_and_grads(name):
        fn = lambda q, k, v: _run(name, q, k, v, mask)  # noqa: E731
        grads = jax.jit(lambda q, k, v: _grads(fn, q, k, v, weight))(q, k, v)
        return np.asarray(jax.jit(fn)(q, k, v)), [np.asarray(g) for g in grads]

    out, grads = outputs_and_grads(backend)
    want_out, want_grads = outputs_and_grads("reference")
    np.testing.assert_allclose(out[valid], want_out[valid], atol=TOL, rtol=0)
    for got, want in zip(grads, want_grads):
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("with_lengths", [False, True], ids=["causal_only", "lengths"])
@pytest.mark.parametrize("backend", SELF_BACKENDS)
def test_causal_only_mask_equals_padding_mask_on_real_rows_of_right_padding(backend, with_lengths):
    """kv_valid=None, with or without the rows' lengths (what right_padded=True passes),
    changes only padding rows."""
    q, k, v, rng = _inputs(3, 128, 128, 4, 2, 16, seed=7)
    valid = _padding(rng, 3, 128, "right")
    causal_mask = A.AttentionMask(lengths=jnp.asarray(valid.sum(1), jnp.int32)) if with_lengths else A.AttentionMask()
    masked = jax.jit(lambda q, k, v: _run(backend, q, k, v, A.AttentionMask(kv_valid=jnp.asarray(valid))))(q, k, v)
    causal = jax.jit(lambda q, k, v: _run(backend, q, k, v, causal_mask))(q, k, v)
    np.testing.assert_allclose(np.asarray(causal)[valid], np.asarray(masked)[valid], atol=TOL, rtol=0)


def test_native_skips_each_rows_right_padding():
    """Given the rows' lengths, the native kernels compute no query past a row's end: its
    outputs and every padding gradient are exactly 0, and the real rows' outputs and the
    gradients of a loss on them equal the reference's. Lengths end mid-tile, on a tile
    boundary, at 1, and at 0 (a row of padding only)."""
    if not native.flash_attention_targets():
        pytest.skip("the native CPU kernels could not be built here (no C++ compiler?)")
    lengths = np.array([200, 128, 65, 1, 0])
    q, k, v, rng = _inputs(len(lengths), 200, 200, 4, 2, 32, seed=3)
    valid = np.arange(200)[None, :] < lengths[:, None]
    mask, ref_mask = A.AttentionMask(lengths=jnp.asarray(lengths, jnp.int32)), A.AttentionMask(kv_valid=jnp.asarray(valid))
    fn = lambda q, k, v: A.native(q, k, v, mask)  # noqa: E731
    ref_fn = lambda q, k, v: A.reference(q, k, v, ref_mask)  # noqa: E731
    out, ref = np.asarray(jax.jit(fn)(q, k, v)), np.asarray(ref_fn(q, k, v))
    assert (out[~valid] == 0).all()
    np.testing.assert_allclose(out[valid], ref[valid], atol=TOL, rtol=0)
    weight = jnp.asarray(rng.normal(size=ref.shape), jnp.float32) * jnp.asarray(valid)[:, :, None, None]
    grads = jax.jit(lambda q, k, v: _grads(fn, q, k, v, weight))(q, k, v)
    for got, want in zip(grads, _grads(ref_fn, q, k, v, weight)):
        assert (np.asarray(got)[~valid] == 0).all()
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=TOL, rtol=0)
    # A loss that reads padding rows too: they are constant 0, so no gradient reaches q, k, v from them.
    everywhere = jnp.asarray(rng.normal(size=ref.shape), jnp.float32)
    real_only = everywhere * jnp.asarray(valid)[:, :, None, None]
    grads_everywhere = jax.jit(lambda q, k, v: _grads(fn, q, k, v, everywhere))(q, k, v)
    for got, want in zip(grads_everywhere, jax.jit(lambda q, k, v: _grads(fn, q, k, v, real_only))(q, k, v)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _packed_segments(rng, batch, t, max_len):
    """[B, T] int32 segment ids of packed rows: runs of 1..max_len tokens numbered 1, 2, ...,
    then a random amount of trailing padding (0); the last row is padding only."""
    segments = np.zeros((batch, t), np.int32)
    for row in range(batch - 1):
        end, pos, seg = t - int(rng.integers(0, t // 4)), 0, 1
        while pos < end:
            n = min(int(rng.integers(1, max_len + 1)), end - pos)
            segments[row, pos : pos + n] = seg
            pos, seg = pos + n, seg + 1
    return segments


def _segments_alone(q, k, v, weight, segments):
    """Every segment of packed rows run alone through the reference: one row per segment,
    the segment at positions 0.. of its own row, unpacked (right padding, masked, after
    it; causal, so it changes no real row). Returns, per (row, segment), the outputs and
    the gradients (q, k, v) of the weighted sum of that segment's outputs, [len, H, D]."""
    spans = [(row, np.flatnonzero(segments[row] == seg)) for row in range(len(segments))
             for seg in sorted(set(segments[row][segments[row] > 0]))]
    t = segments.shape[1]
    alone = lambda x: np.stack([np.pad(np.asarray(x)[row, span[0] : span[-1] + 1],  # noqa: E731
                                       [(0, t - len(span))] + [(0, 0)] * (x.ndim - 2)) for row, span in spans])
    valid = np.stack([np.arange(t) < len(span) for _, span in spans])
    ref_fn = lambda q, k, v: A.reference(q, k, v, A.AttentionMask(kv_valid=jnp.asarray(valid)))  # noqa: E731
    qa, ka, va, wa = (jnp.asarray(alone(x)) for x in (q, k, v, weight))
    out = np.asarray(jax.jit(ref_fn)(qa, ka, va))
    grads = [np.asarray(g) for g in jax.jit(lambda q, k, v: _grads(ref_fn, q, k, v, wa))(qa, ka, va)]
    return {(row, span[0]): (out[i, : len(span)], [g[i, : len(span)] for g in grads])
            for i, (row, span) in enumerate(spans)}


@functools.cache
def _packed_case(case):
    """(q, k, v, segment ids, loss weight, `_segments_alone`) of a packed case, shared by
    every backend's test of it."""
    t, heads, kv_heads, dim, max_len = case
    q, k, v, rng = _inputs(3, t, t, heads, kv_heads, dim, seed=t + max_len)
    segments = _packed_segments(rng, 3, t, max_len)
    weight = jnp.asarray(rng.normal(size=q.shape), jnp.float32) * jnp.asarray(segments > 0)[:, :, None, None]
    return q, k, v, segments, weight, _segments_alone(q, k, v, weight, segments)


@pytest.mark.parametrize("case", [(200, 8, 2, 32, 90), (256, 4, 4, 16, 300), (130, 4, 1, 64, 20)], ids=lambda c: f"T{c[0]}_seg{c[4]}")
@pytest.mark.parametrize("backend", [*SELF_BACKENDS, "reference"])
def test_packed_rows_equal_each_sequence_alone(backend, case):
    """Packed rows (`AttentionMask.segment_ids`): each segment's outputs and the gradients of
    a loss on the real tokens equal those of the segment run alone, unpacked, through the
    reference (fp32, 1e-5). Segments of 1 token up to longer than a native tile, on and
    across tile boundaries; padding rows and tokens are only required to be finite."""
    t = case[0]
    q, k, v, segments, weight, alone = _packed_case(case)
    mask = A.AttentionMask(segment_ids=jnp.asarray(segments))
    kw = {"block": next(b for b in (32, 26, 8) if t % b == 0)} if backend == "blockwise" else {}
    fn = lambda q, k, v: _run(backend, q, k, v, mask, **kw)  # noqa: E731
    out = np.asarray(jax.jit(fn)(q, k, v))
    grads = [np.asarray(g) for g in jax.jit(lambda q, k, v: _grads(fn, q, k, v, weight))(q, k, v)]
    assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads)
    assert len(alone) >= 2  # at least one segment in each of the two rows that are not padding only
    for (row, start), (want_out, want_grads) in alone.items():
        span = slice(start, start + len(want_out))
        np.testing.assert_allclose(out[row, span], want_out, atol=TOL, rtol=0)
        for got, want in zip(grads, want_grads):
            np.testing.assert_allclose(got[row, span], want, atol=TOL, rtol=0)


@pytest.mark.parametrize("backend", SELF_BACKENDS)
def test_bf16_is_within_rounding_of_the_fp32_reference(backend):
    q, k, v, rng = _inputs(2, 128, 128, 4, 2, 32, seed=3)
    valid = _padding(rng, 2, 128, "right")
    mask = A.AttentionMask(kv_valid=jnp.asarray(valid))
    ref = np.asarray(A.reference(q, k, v, mask))
    bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    out = np.asarray(jax.jit(lambda q, k, v: _run(backend, q, k, v, mask))(*bf).astype(jnp.float32))
    ref_bf16 = np.asarray(A.reference(*bf, mask).astype(jnp.float32))
    err, ref_err = np.abs(out - ref)[valid].max(), np.abs(ref_bf16 - ref)[valid].max()
    print(f"{backend} bf16: max error {err:.4f} (bf16 reference {ref_err:.4f})")
    assert err <= BF16_TOL


# ---- cached shapes (prefill into / decode from a KV cache) --------------------------------


def _cached_mask(rng, batch, t, s):
    """Rows with different amounts already cached; the T new queries sit at end..end+T-1,
    some of them padding (invalid)."""
    ends = rng.integers(0, s - t + 1, size=batch)
    valid = np.zeros((batch, s), bool)
    slots = np.zeros((batch, t), np.int32)
    for row, end in enumerate(ends):
        valid[row, :end] = rng.random(end) > 0.2  # older tokens, a few invalid (stale rows)
        slots[row] = end + np.arange(t)
        valid[row, end : end + t] = np.arange(t) < t - row  # row b has b trailing padding queries
    return A.AttentionMask(kv_valid=jnp.asarray(valid), q_slots=jnp.asarray(slots)), valid, slots


@pytest.mark.parametrize("t", [1, 5], ids=["decode", "prefill"])
@pytest.mark.parametrize("implementation", ATTENTION_IMPLEMENTATIONS)
def test_cached_attention_equals_reference(implementation, t):
    if implementation == "cudnn":
        pytest.skip("cudnn needs a GPU (its cached calls use xla, tested here as 'xla')")
    q, k, v, rng = _inputs(4, t, 24, 4, 2, 8, seed=t)
    mask, valid, slots = _cached_mask(rng, 4, t, 24)
    backend = A.select_backend(implementation, "cpu", mask, q.dtype)
    assert backend == "xla"  # every fused backend falls back to xla for cached calls
    out = np.asarray(A.attend(q, k, v, mask, implementation))
    ref = np.asarray(A.reference(q, k, v, mask))
    sees = np.asarray(mask.dense(4, t, 24)).any(-1)
    assert sees.any() and np.isfinite(out).all()
    np.testing.assert_allclose(out[sees], ref[sees], atol=TOL, rtol=0)


def test_fully_masked_rows_are_finite_in_every_backend():
    q, k, v, _ = _inputs(2, 64, 64, 4, 2, 8, seed=1)
    valid = np.ones((2, 64), bool)
    valid[1, :40] = False  # left padding: the first 40 queries of row 1 see nothing
    mask = A.AttentionMask(kv_valid=jnp.asarray(valid))
    for name in ["reference", *SELF_BACKENDS]:
        fn = lambda q, k, v: _run(name, q, k, v, mask, **({"block": 16} if name == "blockwise" else {}))  # noqa: E731
        out = jax.jit(fn)(q, k, v)
        grads = jax.jit(lambda q, k, v: _grads(fn, q, k, v, jnp.ones(out.shape)))(q, k, v)
        assert all(np.isfinite(np.asarray(x)).all() for x in (out, *grads)), name


# ---- backend selection and cuDNN --------------------------------------------------------------


def test_auto_picks_per_platform_and_cached_calls_fall_back_to_xla():
    self_mask, cached = A.AttentionMask(), A.AttentionMask(jnp.ones((1, 4), bool), jnp.zeros((1, 1), jnp.int32))
    pick = A.select_backend
    assert pick("auto", "cpu", self_mask, jnp.float32) == ("native" if native.flash_attention_targets() else "blockwise")
    assert pick("blockwise", "cpu", self_mask, jnp.float32) == "blockwise"
    assert pick("native", "cpu", cached, jnp.float32) == "xla"
    assert pick("auto", "gpu", self_mask, jnp.bfloat16) == "cudnn"
    assert pick("auto", "gpu", self_mask, jnp.float32) == "xla"  # cuDNN flash attention is bf16/fp16 only
    assert pick("auto", "tpu", self_mask, jnp.float32) == "splash"
    assert pick("splash", "cpu", self_mask, jnp.float32) == "splash"  # interpret mode
    assert pick("xla", "tpu", self_mask, jnp.bfloat16) == "xla"
    for platform in ("cpu", "gpu", "tpu"):
        assert pick("auto", platform, cached, jnp.bfloat16) == "xla"
    assert pick("cudnn", "gpu", cached, jnp.bfloat16) == "xla"
    with pytest.raises(ValueError, match="needs a GPU"):
        pick("cudnn", "cpu", self_mask, jnp.bfloat16)
    with pytest.raises(ValueError, match="CPU kernel"):
        pick("native", "tpu", self_mask, jnp.bfloat16)
    with pytest.raises(ValueError, match="unknown attention"):
        pick("flash", "cpu", self_mask, jnp.float32)
    with pytest.raises(ValueError, match="attention must be one of"):
        tiny(attention="flash")


def test_platform_follows_the_enclosing_mesh():
    """Inside `activation_sharding` the mesh's devices decide (a deviceless TPU compile
    picks splash); here they are CPU devices."""
    assert compile_platform() == jax.default_backend()
    with activation_sharding(make_mesh(data=1, fsdp=2, tensor=1, devices=jax.devices()[:2])):
        assert compile_platform() == "cpu"


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN flash attention needs an NVIDIA GPU")
def test_cudnn_equals_reference_on_gpu():
    q, k, v, rng = _inputs(2, 256, 256, 8, 2, 64, seed=0, dtype=jnp.bfloat16)
    for valid in (None, _padding(rng, 2, 256, "left")):
        mask = A.AttentionMask(kv_valid=None if valid is None else jnp.asarray(valid))
        rows = np.ones((2, 256), bool) if valid is None else valid
        out = np.asarray(A.cudnn(q, k, v, mask).astype(jnp.float32))
        ref = np.asarray(A.reference(*(x.astype(jnp.float32) for x in (q, k, v)), mask))
        assert np.abs(out - ref)[rows].max() <= BF16_TOL


# ---- inside the model ------------------------------------------------------------------------


_MODEL_CONFIG = tiny(num_heads=4, num_kv_heads=2, vocab_size=64)
_IDS = np.random.default_rng(0).integers(3, 64, size=(4, 128)).astype(np.int32)
_VALID = np.ones((4, 128), bool)
_VALID[1, :30] = False  # left padding
_VALID[2, 100:] = False  # right padding


def _model_loss(model):
    logits = model(jnp.asarray(_IDS), jnp.asarray(_VALID))
    return jnp.sum(jnp.where(jnp.asarray(_VALID)[..., None], jax.nn.log_softmax(logits), 0.0)) / _VALID.sum()


def _loss_and_grads(config):
    graphdef, state = nnx.split(create_model(config, seed=1))
    return jax.jit(jax.value_and_grad(lambda st: _model_loss(nnx.merge(graphdef, st))))(state)


# The native kernels take head dims of 16k; at the tiny config's 8 they would run blockwise.
_NATIVE_CONFIG = _MODEL_CONFIG.replace(head_dim=16)


def _reference_loss_and_grads(config):
    with pytest.MonkeyPatch.context() as patch:  # the same model with einsum attention
        patch.setattr(A, "select_backend", lambda *args: "reference")
        return _loss_and_grads(config)


@pytest.fixture(scope="module")
def reference_model_loss():
    return _reference_loss_and_grads(_MODEL_CONFIG)


@pytest.fixture(scope="module")
def native_reference_loss():
    """The reference at the head dim the native kernels take."""
    return _reference_loss_and_grads(_NATIVE_CONFIG)


@pytest.mark.parametrize("implementation", ["xla", "splash", "auto", "blockwise", "native"])
def test_model_forward_and_gradient_equal_the_reference_backend(implementation, request):
    """The whole model (GQA, left and right padding) with each backend vs. einsum attention
    (native at head dim 16, which its kernels take)."""
    config = _NATIVE_CONFIG if implementation == "native" else _MODEL_CONFIG
    ref_loss, ref_grads = request.getfixturevalue("native_reference_loss" if implementation == "native" else "reference_model_loss")
    got_loss, got_grads = _loss_and_grads(config.replace(attention=implementation))
    np.testing.assert_allclose(float(got_loss), float(ref_loss), atol=0, rtol=1e-6)
    for got, want in zip(jax.tree_util.tree_leaves(got_grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=TOL, rtol=0)


def test_splash_runs_per_device_under_a_mesh(reference_model_loss):
    """On a (data, fsdp, tensor) = (2, 2, 2) mesh splash runs under shard_map (batch over
    data x fsdp, heads over tensor) and the loss still equals the reference."""
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    graphdef, state = nnx.split(create_model(_MODEL_CONFIG.replace(attention="splash"), seed=1, mesh=mesh))

    @jax.jit
    def sharded_loss(state):
        with activation_sharding(mesh):
            return _model_loss(nnx.merge(graphdef, state))

    lowered = sharded_loss.lower(state).as_text()
    assert "shard_map" in lowered or "manual" in lowered.lower()
    np.testing.assert_allclose(float(sharded_loss(state)), float(reference_model_loss[0]), atol=0, rtol=1e-6)
    # Without a padding mask (the Trainer's right-padded rows) no segment ids travel.
    q, k, v, _ = _inputs(4, 128, 128, 4, 2, 16, seed=5)

    @jax.jit
    def causal_only(q, k, v):
        with activation_sharding(mesh):
            return A.splash(q, k, v, A.AttentionMask())

    np.testing.assert_allclose(np.asarray(causal_only(q, k, v)), np.asarray(A.reference(q, k, v, A.AttentionMask())), atol=TOL, rtol=0)


def _tpu_topology_devices():
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install -e .[tpu])")
    from jax.experimental import topologies

    try:
        return topologies.get_topology_desc(topology_name="v5p:2x2x2", platform="tpu").devices
    except jax.errors.JaxRuntimeError as err:
        if "lockfile" in str(err):
            pytest.skip(f"libtpu is held by another process on this machine: {err}")
        raise


def test_auto_compiles_the_splash_kernel_for_tpu_without_a_tpu():
    """Deviceless compile for a v5p-8 topology: `auto` sees the mesh's TPU devices, picks
    splash (a Mosaic custom call, not interpret mode) and its backward compiles under
    shard_map with batch and heads sharded."""
    from jax.sharding import Mesh

    from sgs_jax.parallel import named_sharding

    mesh = Mesh(np.asarray(_tpu_topology_devices()).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
    b, t, heads, kv_heads, dim = 4, 512, 8, 4, 128

    def spec(shape, axes, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=named_sharding(mesh, axes, shape))

    q = spec((b, t, heads, dim), ("batch", "seq", "q_heads", "head_dim"))
    k = spec((b, t, kv_heads, dim), ("batch", "seq", "kv_heads", "head_dim"))
    valid = spec((b, t), ("batch", "seq"), jnp.bool_)

    def loss(q, k, v, valid):
        with activation_sharding(mesh):
            return jnp.sum(A.attend(q, k, v, A.AttentionMask(kv_valid=valid)).astype(jnp.float32))

    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, k, valid)
    assert "tpu_custom_call" in lowered.as_text()
    lowered.compile()


def _native_gradient_on(mesh, config):
    """The jitted value-and-gradient of the model loss with native attention inside
    `activation_sharding(mesh)`, and the model state to call it on."""
    graphdef, state = nnx.split(create_model(config.replace(attention="native"), seed=1, mesh=mesh))

    @jax.jit
    def sharded(state):
        with activation_sharding(mesh):
            return jax.value_and_grad(lambda st: _model_loss(nnx.merge(graphdef, st)))(state)

    return sharded, state


def test_native_runs_per_device_under_a_mesh(native_reference_loss):
    """On a (data, fsdp, tensor) = (2, 2, 2) mesh the native kernels run per device under
    shard_map (batch over data x fsdp, heads over tensor): loss and gradients as the reference."""
    if not native.flash_attention_targets():
        pytest.skip("the native CPU kernels could not be built here (no C++ compiler?)")
    sharded, state = _native_gradient_on(make_mesh(data=2, fsdp=2, tensor=2), _NATIVE_CONFIG)
    assert f'custom_call_target="{native.FLASH_FORWARD}"' in sharded.lower(state).compile().as_text()
    loss, grads = sharded(state)
    ref_loss, ref_grads = native_reference_loss
    np.testing.assert_allclose(float(loss), float(ref_loss), atol=0, rtol=1e-6)
    for got, want in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=TOL, rtol=0)


def test_native_on_one_device_adds_no_collective():
    """On a one-device mesh (the Trainer's on CPU) the kernels run without shard_map, whose
    transpose put an all-reduce over that one device on the q/k/v gradients of every layer."""
    if not native.flash_attention_targets():
        pytest.skip("the native CPU kernels could not be built here (no C++ compiler?)")
    sharded, state = _native_gradient_on(make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1]), _NATIVE_CONFIG)
    hlo = sharded.lower(state).compile().as_text()
    assert f'custom_call_target="{native.FLASH_FORWARD}"' in hlo
    assert " all-reduce(" not in hlo


@pytest.mark.parametrize("layer_loop", ["scan", "unrolled"])
@pytest.mark.parametrize("remat, forward_calls", [("dots", 1), ("full", 2)])
def test_dots_remat_saves_the_native_kernels_outputs(remat, forward_calls, layer_loop):
    """Under remat_policy="dots" the layer's backward reads the forward kernel's saved output
    and log-sum-exp (named `ATTENTION_OUT` / `ATTENTION_LSE`) instead of running the forward
    kernel again: one forward call per layer in the compiled gradient (full remat, which saves
    nothing, has two; a scan's body holds one layer). Loss and gradients as without remat
    either way."""
    if not native.flash_attention_targets():
        pytest.skip("the native CPU kernels could not be built here (no C++ compiler?)")
    config = _MODEL_CONFIG.replace(attention="native", head_dim=16, layer_loop=layer_loop)  # the kernels take head dims of 16k
    if layer_loop == "unrolled":
        forward_calls *= config.num_layers

    def loss_and_grads(policy):
        graphdef, state = nnx.split(create_model(config.replace(remat_policy=policy), seed=1))
        grad = jax.jit(jax.value_and_grad(lambda st: _model_loss(nnx.merge(graphdef, st))))
        return grad.lower(state).compile().as_text(), grad(state)

    hlo, (loss, grads) = loss_and_grads(remat)
    _, (want_loss, want_grads) = loss_and_grads("none")
    assert hlo.count(f'custom_call_target="{native.FLASH_FORWARD}"') == forward_calls
    np.testing.assert_allclose(float(loss), float(want_loss), atol=0, rtol=1e-6)
    for got, want in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=TOL, rtol=0)
