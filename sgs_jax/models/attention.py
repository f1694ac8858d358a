"""Attention backends behind one function, `attend`.

    out = attend(q, k, v, mask, implementation)

q [B, T, Hq, D], k/v [B, S, Hkv, D] (Hq a multiple of Hkv: grouped-query attention), out
[B, T, Hq, D] in q's dtype. Which keys a query sees is an `AttentionMask`:

  self-attention (training, full forward):   T == S, query t sees keys s <= t that are valid
                                              (packed rows: and of its own segment)
  cached (prefill / decode into a KV cache): query t sits at cache slot q_slots[b, t] and
                                              sees the valid slots s <= q_slots[b, t]

Outputs are defined for real queries (self-attention: valid ones; cached: those that see at
least one key); other rows are finite but unspecified.

Backends (`ModelConfig.attention` chooses; `auto` picks per platform):
  reference  einsum with the fp32 [B, Hkv, G, T, S] scores materialised (tests' reference)
  native     FlashAttention-2's tiles in C++ for XLA:CPU (`models/native/flash_attention.cc`,
             XLA FFI calls in a custom VJP; built on first use): never holds [T, S], causal
             tiles above the diagonal skipped; CPU default where a C++ compiler is found
  blockwise  flash-style online softmax over key blocks in plain JAX, causal blocks
             skipped, custom backward (recomputes per block): never holds [T, S]; CPU
             fallback
  xla        `jax.nn.dot_product_attention(implementation="xla")` (materialises scores)
  cudnn      cuDNN flash attention through `jax.nn.dot_product_attention`; GPU, bf16/fp16
  splash     the Pallas splash-attention kernel shipped in JAX; TPU (interpret mode
             elsewhere, for tests), run per device under `shard_map` inside a mesh
Fused kernels serve self-attention; cached calls (short query blocks against a cache,
per-row masks) use `xla` instead: decode reads each cache row once either way.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from sgs_jax.models import native as native_kernels
from sgs_jax.parallel.rules import compile_platform, logical_to_spec, multi_device_mesh

# Names of the native kernels' forward outputs that their backward reads (the output and
# per-row log-sum-exp). A remat policy that saves them (`llama`'s "dots") keeps the backward
# from running the forward kernel again.
ATTENTION_OUT, ATTENTION_LSE = "attention_out", "attention_lse"

# Masked scores: finite, so a row with nothing visible gives no NaN.
_MASKED = -1e30


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """Which keys each query may attend to.

    kv_valid [B, S] bool: key s of row b is a real token; None = every key is (no padding,
    or right padding, whose keys causal masking alone already hides from real queries).
    q_slots [B, T] int32: the key slot of each query (cached case); None = self-attention,
    where query t is key t (T == S).
    lengths [B] int32 (self-attention with kv_valid None only): the rows are right-padded and
    row b's real tokens are its first lengths[b]. No backend needs it to be correct; the
    native kernels use it to skip the padding's work (a row costs its real length).
    segment_ids [B, T] int32 (self-attention with kv_valid None only): packed rows, several
    sequences side by side (`sgs_jax.rl.batching.pack_micro_batches`): query t sees keys
    s <= t with segment_ids[s] == segment_ids[t] != 0 (0 marks padding). Each segment is one
    contiguous run; the fused backends skip the work between segments.
    """

    kv_valid: jax.Array | None = None
    q_slots: jax.Array | None = None
    lengths: jax.Array | None = None
    segment_ids: jax.Array | None = None

    @property
    def is_self_attention(self) -> bool:
        return self.q_slots is None

    def dense(self, batch: int, t: int, s: int) -> jax.Array:
        """[B, T, S] bool: query t may see key s."""
        slots = jnp.arange(t, dtype=jnp.int32)[None, :] if self.q_slots is None else self.q_slots
        visible = jnp.arange(s, dtype=jnp.int32)[None, None, :] <= slots[:, :, None]
        if self.kv_valid is not None:
            visible = visible & self.kv_valid[:, None, :]
        if self.segment_ids is not None:
            seg = self.segment_ids
            visible = visible & (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
        return jnp.broadcast_to(visible, (batch, t, s))

    def segments(self, batch: int, t: int) -> jax.Array:
        """[B, T] int32 segment ids of self-attention (0 = padding): `segment_ids`, or one
        segment of the valid keys (`kv_valid`, else the first `lengths[b]`, else all). A query
        sees the earlier keys of its own non-zero segment; for padding queries (whose outputs
        are unspecified) that is none."""
        if self.segment_ids is not None:
            return self.segment_ids.astype(jnp.int32)
        if self.kv_valid is not None:
            return self.kv_valid.astype(jnp.int32)
        if self.lengths is not None:
            return (jnp.arange(t, dtype=jnp.int32)[None, :] < self.lengths[:, None]).astype(jnp.int32)
        return jnp.ones((batch, t), jnp.int32)


# ---- reference ---------------------------------------------------------------------------


def reference(q, k, v, mask: AttentionMask) -> jax.Array:
    """Einsum attention with the [B, Hkv, G, T, S] fp32 scores materialised (the reference)."""
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    q = q.reshape(b, t, hkv, hq // hkv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k).astype(jnp.float32) * (d**-0.5)
    visible = mask.dense(b, t, s)[:, None, None]
    scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, hq, d)


# ---- jax.nn.dot_product_attention: xla and cudnn -------------------------------------------


def xla(q, k, v, mask: AttentionMask) -> jax.Array:
    """`jax.nn.dot_product_attention` with XLA's implementation (any mask)."""
    if mask.is_self_attention and mask.segment_ids is None:
        dense = None if mask.kv_valid is None else mask.kv_valid[:, None, None, :]
        return jax.nn.dot_product_attention(q, k, v, mask=dense, is_causal=True, implementation="xla")
    dense = mask.dense(q.shape[0], q.shape[1], k.shape[1])[:, None]
    return jax.nn.dot_product_attention(q, k, v, mask=dense, implementation="xla")


def cudnn(q, k, v, mask: AttentionMask) -> jax.Array:
    """cuDNN flash attention (self-attention; bf16/fp16). Causal masking is the kernel's own;
    a padding mask (`kv_valid`) or packed rows' segments go in as a [B, 1, T, S] mask, so
    the Trainer's right-padded batches (kv_valid None) run without one."""
    if not mask.is_self_attention:
        raise ValueError("the cudnn backend serves self-attention; cached calls use xla")
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"model.attention='cudnn' needs model.dtype bfloat16 or float16, got {q.dtype}")
    dense = None
    b, t, s = q.shape[0], q.shape[1], k.shape[1]
    if mask.segment_ids is not None:
        dense = mask.dense(b, t, s)[:, None]
    elif mask.kv_valid is not None:
        dense = jnp.broadcast_to(mask.kv_valid[:, None, None, :], (b, 1, t, s))
    return jax.nn.dot_product_attention(q, k, v, mask=dense, is_causal=True, implementation="cudnn")


# ---- splash (Pallas, TPU) ------------------------------------------------------------------

_SPLASH_LANES = 128  # splash blocks are multiples of the TPU lane width


def splash(q, k, v, mask: AttentionMask, interpret: bool | None = None) -> jax.Array:
    """The Pallas splash-attention kernel (self-attention): causal mask, padding and packed
    rows as segment ids (padding keys are segment 0, so a real query never sees them). The
    sequence is padded up to a multiple of 128 (the kernel's block granularity) and cut
    back after. `interpret` defaults to True off TPU (Pallas interpret mode, for tests)."""
    if not mask.is_self_attention:
        raise ValueError("the splash backend serves self-attention; cached calls use xla")
    if interpret is None:
        interpret = compile_platform() != "tpu"
    b, t, hq, d = q.shape
    padded = -(-t // _SPLASH_LANES) * _SPLASH_LANES
    pad = ((0, 0), (0, padded - t), (0, 0), (0, 0))
    q, k, v = (jnp.pad(x, pad) for x in (q * jnp.asarray(d**-0.5, q.dtype), k, v))
    # Trailing padding sits after every real query, so causal masking already hides it.
    segments = None
    if mask.kv_valid is not None or mask.segment_ids is not None:
        segments = jnp.pad(mask.segments(b, t), ((0, 0), (0, padded - t)))
    kernel = functools.partial(_splash_per_device, heads=hq, length=padded, interpret=interpret)
    out = _per_device(kernel, q, k, v, segments)
    return out[:, :t]


def _splash_per_device(q, k, v, segments, *, heads: int, length: int, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    block = next(size for size in (512, 256, 128) if length % size == 0)
    sizes = sa.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
        # Separate dkv and dq kernels: the fused backward keeps dq partials of every key block
        # (bf16 [T/block, H, T, D], 1 GiB per 8K sequence of the 7B); split, the 7B micro-step
        # needs 1.4 GiB less scratch for 2% more roofline time (docs/planning.md).
        block_q_dq=block, block_kv_dq=block,
        use_fused_bwd_kernel=False,
    )
    local_heads = q.shape[2]
    causal = sa.MultiHeadMask([sa.CausalMask((length, length)) for _ in range(local_heads)])
    kernel = sa.make_splash_mha(causal, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)
    to_heads_first = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731  [B, H, T, D]
    q, k, v = map(to_heads_first, (q, k, v))
    if segments is None:
        out = jax.vmap(kernel)(q, k, v)
    else:
        out = jax.vmap(kernel)(q, k, v, sa.SegmentIds(q=segments, kv=segments))
    return to_heads_first(out)


def _per_device(fn, q, k, v, segments):
    """`fn(q, k, v, segments)` (segments: [B, T] ids or None) per device under `shard_map`
    over the enclosing mesh (batch over data/fsdp, heads over tensor when both q and kv
    heads divide it); plain call outside one."""
    # On one device shard_map would only add an all-reduce over it to the gradients.
    current = multi_device_mesh()
    if current is None:
        return fn(q, k, v, segments)
    mesh, rules = current
    q_spec = logical_to_spec(("batch", "seq", "q_heads", "head_dim"), mesh, q.shape, rules)
    k_spec = logical_to_spec(("batch", "cache_seq", "kv_heads", "head_dim"), mesh, k.shape, rules)
    if q_spec[2] != k_spec[2]:  # GQA groups must stay together on a device
        q_spec = jax.sharding.PartitionSpec(q_spec[0], q_spec[1], None, q_spec[3])
        k_spec = jax.sharding.PartitionSpec(k_spec[0], k_spec[1], None, k_spec[3])
    row_spec = jax.sharding.PartitionSpec(q_spec[0], None)
    mapped = jax.shard_map(
        fn, mesh=mesh, in_specs=(q_spec, k_spec, k_spec, None if segments is None else row_spec),
        out_specs=q_spec, check_vma=False,
    )
    return mapped(q, k, v, segments)


# ---- blockwise (flash-style in plain JAX) --------------------------------------------------


def blockwise(q, k, v, mask: AttentionMask, block: int | None = None) -> jax.Array:
    """Flash-style self-attention: per query block, an online softmax over the key blocks at
    or below the diagonal (causal blocks above it are never computed); a custom backward
    recomputes each block's probabilities from the saved log-sum-exp, so memory is
    O(T * D) per head, never O(T * S). `block` divides T (default: the largest of 128, 64,
    32 that does, the fastest on CPU measured; the reference when none does)."""
    if not mask.is_self_attention:
        raise ValueError("the blockwise backend serves self-attention; cached calls use xla")
    t = q.shape[1]
    block = block or next((size for size in (128, 64, 32) if t % size == 0), None)
    if block is None or block >= t:
        return reference(q, k, v, mask)
    return _flash(q, k, v, mask.segments(*q.shape[:2]), block)


def _to_blocks(x, block):
    """[B, T, H, ...] -> [T / block, B, H, block, ...]."""
    b, t = x.shape[:2]
    x = x.reshape(b, t // block, block, *x.shape[2:])
    return jnp.moveaxis(jnp.moveaxis(x, 1, 0), 2, 3)


def _from_blocks(x):
    """Inverse of `_to_blocks`."""
    x = jnp.moveaxis(jnp.moveaxis(x, 3, 2), 0, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])


def _block_probs(qi, kj, seg_i, seg_j, i, j, block, lse=None):
    """Scores (or, with `lse`, probabilities) of query block i against key block j.

    qi [B, K, G, bq, D] (pre-scaled), kj [B, K, bk, D], seg_i / seg_j [B, bq] / [B, bk]
    segment ids (`AttentionMask.segments`). Returns (values [B, K, G, bq, bk] fp32, visible
    mask)."""
    s = jnp.einsum("bkgqd,bksd->bkgqs", qi, kj, preferred_element_type=jnp.float32)
    rows = i * block + jnp.arange(block)[:, None]
    cols = j * block + jnp.arange(block)[None, :]
    same = (seg_i[:, :, None] == seg_j[:, None, :]) & (seg_j[:, None, :] > 0)  # [B, bq, bk]
    visible = (cols <= rows)[None, None, None] & same[:, None, None]
    if lse is None:
        return jnp.where(visible, s, _MASKED), visible
    return jnp.where(visible, jnp.exp(s - lse[..., None]), 0.0), visible


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, segments, block):
    return _flash_forward(q, k, v, segments, block)[0]


def _grouped_blocks(q, k, v, block):
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    scale = jnp.asarray(d**-0.5, q.dtype)
    qb = _to_blocks((q * scale).reshape(b, t, hkv, hq // hkv, d), block)  # [n, B, K, bq, G, D]
    qb = jnp.swapaxes(qb, 3, 4)  # [n, B, K, G, bq, D]
    return qb, _to_blocks(k, block), _to_blocks(v, block)  # k/v: [n, B, K, bk, D]


def _flash_forward(q, k, v, segments, block):
    b, t, hq, d = q.shape
    qb, kb, vb = _grouped_blocks(q, k, v, block)
    segb = jnp.moveaxis(segments.reshape(b, -1, block), 1, 0)  # [n, B, block]
    n = qb.shape[0]

    def query_block(i):
        qi = qb[i]

        def key_block(j, carry):
            m, l, acc = carry
            s, visible = _block_probs(qi, kb[j], segb[i], segb[j], i, j, block)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.where(visible, jnp.exp(s - m_new[..., None]), 0.0)
            correction = jnp.exp(m - m_new)
            l = l * correction + jnp.sum(p, axis=-1)
            pv = jnp.einsum("bkgqs,bksd->bkgqd", p.astype(vb.dtype), vb[j], preferred_element_type=jnp.float32)
            return m_new, l, acc * correction[..., None] + pv

        shape = qi.shape[:-1]
        init = (jnp.full(shape, _MASKED, jnp.float32), jnp.zeros(shape, jnp.float32), jnp.zeros(qi.shape, jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, i + 1, key_block, init)
        l_safe = jnp.maximum(l, jnp.finfo(jnp.float32).tiny)
        return (acc / l_safe[..., None]).astype(q.dtype), m + jnp.log(l_safe)

    out, lse = jax.lax.map(query_block, jnp.arange(n))  # [n, B, K, G, bq, D], [n, B, K, G, bq]
    out = _from_blocks(jnp.swapaxes(out, 3, 4)).reshape(b, t, hq, d)
    return out, lse


def _flash_fwd(q, k, v, segments, block):
    out, lse = _flash_forward(q, k, v, segments, block)
    return out, (q, k, v, segments, out, lse)


def _flash_bwd(block, residuals, d_out):
    q, k, v, segments, out, lse = residuals
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    qb, kb, vb = _grouped_blocks(q, k, v, block)
    grouped = lambda x: jnp.swapaxes(_to_blocks(x.reshape(b, t, hkv, hq // hkv, d), block), 3, 4)  # noqa: E731
    dob = grouped(d_out)
    delta = jnp.sum(dob.astype(jnp.float32) * grouped(out).astype(jnp.float32), axis=-1)  # [n, B, K, G, bq]
    segb = jnp.moveaxis(segments.reshape(b, -1, block), 1, 0)
    n = qb.shape[0]
    scale = d**-0.5

    def query_block(i, carry):
        dq, dk, dv = carry
        qi, doi, lse_i, delta_i = qb[i], dob[i], lse[i], delta[i]

        def key_block(j, inner):
            dq_i, dk, dv = inner
            p, _ = _block_probs(qi, kb[j], segb[i], segb[j], i, j, block, lse_i)
            dv = dv.at[j].add(jnp.einsum("bkgqs,bkgqd->bksd", p.astype(doi.dtype), doi, preferred_element_type=jnp.float32))
            dp = jnp.einsum("bkgqd,bksd->bkgqs", doi, vb[j], preferred_element_type=jnp.float32)
            ds = (p * (dp - delta_i[..., None])).astype(qi.dtype)
            dq_i = dq_i + jnp.einsum("bkgqs,bksd->bkgqd", ds, kb[j], preferred_element_type=jnp.float32)
            dk = dk.at[j].add(jnp.einsum("bkgqs,bkgqd->bksd", ds, qi, preferred_element_type=jnp.float32))
            return dq_i, dk, dv

        dq_i, dk, dv = jax.lax.fori_loop(0, i + 1, key_block, (jnp.zeros(qi.shape, jnp.float32), dk, dv))
        return dq.at[i].set(dq_i * scale), dk, dv

    zeros = lambda x: jnp.zeros(x.shape, jnp.float32)  # noqa: E731
    dq, dk, dv = jax.lax.fori_loop(0, n, query_block, (zeros(qb), zeros(kb), zeros(vb)))
    dq = _from_blocks(jnp.swapaxes(dq, 3, 4)).reshape(b, t, hq, d)
    # qi was pre-scaled, so dk already carries the scale.
    return dq.astype(q.dtype), _from_blocks(dk).astype(k.dtype), _from_blocks(dv).astype(v.dtype), None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ---- native (C++ for XLA:CPU) ----------------------------------------------------------------


def native(q, k, v, mask: AttentionMask) -> jax.Array:
    """Causal self-attention by the native CPU kernels (forward and backward, fp32 inside;
    any float dtype in and out), per device under `shard_map` inside a mesh. Head dims the
    kernels do not take (not a multiple of 16, or above 128) run `blockwise`."""
    if not mask.is_self_attention:
        raise ValueError("the native backend serves self-attention; cached calls use xla")
    if q.shape[-1] % 16 or q.shape[-1] > 128:
        return blockwise(q, k, v, mask)
    if not native_kernels.flash_attention_targets():
        raise RuntimeError("the native CPU attention kernels could not be built (see the warning above); use model.attention=blockwise")
    # Given lengths (right padding), the kernels skip queries past a row's last real token.
    return _per_device(_native_flash, q, k, v, mask.segments(*q.shape[:2]))


@jax.custom_vjp
def _native_flash(q, k, v, segments):
    return _native_flash_fwd(q, k, v, segments)[0]


def _native_flash_fwd(q, k, v, segments):
    b, t, hq, d = q.shape
    f32 = jnp.float32
    scaled, k32, v32 = q.astype(f32) * f32(d**-0.5), k.astype(f32), v.astype(f32)
    shapes = (jax.ShapeDtypeStruct(q.shape, f32), jax.ShapeDtypeStruct((b, hq, t), f32))
    out, lse = jax.ffi.ffi_call(native_kernels.FLASH_FORWARD, shapes)(scaled, k32, v32, segments)
    out, lse = checkpoint_name(out, ATTENTION_OUT), checkpoint_name(lse, ATTENTION_LSE)
    return out.astype(q.dtype), (scaled, k32, v32, segments, out, lse)


def _native_flash_bwd(residuals, d_out):
    # q, k and v share the model's compute dtype, which is d_out's.
    scaled, k, v, segments, out, lse = residuals
    f32 = jnp.float32
    shapes = tuple(jax.ShapeDtypeStruct(x.shape, f32) for x in (scaled, k, v))
    dq, dk, dv = jax.ffi.ffi_call(native_kernels.FLASH_BACKWARD, shapes)(scaled, k, v, segments, out, lse, d_out.astype(f32))
    # The kernel differentiates with respect to the scaled queries.
    dq = dq * f32(scaled.shape[-1] ** -0.5)
    return dq.astype(d_out.dtype), dk.astype(d_out.dtype), dv.astype(d_out.dtype), None


_native_flash.defvjp(_native_flash_fwd, _native_flash_bwd)


# ---- dispatch ------------------------------------------------------------------------------

BACKENDS = {"reference": reference, "blockwise": blockwise, "native": native, "xla": xla, "cudnn": cudnn, "splash": splash}


def select_backend(implementation: str, platform: str, mask: AttentionMask, dtype) -> str:
    """The backend `attend` runs for a `ModelConfig.attention` value on `platform`.

    auto: cpu -> native where its kernels build (else blockwise), gpu -> cudnn (xla for
    fp32), tpu -> splash. Fused backends serve self-attention only; cached calls fall back
    to xla. cudnn off GPU and native off CPU are errors."""
    if implementation not in ("auto", *BACKENDS):
        raise ValueError(f"unknown attention implementation {implementation!r}; expected auto or one of {sorted(BACKENDS)}")
    if implementation == "cudnn" and platform != "gpu":
        raise ValueError(f"model.attention='cudnn' needs a GPU (compiling for {platform})")
    if implementation == "native" and platform != "cpu":
        raise ValueError(f"model.attention='native' is the CPU kernel (compiling for {platform})")
    if implementation == "auto":
        if platform == "gpu":
            implementation = "cudnn" if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) else "xla"
        else:
            implementation = {"tpu": "splash"}.get(platform, "blockwise")
            if platform == "cpu" and native_kernels.flash_attention_targets():
                implementation = "native"
    if not mask.is_self_attention and implementation in ("blockwise", "native", "cudnn", "splash"):
        return "xla"
    return implementation


def attend(q, k, v, mask: AttentionMask, implementation: str = "auto") -> jax.Array:
    """Attention of q over k/v under `mask` with the chosen backend (see module docstring)."""
    return BACKENDS[select_backend(implementation, compile_platform(), mask, q.dtype)](q, k, v, mask)
