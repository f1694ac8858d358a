"""The paged KV pool of the rollout engine: fixed-size pages shared by every decode row.

    pool keys/values  [kv_heads, layers, pages, page_size, head_dim]

A row owns a list of pages (its page table row); token t of the row sits at page
`page_table[row, t // page_size]`, offset `t % page_size`, in every layer. Rows take pages
as they grow and give them back when they finish (the host's `sampling.pages.PageAllocator`
decides which); the k samples of a prompt point their first page-table entries at the same
prompt pages. Capacity is counted in tokens (pages x page_size), not slots x max length.

Heads lead so that one layer's pages, with layers and pages merged ([kv_heads, layers *
pages, page_size, head_dim], a free reshape), are exactly the `k_pages` operand of the
Pallas paged-attention kernels: a kernel reads the whole pool buffer and never a per-layer
copy. Under a mesh the pages axis is split over the batch axes (data, fsdp) the same way the
rows are: rows of one batch shard use that shard's pages, and page ids are local to it
(0 .. pages per shard - 1). KV heads split over `tensor`.

The decode-time metadata is a `PagedBatch`: which pages each row holds, how many tokens it
has cached, and (for the gather-based XLA attention) a ragged work list of (row, page)
pairs covering only the pages rows hold, so attention cost follows live tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sgs_jax.models.config import ModelConfig

# Logical axes of the pool (sgs_jax.parallel.rules): pages split like rows.
POOL_AXES = ("kv_heads", "layers", "kv_pages", None, "head_dim")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
    """keys, values: [kv_heads, layers, num_pages, page_size, head_dim] each."""

    keys: jax.Array
    values: jax.Array

    @classmethod
    def create(cls, config: ModelConfig, num_pages: int, page_size: int, dtype=None) -> "PagedKVCache":
        """An all-zero pool (finite: masked attention weights times stale pages stay 0)."""
        dtype = config.compute_dtype if dtype is None else dtype
        shape = (config.num_kv_heads, config.num_layers, num_pages, page_size, config.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    @property
    def num_pages(self) -> int:
        return self.keys.shape[2]

    @property
    def page_size(self) -> int:
        return self.keys.shape[3]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RaggedWork:
    """The (row, page) pairs a gather-based attention visits, row-major, T entries per batch
    shard: rows [T] (the local row; `rows == num local rows` marks padding), pages [T]
    (local page id), starts [T] (row position of the page's first token)."""

    rows: jax.Array
    pages: jax.Array
    starts: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedBatch:
    """One decode step's view of the pool.

    page_table [S, max_pages] int32: local page ids each row holds (entries past what it
    holds are unused). cached [S] int32: tokens already in the pool for the row; this step
    writes the row's token at position `cached` and attends over positions 0..cached.
    active [S] bool: rows that write and whose outputs matter. work: the ragged work list
    (gather backend only), else None. backend: the decode attention that reads the pool
    (`models.paged_attention.PAGED_BACKENDS`; static, part of the compiled program).
    """

    page_table: jax.Array
    cached: jax.Array
    active: jax.Array
    work: RaggedWork | None = None
    backend: str = dataclasses.field(default="gather", metadata=dict(static=True))


def ragged_work(page_table: jax.Array, num_pages: jax.Array, size: int, page_size: int) -> RaggedWork:
    """The work list of one batch shard: for each row r, its first num_pages[r] pages, rows in
    order, padded to `size` entries (size >= sum(num_pages), the host's bucket).

    page_table [S, max_pages] int32, num_pages [S] int32 (0 for empty rows)."""
    rows_count, max_pages = page_table.shape
    ends = jnp.cumsum(num_pages)
    t = jnp.arange(size, dtype=jnp.int32)
    row = jnp.minimum(jnp.searchsorted(ends, t, side="right"), rows_count - 1).astype(jnp.int32)
    column = t - (ends[row] - num_pages[row])
    valid = t < ends[-1]
    page = page_table[row, jnp.clip(column, 0, max_pages - 1)]
    return RaggedWork(
        rows=jnp.where(valid, row, rows_count).astype(jnp.int32),
        pages=jnp.where(valid, page, 0).astype(jnp.int32),
        starts=(column * page_size).astype(jnp.int32),
    )


def write_token(keys: jax.Array, values: jax.Array, layer, k: jax.Array, v: jax.Array, batch: PagedBatch):
    """Write each active row's new key/value (k, v [S, kv_heads, head_dim]) of `layer` at
    its position `cached` (inactive rows write nothing). keys/values: one shard's pool.

    One [head_dim] vector per (row, head) is scattered, so the pool keeps its row-major
    layout (the one the Pallas kernels read) instead of one XLA would pick for a
    heads-wide update window, which would force a copy of the pool around every kernel."""
    num_pages, page_size = keys.shape[2], keys.shape[3]
    column = jnp.minimum(batch.cached // page_size, batch.page_table.shape[1] - 1)
    page = jnp.take_along_axis(batch.page_table, column[:, None], axis=1)[:, 0]
    page = jnp.where(batch.active, page, num_pages)[:, None]  # out of range: dropped
    offset = (batch.cached % page_size)[:, None]
    heads = jnp.arange(keys.shape[0], dtype=jnp.int32)[None, :]
    put = lambda pool, x: pool.at[heads, layer, page, offset].set(x.astype(pool.dtype), mode="drop")  # noqa: E731
    return put(keys, k), put(values, v)


def prompt_pages(keys: jax.Array, page_size: int) -> jax.Array:
    """Dense prefill keys or values [layers, U, T, kv_heads, head_dim] (T a multiple of
    page_size) as page-sized chunks [kv_heads, layers, U * T / page_size, page_size,
    head_dim]: chunk u * (T / page_size) + j holds positions j*page_size.. of prompt u."""
    layers, prompts, length, heads, dim = keys.shape
    chunks = keys.reshape(layers, prompts, length // page_size, page_size, heads, dim)
    return jnp.transpose(chunks, (4, 0, 1, 2, 3, 5)).reshape(heads, layers, -1, page_size, dim)


def write_pages(pool_keys: jax.Array, pool_values: jax.Array, chunk_keys, chunk_values, source: jax.Array, dest: jax.Array):
    """Copy prefill chunks into one shard's pool: chunk source[e] -> page dest[e] in every
    layer (dest out of range: skipped). A prompt's last, partly filled chunk appears once per
    sample row (each sample writes its own tokens after it); full chunks appear once and
    are shared. source, dest [E] int32."""
    put = lambda pool, chunks: pool.at[:, :, dest].set(chunks[:, :, source].astype(pool.dtype), mode="drop")  # noqa: E731
    return put(pool_keys, chunk_keys), put(pool_values, chunk_values)
