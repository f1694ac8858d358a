"""The HLO cost walk: FLOPs and collectives per execution, loop bodies times their trips.

References: hand-counted FLOPs (2 m n k per matmul), XLA's own cost model on loop-free
programs, and the arrays' own sizes for collective bytes. Compiled with XLA:CPU on the 8
simulated devices, except the TPU case (libtpu's compile-only devices; skipped without it).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sgs_jax.parallel.hlo_cost import analyze_hlo, parse_hlo, shapes, type_bytes
from tests.parallel.tpu_support import tpu_devices


def _compile(fn, *args, **jit_kwargs):
    return jax.jit(fn, **jit_kwargs).lower(*args).compile()


def test_loop_free_matmul_flops_equal_hand_count_and_xla():
    a, b = jax.ShapeDtypeStruct((64, 96), jnp.float32), jax.ShapeDtypeStruct((96, 80), jnp.float32)
    compiled = _compile(lambda x, y: x @ y, a, b)
    cost = analyze_hlo(compiled.as_text(), 1)
    assert cost.flops == 2 * 64 * 96 * 80
    assert cost.flops == pytest.approx(compiled.cost_analysis()["flops"], rel=1e-6)
    assert cost.loops == []


def test_scan_body_counted_once_per_trip():
    """XLA's cost model counts a scan body once; the walk multiplies it by the trip count."""

    def layers(x, ws):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]

    x, ws = jax.ShapeDtypeStruct((32, 64), jnp.float32), jax.ShapeDtypeStruct((6, 64, 64), jnp.float32)
    compiled = _compile(layers, x, ws)
    cost = analyze_hlo(compiled.as_text(), 1)
    assert cost.flops == 6 * 2 * 32 * 64 * 64
    assert [(loop.trips, loop.how) for loop in cost.loops] == [(6, cost.loops[0].how)]
    assert cost.loops[0].how in ("known_trip_count", "counter")
    assert compiled.cost_analysis()["flops"] < cost.flops / 3  # the trap the walk avoids


def test_data_dependent_loop_is_an_upper_bound():
    def decode(x, w):
        def cond(c):
            step, h = c
            return (step < 5) & (jnp.sum(h) < 1e9)

        return jax.lax.while_loop(cond, lambda c: (c[0] + 1, c[1] @ w), (jnp.int32(0), x))[1]

    x, w = jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 16), jnp.float32)
    cost = analyze_hlo(_compile(decode, x, w).as_text(), 1)
    assert [(loop.trips, loop.how) for loop in cost.loops] == [(5, "bounded")]
    assert cost.flops == 5 * 2 * 8 * 16 * 16


def test_collective_bytes_on_eight_devices():
    mesh = Mesh(np.asarray(jax.devices()[:8]), ("x",))
    rows = NamedSharding(mesh, P("x", None))
    full = NamedSharding(mesh, P())
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=rows)
    # Sum over the sharded rows: each device's partial [128] is all-reduced.
    compiled = _compile(lambda a: jnp.sum(a, axis=0), x, out_shardings=full)
    cost = analyze_hlo(compiled.as_text(), 8)
    assert cost.collective_bytes["all-reduce"] == 128 * 4
    assert cost.link_bytes == pytest.approx(2 * 128 * 4 * 7 / 8)
    gathered = analyze_hlo(_compile(lambda a: a * 2, x, out_shardings=full).as_text(), 8)
    assert gathered.collective_bytes["all-gather"] == 64 * 128 * 4


def test_tpu_layouts_tuples_and_memory_spaces_parse():
    text = """
HloModule m

%body (p: (s32[], bf16[4,8]{1,0:T(8,128)(2,1)})) -> (s32[], bf16[4,8]{1,0:T(8,128)(2,1)}) {
  %p = (s32[], bf16[4,8]{1,0:T(8,128)(2,1)}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %h = bf16[4,8]{1,0:T(8,128)(2,1)} get-tuple-element(%p), index=1
  %d = bf16[4,8]{1,0:T(8,128)(2,1)S(1)} dot(%h, %h), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], bf16[4,8]{1,0:T(8,128)(2,1)}) tuple(%next, %d)
}

%cond (p: (s32[], bf16[4,8]{1,0:T(8,128)(2,1)})) -> pred[] {
  %p = (s32[], bf16[4,8]{1,0:T(8,128)(2,1)}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(7)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: bf16[4,8]) -> bf16[4,8] {
  %x = bf16[4,8]{1,0:T(8,128)(2,1)} parameter(0)
  %zero = s32[] constant(2)
  %init = (s32[], bf16[4,8]{1,0:T(8,128)(2,1)}) tuple(%zero, %x)
  %w = (s32[], bf16[4,8]{1,0:T(8,128)(2,1)}) while(%init), condition=%cond, body=%body
  ROOT %out = bf16[4,8]{1,0:T(8,128)(2,1)} get-tuple-element(%w), index=1
}
"""
    comps, entry = parse_hlo(text)
    assert entry == "main" and set(comps) == {"main", "body", "cond"}
    assert shapes("(s32[], bf16[4,8]{1,0:T(8,128)(2,1)S(1)})") == [("s32", (), 0), ("bf16", (4, 8), 1)]
    assert type_bytes("bf16[4,8]{1,0:T(8,128)(2,1)S(1)}", hbm_only=True) == 0
    cost = analyze_hlo(text, 1)
    assert [(loop.trips, loop.how) for loop in cost.loops] == [(5, "counter")]  # i = 2, 3, ..., 6
    assert cost.flops == 5 * 2 * 4 * 8 * 8


def test_tpu_convolution_flops_match_xla():
    """libtpu writes batched matmuls as convolutions over a padded window; the walk counts
    only real multiply-adds (XLA's own count adds the softmax's few elementwise FLOPs)."""
    devices = tpu_devices("v5p:2x2x1")
    one = NamedSharding(Mesh(np.asarray(devices[:1]), ("x",)), P())

    def attention(q, k, w):
        probs = jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", q, k), -1)
        return jnp.einsum("bthd,hde->bte", jnp.einsum("bhts,bshd->bthd", probs, k), w)

    args = (jax.ShapeDtypeStruct((2, 256, 8, 128), jnp.bfloat16),) * 2 + (jax.ShapeDtypeStruct((8, 128, 512), jnp.bfloat16),)
    compiled = _compile(attention, *args, in_shardings=one, out_shardings=one)
    cost = analyze_hlo(compiled.as_text(), 1)
    matmuls = 2 * (2 * 2 * 256 * 256 * 8 * 128) + 2 * 2 * 256 * 8 * 128 * 512
    assert cost.flops == pytest.approx(matmuls, rel=1e-6)
    assert cost.flops == pytest.approx(compiled.cost_analysis()["flops"], rel=0.02)


def test_pallas_kernels_count_their_declared_cost():
    """A Pallas TPU kernel is an opaque custom call: its declared cost estimate is used,
    and a kernel without one is counted as such (its FLOPs are not seen)."""
    devices = tpu_devices("v5p:2x2x1")
    from jax.experimental import pallas as pl

    one = NamedSharding(Mesh(np.asarray(devices[:1]), ("x",)), P())

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    def double(x, estimate):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), cost_estimate=estimate)(x)

    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    declared = pl.CostEstimate(flops=12345, transcendentals=0, bytes_accessed=8192)
    with_cost = analyze_hlo(_compile(lambda a: double(a, declared), x, in_shardings=one, out_shardings=one).as_text(), 1)
    assert with_cost.flops == 12345 and with_cost.unestimated_kernels == 0
    without = analyze_hlo(_compile(lambda a: double(a, None), x, in_shardings=one, out_shardings=one).as_text(), 1)
    assert without.flops == 0 and without.unestimated_kernels == 1


@pytest.mark.parametrize("fused", [True, False], ids=["fused_backward", "split_backward"])
def test_splash_attention_flops_from_shapes_and_block_map(fused):
    """Splash attention declares no cost estimate: its forward (2 matmuls) and backward
    (fused: 5; split into dkv and dq kernels: 4 + 3, S recomputed) count 2 T S D per matmul
    per (batch, head) over the blocks its causal map runs (3 of 2 x 2 here)."""
    devices = tpu_devices("v5p:2x2x1")
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    one = NamedSharding(Mesh(np.asarray(devices[:1]), ("x",)), P())
    b, h, t, d = 2, 4, 1024, 128
    dq_blocks = {} if fused else {"block_q_dq": 512, "block_kv_dq": 512}
    sizes = sa.BlockSizes(block_q=512, block_kv=512, block_kv_compute=512, block_q_dkv=512, block_kv_dkv=512,
                          block_kv_dkv_compute=512, use_fused_bwd_kernel=fused, **dq_blocks)
    kernel = sa.make_splash_mha(sa.MultiHeadMask([sa.CausalMask((t, t))] * h), block_sizes=sizes, head_shards=1, q_seq_shards=1)
    x = jax.ShapeDtypeStruct((b, h, t, d), jnp.bfloat16)
    grad = jax.grad(lambda q, k, v: jax.vmap(kernel)(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))
    compiled = _compile(grad, x, x, x, in_shardings=one, out_shardings=one)
    cost = analyze_hlo(compiled.as_text(), 1)
    assert cost.modelled_kernels == (2 if fused else 3) and cost.unestimated_kernels == 0
    kernels = (2 + (5 if fused else 7)) * 2 * b * h * t * t * d * 3 / 4
    assert cost.flops == pytest.approx(kernels + compiled.cost_analysis()["flops"], rel=1e-3)


def test_host_offload_traffic_counts_each_slice_out_and_back():
    """Host memory is layout space S(5): a loop that writes one [1, 8] bf16 row of a host
    buffer per trip (async dynamic-update-slice) and reads one back (async dynamic-slice),
    3 trips, plus one synchronous copy of a [4, 8] f32 array in from the host: 3 x 2 x 16 +
    128 bytes. Reserving the host buffer (AllocateBuffer) moves nothing."""
    row, buf = "bf16[1,8]{1,0}", "bf16[3,8]{1,0:S(5)}"
    state = f"(s32[], {buf}, {row})"
    text = f"""
HloModule m

%body (p: {state}) -> {state} {{
  %p = {state} parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %zero = s32[] constant(0)
  %b = {buf} get-tuple-element(%p), index=1
  %r = {row} get-tuple-element(%p), index=2
  %us = (({buf}, {row}, s32[], s32[]), {buf}, u32[]) dynamic-update-slice-start(%b, %r, %i, %zero)
  %ud = {buf} dynamic-update-slice-done(%us)
  %ss = (({buf}, s32[], s32[]), {row}, u32[]) dynamic-slice-start(%ud, %i, %zero), dynamic_slice_sizes={{1,8}}
  %sd = {row} dynamic-slice-done(%ss)
  ROOT %t = {state} tuple(%next, %ud, %sd)
}}

%cond (p: {state}) -> pred[] {{
  %p = {state} parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

ENTRY %main (x: {row}, h: f32[4,8]) -> f32[4,8] {{
  %x = {row} parameter(0)
  %h = f32[4,8]{{1,0:S(5)}} parameter(1)
  %alloc = {buf} custom-call(), custom_call_target="AllocateBuffer"
  %zero = s32[] constant(0)
  %init = {state} tuple(%zero, %alloc, %x)
  %w = {state} while(%init), condition=%cond, body=%body
  ROOT %in = f32[4,8]{{1,0}} copy(%h)
}}
"""
    cost = analyze_hlo(text, 1)
    assert [(loop.trips, loop.how) for loop in cost.loops] == [(3, "counter")]
    assert cost.host_bytes == 3 * 2 * (8 * 2) + 4 * 8 * 4
