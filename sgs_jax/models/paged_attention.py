"""Decode attention over the paged KV pool: each row reads only the pages it holds.

    out, (keys, values) = paged_decode(q, k, v, (keys, values), layer, batch)

q [S, Hq, D] (one new token per row), k/v [S, Hkv, D] its key/value, the pool as in
`sgs_jax.models.paged_cache` and a `PagedBatch`. The new key/value is written at the row's
position first, then the query attends over positions 0..cached of its own pages. Rows
that are not active produce unspecified (finite) outputs.

Backends (`batch.backend`; `select_paged_backend` picks one for `auto` from
`ModelConfig.attention` and the platform):
  gather      XLA: gather the pages of the ragged work list (only pages rows hold, T per
              batch shard), scores per page, softmax per row by segment max/sum. Cost follows
              the sum of live tokens, not the longest row or the capacity. CPU fallback.
  native      a C++ XLA:CPU kernel (XLA FFI; `models.native` builds it on first use): each
              row reads its own pages in place, no copy. CPU default where a C++
              compiler is found.
  pallas_tpu  `jax.experimental.pallas.ops.tpu.paged_attention` (reads pages up to each
              row's length, from the whole pool buffer). TPU default.
  pallas_gpu  `jax.experimental.pallas.ops.gpu.paged_attention` (Triton). GPU default;
              interpret mode elsewhere (tests).
On a mesh of several devices every backend runs per device under `shard_map` (on one
device, mesh or not, it is a plain call): rows and pages of one batch shard are local to it
(page ids are local), KV heads split over `tensor` when both head counts divide it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from sgs_jax.models import native
from sgs_jax.models.config import ModelConfig
from sgs_jax.models.paged_cache import PagedBatch, PagedKVCache, RaggedWork, ragged_work, write_token
from sgs_jax.parallel.rules import compile_platform, logical_to_spec, multi_device_mesh

_MASKED = -1e30  # finite, so a row with nothing visible gives no NaN
PAGED_BACKENDS = ("gather", "native", "pallas_tpu", "pallas_gpu")


def select_paged_backend(implementation: str, platform: str) -> str:
    """The paged decode backend for `ModelConfig.attention` on `platform`: the platform's
    kernel for auto (and for splash on TPU, cudnn on GPU): Pallas on TPU and GPU, the native
    CPU kernel where it builds (`models.native`); else the XLA gather. The native kernel
    anywhere but CPU is an error."""
    if implementation == "native" and platform != "cpu":
        raise ValueError(f"the native paged-attention kernel runs on CPU only (compiling for {platform})")
    if implementation in PAGED_BACKENDS:
        return implementation
    if implementation in ("auto", "splash") and platform == "tpu":
        return "pallas_tpu"
    if implementation in ("auto", "cudnn") and platform == "gpu":
        return "pallas_gpu"
    if implementation in ("auto", "blockwise") and platform == "cpu" and native.paged_attention_target():
        return "native"
    return "gather"


# ---- per-device backends -------------------------------------------------------------------


def gather_attention(q, keys, values, layer, batch: PagedBatch) -> jax.Array:
    """XLA attention over the pages in `batch.work` (one shard's arrays; see module doc).

    The gathered pages stay heads-major ([Hkv, T, page, D], as the pool is), and both
    einsums batch over (head, entry) in that order, so XLA transposes only the small
    per-entry queries and partial outputs, never the gathered keys and values."""
    work: RaggedWork = batch.work
    rows, hq, dim = q.shape
    hkv, page_size = keys.shape[0], keys.shape[3]
    group = hq // hkv
    k = keys[:, layer, work.pages].astype(q.dtype)  # [Hkv, T, page, D]
    v = values[:, layer, work.pages].astype(q.dtype)
    row = jnp.minimum(work.rows, rows - 1)
    qt = jnp.swapaxes((q * jnp.asarray(dim**-0.5, q.dtype)).reshape(rows, hkv, group, dim), 0, 1)[:, row]  # [Hkv, T, G, D]
    scores = jnp.einsum("ktgd,ktpd->ktgp", qt, k, preferred_element_type=jnp.float32)
    positions = work.starts[:, None] + jnp.arange(page_size, dtype=jnp.int32)[None, :]
    visible = ((positions <= batch.cached[row][:, None]) & (work.rows < rows)[:, None])[None, :, None, :]  # [1, T, 1, page]
    scores = jnp.where(visible, scores, _MASKED)
    segments = rows + 1  # the last segment collects padding entries
    per_row = lambda x: jax.ops.segment_sum(x, work.rows, segments, indices_are_sorted=True)  # noqa: E731  [T, ...] -> [rows + 1, ...]
    row_max = jax.ops.segment_max(jnp.swapaxes(jnp.max(scores, axis=-1), 0, 1), work.rows, segments, indices_are_sorted=True)
    weights = jnp.where(visible, jnp.exp(scores - jnp.swapaxes(row_max[work.rows], 0, 1)[..., None]), 0.0)
    total = per_row(jnp.swapaxes(jnp.sum(weights, axis=-1), 0, 1))[:rows]  # [rows, Hkv, G]
    part = jnp.einsum("ktgp,ktpd->tkgd", weights.astype(q.dtype), v, preferred_element_type=jnp.float32)
    out = per_row(part)[:rows] / jnp.maximum(total, jnp.finfo(jnp.float32).tiny)[..., None]
    return out.reshape(rows, hq, dim).astype(q.dtype)


def _require_native() -> None:
    """Raise unless the native CPU kernel is built and registered (`models.native`)."""
    if not native.paged_attention_target():
        raise RuntimeError("the native CPU paged-attention kernel could not be built (see the warning above); use the gather backend")


def native_attention(q, keys, values, layer, batch: PagedBatch) -> jax.Array:
    """The native XLA:CPU kernel (`models/native/paged_attention.cc`; one shard's arrays):
    each row reads its own pages in place, positions 0..cached, so nothing is gathered and
    cost follows each row's live tokens exactly. fp32 scores and softmax; the pool may be
    fp32 or bf16."""
    _require_native()
    rows, hq, dim = q.shape
    lengths = jnp.where(batch.active, batch.cached + 1, 0).astype(jnp.int32)
    scaled = q.astype(jnp.float32) * jnp.float32(dim**-0.5)
    call = jax.ffi.ffi_call(native.PAGED_ATTENTION, jax.ShapeDtypeStruct((rows, hq, dim), jnp.float32))
    out = call(scaled, keys, values, jnp.asarray(layer, jnp.int32), batch.page_table.astype(jnp.int32), lengths)
    return out.astype(q.dtype)


def new_pool(config: ModelConfig, num_pages: int, page_size: int, backend: str) -> PagedKVCache:
    """A fresh pool for `backend` (`PagedKVCache` shapes, compute dtype): for the native
    kernel on one device (no mesh, or a mesh of one), left unwritten (the FFI target
    `native.UNWRITTEN_POOL`), since that kernel reads no position its row has not written
    and a call then pays only for the pages it fills; for every other backend, or on a mesh
    of several devices, zeros (`PagedKVCache.create`: the gather multiplies masked positions
    by zero, so they must be finite)."""
    if backend != "native" or multi_device_mesh() is not None:
        return PagedKVCache.create(config, num_pages, page_size)
    _require_native()
    shape = jax.ShapeDtypeStruct((config.num_kv_heads, config.num_layers, num_pages, page_size, config.head_dim), config.compute_dtype)
    return PagedKVCache(*jax.ffi.ffi_call(native.UNWRITTEN_POOL, (shape, shape))())


def _kernel_operands(q, keys, values, layer, batch: PagedBatch):
    """(scaled q, merged k/v pages [Hkv, layers * pages, page, D], page indices, lengths)."""
    hkv, layers, pages, page_size, dim = keys.shape
    merged = lambda pool: pool.reshape(hkv, layers * pages, page_size, dim)  # noqa: E731
    indices = batch.page_table + layer * pages
    lengths = jnp.where(batch.active, batch.cached + 1, 1).astype(jnp.int32)
    return q * jnp.asarray(dim**-0.5, q.dtype), merged(keys), merged(values), indices.astype(jnp.int32), lengths


def _compute_block(max_pages: int, cap: int) -> int:
    """Largest power of two <= cap dividing max_pages (pages per kernel compute block)."""
    block = 1
    while block * 2 <= cap and max_pages % (block * 2) == 0:
        block *= 2
    return block


def pallas_tpu_attention(q, keys, values, layer, batch: PagedBatch) -> jax.Array:
    """The Pallas TPU paged-attention kernel shipped with JAX (one shard's arrays)."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    q, k_pages, v_pages, indices, lengths = _kernel_operands(q, keys, values, layer, batch)
    block = _compute_block(indices.shape[1], max(1, 512 // keys.shape[3]))
    out = paged_attention(q, k_pages.astype(q.dtype), v_pages.astype(q.dtype), lengths, indices, pages_per_compute_block=block)
    return out.astype(q.dtype)


def pallas_gpu_attention(q, keys, values, layer, batch: PagedBatch, interpret: bool | None = None) -> jax.Array:
    """The Pallas (Triton) GPU paged-attention kernel shipped with JAX (one shard's arrays);
    `interpret` defaults to True off GPU."""
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention

    if interpret is None:
        interpret = compile_platform() != "gpu"
    q, k_pages, v_pages, indices, lengths = _kernel_operands(q, keys, values, layer, batch)
    max_pages = indices.shape[1]
    splits = _compute_block(max_pages, 16)
    block = _compute_block(max_pages // splits, 8)
    out = paged_attention(q, k_pages.astype(q.dtype), v_pages.astype(q.dtype), indices, lengths,
                          block_h=16, pages_per_compute_block=block, k_splits=splits, interpret=interpret)
    return out.astype(q.dtype)


_BACKENDS = {"gather": gather_attention, "native": native_attention, "pallas_tpu": pallas_tpu_attention, "pallas_gpu": pallas_gpu_attention}


def _write_and_attend(q, k, v, keys, values, layer, batch: PagedBatch, *, backend: str):
    keys, values = write_token(keys, values, layer, k, v, batch)
    return _BACKENDS[backend](q, keys, values, layer, batch), keys, values


# ---- dispatch ------------------------------------------------------------------------------


def shard_specs(mesh, rules, num_rows: int, num_pages: int, hq: int, hkv: int):
    """PartitionSpecs (rows, pages, heads) of the paged arrays on `mesh`: rows and pages over
    the batch axes (the same axes: a row's pages are on its shard), heads over tensor when
    both head counts divide it. Raises when rows and pages do not split alike."""
    rows = logical_to_spec(("batch",), mesh, (num_rows,), rules)[0]
    pages = logical_to_spec(("kv_pages",), mesh, (num_pages,), rules)[0]
    if rows != pages:
        raise ValueError(f"rows ({num_rows}) and KV pages ({num_pages}) must split over the same batch mesh axes, got {rows} and {pages}")
    q_heads = logical_to_spec(("q_heads",), mesh, (hq,), rules)[0]
    kv_heads = logical_to_spec(("kv_heads",), mesh, (hkv,), rules)[0]
    heads = q_heads if q_heads == kv_heads else None  # a GQA group stays on one device
    return rows, heads


def paged_decode(q, k, v, cache_kv, layer, batch: PagedBatch):
    """Write this step's k/v into the pool and attend with `batch.backend` (see module
    docstring). Returns (out [S, Hq, D], (keys, values))."""
    if batch.backend not in PAGED_BACKENDS:
        raise ValueError(f"unknown paged attention backend {batch.backend!r}; expected one of {PAGED_BACKENDS}")
    keys, values = cache_kv
    fn = functools.partial(_write_and_attend, backend=batch.backend)
    current = multi_device_mesh()
    if current is None:
        out, keys, values = fn(q, k, v, keys, values, layer, batch)
        return out, (keys, values)
    mesh, rules = current
    P = jax.sharding.PartitionSpec
    rows, heads = shard_specs(mesh, rules, q.shape[0], keys.shape[2], q.shape[1], keys.shape[0])
    pool = P(heads, None, rows, None, None)
    batch_specs = PagedBatch(
        page_table=P(rows, None), cached=P(rows), active=P(rows),
        work=None if batch.work is None else RaggedWork(P(rows), P(rows), P(rows)), backend=batch.backend,
    )
    mapped = jax.shard_map(
        fn, mesh=mesh,
        in_specs=(P(rows, heads, None), P(rows, heads, None), P(rows, heads, None), pool, pool, P(), batch_specs),
        out_specs=(P(rows, heads, None), pool, pool), check_vma=False,
    )
    out, keys, values = mapped(q, k, v, keys, values, layer, batch)
    return out, (keys, values)


def build_work(page_table: jax.Array, num_pages: jax.Array, size: int, page_size: int) -> RaggedWork:
    """`paged_cache.ragged_work` per batch shard (under shard_map on a mesh of several
    devices): `size` entries per shard, local row and page ids. page_table [S, max_pages],
    num_pages [S]."""
    fn = functools.partial(ragged_work, size=size, page_size=page_size)
    current = multi_device_mesh()
    if current is None:
        return fn(page_table, num_pages)
    mesh, rules = current
    P = jax.sharding.PartitionSpec
    rows = logical_to_spec(("batch",), mesh, (page_table.shape[0],), rules)[0]
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(rows, None), P(rows)), out_specs=RaggedWork(P(rows), P(rows), P(rows)),
                         check_vma=False)(page_table, num_pages)
