"""Paged decode attention against dense attention over the same tokens: the XLA gather
backend, the native CPU kernel (built on first use; skipped without a C++ compiler), the
Pallas GPU kernel (interpret mode), sharded over a mesh, and the Pallas TPU kernel compiled
deviceless with libtpu."""

import importlib.util
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgs_jax.models import native
from sgs_jax.models import paged_attention as pa
from sgs_jax.models.attention import AttentionMask, reference
from sgs_jax.models.paged_cache import PagedBatch, ragged_work, write_token
from sgs_jax.parallel import make_mesh
from sgs_jax.parallel.rules import activation_sharding
from tests.models.native_support import use_portable_build

PAGE, PAGES, LAYERS, HKV, GROUP, DIM = 4, 24, 2, 2, 2, 16


def problem(seed=0, rows=4, lengths=(1, 5, 12, 0), max_pages=4):
    """A random pool, page tables holding disjoint random pages, and per-row cached counts."""
    rng = np.random.default_rng(seed)
    keys = jnp.asarray(rng.normal(size=(HKV, LAYERS, PAGES, PAGE, DIM)), jnp.float32)
    values = jnp.asarray(rng.normal(size=(HKV, LAYERS, PAGES, PAGE, DIM)), jnp.float32)
    table = rng.permutation(PAGES)[: rows * max_pages].reshape(rows, max_pages).astype(np.int32)
    cached = np.asarray(lengths, np.int32)
    active = cached > 0
    q = jnp.asarray(rng.normal(size=(rows, HKV * GROUP, DIM)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(rows, HKV, DIM)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(rows, HKV, DIM)), jnp.float32)
    return q, k, v, keys, values, table, cached, active


def dense_expected(q, k, v, keys, values, table, cached, layer):
    """Write k/v at position `cached`, gather each row's pages densely and run the
    reference attention over positions 0..cached."""
    keys, values = np.array(keys), np.array(values)
    rows = np.arange(len(cached))
    keys[:, layer, table[rows, cached // PAGE], cached % PAGE] = np.swapaxes(np.asarray(k), 0, 1)
    values[:, layer, table[rows, cached // PAGE], cached % PAGE] = np.swapaxes(np.asarray(v), 0, 1)
    dense_k = np.moveaxis(keys[:, layer][:, table].reshape(HKV, len(cached), -1, DIM), 0, 2)  # [B, S, Hkv, D]
    dense_v = np.moveaxis(values[:, layer][:, table].reshape(HKV, len(cached), -1, DIM), 0, 2)
    mask = AttentionMask(kv_valid=None, q_slots=jnp.asarray(cached)[:, None])
    return np.asarray(reference(q[:, None], jnp.asarray(dense_k), jnp.asarray(dense_v), mask))[:, 0]


def run(backend, q, k, v, keys, values, table, cached, active, layer=1):
    page = keys.shape[3]
    num_pages = np.where(active, cached // page + 1, 0).astype(np.int32)
    work = ragged_work(jnp.asarray(table), jnp.asarray(num_pages), 16, page) if backend == "gather" else None
    batch = PagedBatch(jnp.asarray(table), jnp.asarray(cached), jnp.asarray(active), work, backend)
    out, (new_keys, _) = pa.paged_decode(q, k, v, (keys, values), jnp.int32(layer), batch)
    return np.asarray(out), np.asarray(new_keys)


def needs_native():
    if not native.paged_attention_target():
        pytest.skip("the native CPU kernel could not be built here (no C++ compiler?)")


@pytest.mark.parametrize("backend", ["gather", "native", "pallas_gpu"])
def test_paged_decode_matches_dense_attention(backend):
    if backend == "native":
        needs_native()
    q, k, v, keys, values, table, cached, active = problem()
    out, new_keys = run(backend, q, k, v, keys, values, table, cached, active)
    expected = dense_expected(q, k, v, keys, values, table, np.maximum(cached, 0), layer=1)
    np.testing.assert_allclose(out[active], expected[active], atol=1e-5, rtol=0)
    # The new keys sit at each active row's position; the inactive row wrote nothing.
    rows = np.flatnonzero(active)
    np.testing.assert_allclose(new_keys[:, 1, table[rows, cached[rows] // PAGE], cached[rows] % PAGE],
                               np.swapaxes(np.asarray(k)[rows], 0, 1), atol=0)
    untouched = np.ones(new_keys.shape, bool)
    untouched[:, 1, table[rows, cached[rows] // PAGE], cached[rows] % PAGE] = False
    np.testing.assert_array_equal(new_keys[untouched], np.asarray(keys)[untouched])


@pytest.mark.parametrize("page", [4, 16])
@pytest.mark.parametrize("dim", [16, 64, 128])
def test_native_kernel_matches_gather(dim, page):
    """Every head-dim path of the native kernel (16: generic; 64 and 128: compiled for the
    size, with the AVX2 loops that score 8 keys at a time where the CPU has them: pages of
    16 hold two such blocks, and partly filled pages leave 1-7 keys to the plain loop),
    GQA groups of 1 and 3, rows spanning 1-9 pages and an inactive row, fp32 within 1e-5 of
    the XLA gather backend; a bf16 pool within bf16 rounding of its fp32 result."""
    needs_native()
    rng = np.random.default_rng(dim)
    for hkv, group in ((3, 1), (2, 3)):
        rows, pages, max_pages = 5, 64, 9
        pool = lambda: jnp.asarray(rng.normal(size=(hkv, LAYERS, pages, page, dim)), jnp.float32)  # noqa: E731
        keys, values = pool(), pool()
        table = rng.permutation(pages)[: rows * max_pages].reshape(rows, max_pages).astype(np.int32)
        cached = np.asarray([0, 3, 17, 35, 9] if page == 4 else [0, 7, 40, 140, 9], np.int32)
        active = np.asarray([True, True, True, True, False])
        q = jnp.asarray(rng.normal(size=(rows, hkv * group, dim)), jnp.float32)
        k = jnp.asarray(rng.normal(size=(rows, hkv, dim)), jnp.float32)
        v = jnp.asarray(rng.normal(size=(rows, hkv, dim)), jnp.float32)
        expected, _ = run("gather", q, k, v, keys, values, table, cached, active)
        out, _ = run("native", q, k, v, keys, values, table, cached, active)
        np.testing.assert_allclose(out[active], expected[active], atol=1e-5, rtol=0)
        assert np.all(out[~active] == 0)
        half, _ = run("native", q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16),
                      keys.astype(jnp.bfloat16), values.astype(jnp.bfloat16), table, cached, active)
        assert half.dtype == jnp.bfloat16
        np.testing.assert_allclose(half[active].astype(np.float32), expected[active], atol=0.05, rtol=0)


def test_native_kernel_refuses_a_page_outside_the_pool():
    needs_native()
    q, k, v, keys, values, table, cached, active = problem()
    table = table.copy()
    table[2, 1] = PAGES + 5  # row 2 (12 cached tokens) reads its second page
    with pytest.raises(Exception, match="page id outside the pool"):
        run("native", q, k, v, keys, values, table, cached, active)


def test_ragged_work_lists_only_held_pages():
    table = jnp.asarray([[7, 3, 0], [5, 0, 0], [2, 9, 4]], jnp.int32)
    work = ragged_work(table, jnp.asarray([2, 0, 3], jnp.int32), 8, PAGE)
    assert np.asarray(work.rows).tolist() == [0, 0, 2, 2, 2, 3, 3, 3]  # 3 = padding
    assert np.asarray(work.pages).tolist()[:5] == [7, 3, 2, 9, 4]
    assert np.asarray(work.starts).tolist()[:5] == [0, 4, 0, 4, 8]


def test_write_token_drops_inactive_rows():
    keys = jnp.zeros((HKV, LAYERS, PAGES, PAGE, DIM))
    batch = PagedBatch(jnp.asarray([[3, 4], [5, 6]], jnp.int32), jnp.asarray([5, 1], jnp.int32), jnp.asarray([True, False]))
    new, _ = write_token(keys, keys, 0, jnp.ones((2, HKV, DIM)), jnp.ones((2, HKV, DIM)), batch)
    written = np.argwhere(np.asarray(new)[..., 0] > 0)
    assert written.tolist() == [[h, 0, 4, 1] for h in range(HKV)]  # row 0: page 4 (its second), offset 1


def test_sharded_paged_decode_uses_local_pages():
    """Rows and pages split over 4 batch devices (page ids local to each shard), heads over
    tensor: the same outputs as the unsharded call on the equivalent global pool."""
    rows, local_pages = 8, PAGES // 4
    rng = np.random.default_rng(1)
    keys = jnp.asarray(rng.normal(size=(HKV, LAYERS, PAGES, PAGE, DIM)), jnp.float32)
    values = jnp.asarray(rng.normal(size=(HKV, LAYERS, PAGES, PAGE, DIM)), jnp.float32)
    local = np.stack([rng.permutation(local_pages)[:2] for _ in range(rows)]).astype(np.int32)  # [8, 2] local ids
    shard = np.arange(rows) // 2
    cached = np.asarray([0, 3, 7, 2, 6, 1, 5, 4], np.int32)
    active = np.ones(rows, bool)
    q = jnp.asarray(rng.normal(size=(rows, HKV * GROUP, DIM)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(rows, HKV, DIM)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(rows, HKV, DIM)), jnp.float32)
    num_pages = (cached // PAGE + 1).astype(np.int32)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    with activation_sharding(mesh):
        work = jax.jit(pa.build_work, static_argnums=(2, 3))(jnp.asarray(local), jnp.asarray(num_pages), 8, PAGE)
        fn = jax.jit(pa.paged_decode)
        out, _ = fn(q, k, v, (keys, values), jnp.int32(0), PagedBatch(jnp.asarray(local), jnp.asarray(cached), jnp.asarray(active), work))
        if native.paged_attention_target():
            batch = PagedBatch(jnp.asarray(local), jnp.asarray(cached), jnp.asarray(active), None, "native")
            native_out, _ = fn(q, k, v, (keys, values), jnp.int32(0), batch)
            np.testing.assert_allclose(np.asarray(native_out), np.asarray(out), atol=1e-5, rtol=0)
    global_table = local + shard[:, None] * local_pages
    expected, _ = run("gather", q, k, v, keys, values, global_table, cached, active, layer=0)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5, rtol=0)


def test_tpu_kernel_compiles_deviceless_without_pool_copies():
    """The decode chunk with the Pallas TPU kernel, 7B attention width (32 heads of 128) on
    v5p:2x2x2 with heads over tensor: it compiles, and no copy of the pool appears (the
    kernel reads the pool buffer in place; temporaries stay far below the pool)."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    from jax.experimental import topologies

    from sgs_jax.models import tiny
    from sgs_jax.models.build import abstract_model
    from sgs_jax.parallel.rules import state_shardings
    from sgs_jax.sampling import Sampler

    devices = topologies.get_topology_desc(topology_name="v5p:2x2x2", platform="tpu").devices
    config = tiny(vocab_size=1024, hidden_size=4096, intermediate_size=1024, num_layers=1, num_heads=32, num_kv_heads=32,
                  head_dim=128, dtype="bfloat16", param_dtype="bfloat16")
    mesh = make_mesh(1, 1, 8, devices=devices)
    _, abstract = abstract_model(config)
    weights = jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract,
                                     state_shardings(abstract, mesh))
    sampler = Sampler(config, mesh=mesh, max_batch=64, page_size=64, chunk_steps=4)
    assert sampler.attention_backend == "pallas_tpu"
    compiled = sampler.lower_decode(weights, 64, 1024, 64).compile()
    pool_shape = "bf16[4,1,1024,64,128]"  # per chip: 4 of 32 KV heads, 1 layer, 1024 pages
    hlo = compiled.as_text()
    assert "paged_attention" in hlo
    assert not re.search(re.escape(pool_shape) + r"\{[^}]*\} copy\(", hlo)
    pool_bytes = 2 * 4 * 1024 * 64 * 128 * 2
    assert compiled.memory_analysis().temp_size_in_bytes < pool_bytes / 4


def test_native_kernel_portable_loops_match_gather(monkeypatch, tmp_path):
    """The kernel's portable loops (what compilers without AVX2 / FMA build: the build
    without -march=native, `native_support`) pass the same comparison with the gather
    backend, every case of `test_native_kernel_matches_gather`."""
    needs_native()
    use_portable_build(monkeypatch, tmp_path, "paged_attention.cc",
                       {"PAGED_ATTENTION": "SgsPagedAttention", "UNWRITTEN_POOL": "SgsUnwrittenPool"})
    for dim in (16, 64, 128):
        for page in (4, 16):
            test_native_kernel_matches_gather(dim, page)
