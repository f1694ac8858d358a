"""The LLaMA-family decoder (DeepSeek-Prover-V2-7B's architecture) in Flax NNX.

Parameter layouts are chosen for the projections (`project`) and sharding, not copied from PyTorch; every
per-layer parameter is stacked over layers (leading [layers] axis) and the decoder runs as
one `lax.scan` over them, so compile time does not grow with depth (on one CPU device the
full forward unrolls them instead: `ModelConfig.layer_loop`):
  embed.embedding                  [vocab, embed]
  layers.attn.q_proj.kernel        [layers, embed, q_heads, head_dim]   (k_proj, v_proj: kv_heads)
  layers.attn.o_proj.kernel        [layers, q_heads, head_dim, embed]
  layers.mlp.gate/up_proj.kernel   [layers, embed, mlp];  layers.mlp.down_proj.kernel [layers, mlp, embed]
  layers.attn_norm/mlp_norm.scale  [layers, embed];  final_norm.scale [embed]
  lm_head.kernel                   [embed, vocab] (absent when embeddings are tied)
`sgs_jax.models.hf_io` converts to and from Hugging Face names and layouts; attention
itself is `sgs_jax.models.attention.attend` (backend chosen by `config.attention`).

Three entry points share every layer:
  `model(input_ids, attention_mask, positions)`      full causal forward -> logits
  `model.forward_cached(input_ids, cache, ...)`      append tokens to a KVCache (prefill or
                                                      decode) -> (logits, cache)
  `model.forward_paged(tokens, pool, batch)`         one decode step per row into the paged
                                                      KV pool (`paged_cache`) -> (logits, pool)
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from sgs_jax.models.attention import ATTENTION_LSE, ATTENTION_OUT, AttentionMask, attend
from sgs_jax.models.config import ModelConfig
from sgs_jax.models.elementwise import swiglu
from sgs_jax.models.kv_cache import KVCache
from sgs_jax.models.paged_attention import paged_decode
from sgs_jax.models.paged_cache import PagedBatch, PagedKVCache
from sgs_jax.models.rope import apply_rope, rope_cos_sin
from sgs_jax.parallel.placement import DEVICE, HOST
from sgs_jax.parallel.rules import activation_sharding, constrain, current_mesh, named_sharding, one_cpu_device

_INIT_STD = 0.02  # transformers' Llama initializer_range


def _param(rngs: nnx.Rngs, shape, dtype, std=_INIT_STD) -> nnx.Param:
    return nnx.Param(jax.random.normal(rngs.params(), shape, dtype) * std)


def project(x: jax.Array, kernel: jax.Array, contract: int = 1) -> jax.Array:
    """x [..., *in] times kernel [*in, *out] -> [..., *out]: x's last `contract` dims
    against kernel's first `contract` (every projection of the model, LM head included).

    On one CPU device (no mesh, or the Trainer's one-device mesh), the matmul runs on x
    and kernel flattened to 2-D with a custom VJP whose weight gradient contracts the
    flattened token axis of x and of the output gradient as they are. Left to autodiff,
    XLA:CPU writes the output gradient (or an elementwise result feeding it) out transposed
    for that dot, a strided copy of every [tokens, features] gradient in the layer scan's
    backward (`docs/training_benchmark.md`). Elsewhere (accelerators, and CPU meshes of several
    devices, which stand in for them in tests) it is `jnp.tensordot`, whose gradient GSPMD
    shards and those compilers lay out well."""
    if one_cpu_device():
        return _project_2d(x, kernel, contract)
    return jnp.tensordot(x, kernel, axes=contract)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _project_2d(x, kernel, contract):
    return _project_2d_fwd(x, kernel, contract)[0]


def _as_2d(x, kernel, contract):
    """(x [tokens, in], kernel [in, out]): both flattened around the contracted dims."""
    features_in = math.prod(kernel.shape[:contract])
    return x.reshape(-1, features_in), kernel.reshape(features_in, -1)


def _project_2d_fwd(x, kernel, contract):
    x2, k2 = _as_2d(x, kernel, contract)
    y = (x2 @ k2).reshape(*x.shape[: x.ndim - contract], *kernel.shape[contract:])
    return y, (x, kernel)


def _project_2d_bwd(contract, residuals, dy):
    x, kernel = residuals
    x2, k2 = _as_2d(x, kernel, contract)
    dy2 = dy.reshape(x2.shape[0], k2.shape[1])
    dx = jax.lax.dot_general(dy2, k2, (((1,), (1,)), ((), ())))  # dy @ kernel^T
    dkernel = jax.lax.dot_general(x2, dy2, (((0,), (0,)), ((), ())))  # x^T @ dy, over the tokens as laid out
    return dx.reshape(x.shape), dkernel.reshape(kernel.shape)


_project_2d.defvjp(_project_2d_fwd, _project_2d_bwd)


class Weight(nnx.Module):
    """One named weight tensor `kernel`; the projection that uses it lives with its user."""

    def __init__(self, rngs: nnx.Rngs, shape, dtype):
        self.kernel = _param(rngs, shape, dtype)


class Embedding(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, vocab_size: int, dim: int, dtype):
        self.embedding = _param(rngs, (vocab_size, dim), dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype):
        self.scale = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        """Normalise in fp32, then scale in the input's dtype (as transformers does)."""
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(x.dtype) * normed.astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query attention with rotary embeddings."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c, pd = config, config.weight_dtype
        self.config = config
        self.q_proj = Weight(rngs, (c.hidden_size, c.num_heads, c.head_dim), pd)
        self.k_proj = Weight(rngs, (c.hidden_size, c.num_kv_heads, c.head_dim), pd)
        self.v_proj = Weight(rngs, (c.hidden_size, c.num_kv_heads, c.head_dim), pd)
        self.o_proj = Weight(rngs, (c.num_heads, c.head_dim, c.hidden_size), pd)

    def __call__(self, x, cos, sin, mask: AttentionMask, cache_kv=None, layer=None, qkv_kernel=None):
        """x [B, T, E]; cos/sin [B, T, rotary]. Returns (output [B, T, E], cache_kv).

        cache_kv: None (self-attention) or the stacked (keys, values), [L, B, S, Hkv, D]
        each: the new keys/values are written into layer `layer` at mask.q_slots first, and
        the queries attend over that layer's whole cache rows. With a `PagedBatch` as
        `mask` (paged decode, T = 1), cache_kv is the paged pool and `paged_decode` writes
        and attends over the pages each row holds. qkv_kernel: None, or this layer's
        q/k/v kernels concatenated over heads ([E, Hq + 2 Hkv, D], `FusedProjections`),
        multiplied as one matmul.
        """
        dt = self.config.compute_dtype
        if qkv_kernel is None:
            q = project(x, self.q_proj.kernel[...].astype(dt))
            k = project(x, self.k_proj.kernel[...].astype(dt))
            v = project(x, self.v_proj.kernel[...].astype(dt))
        else:
            q, k, v = jnp.split(project(x, qkv_kernel.astype(dt)), self._qkv_splits(), axis=2)
        q = constrain(apply_rope(q, cos, sin), ("batch", "seq", "q_heads", "head_dim"))
        k = apply_rope(k, cos, sin)
        if isinstance(mask, PagedBatch):
            out, cache_kv = paged_decode(q[:, 0], k[:, 0], v[:, 0], cache_kv, layer, mask)
            return project(out, self.o_proj.kernel[...].astype(dt), contract=2)[:, None], cache_kv
        if cache_kv is not None:
            keys, values = cache_kv
            rows = jnp.arange(x.shape[0])[:, None]
            keys = keys.at[layer, rows, mask.q_slots].set(k.astype(keys.dtype), mode="drop")
            values = values.at[layer, rows, mask.q_slots].set(v.astype(values.dtype), mode="drop")
            k, v, cache_kv = keys[layer], values[layer], (keys, values)
        k = constrain(k, ("batch", "cache_seq", "kv_heads", "head_dim")).astype(dt)
        v = constrain(v, ("batch", "cache_seq", "kv_heads", "head_dim")).astype(dt)
        out = attend(q, k, v, mask, self.config.attention)
        return project(out, self.o_proj.kernel[...].astype(dt), contract=2), cache_kv

    def _qkv_splits(self) -> tuple[int, int]:
        """Where q, k and v start and end along the fused kernel's heads axis."""
        return self.config.num_heads, self.config.num_heads + self.config.num_kv_heads


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c, pd = config, config.weight_dtype
        self.config = config
        self.gate_proj = Weight(rngs, (c.hidden_size, c.intermediate_size), pd)
        self.up_proj = Weight(rngs, (c.hidden_size, c.intermediate_size), pd)
        self.down_proj = Weight(rngs, (c.intermediate_size, c.hidden_size), pd)

    def __call__(self, x, gate_up_kernel=None):
        """x [B, T, E] -> [B, T, E]. gate_up_kernel: None, or this layer's gate and up
        kernels concatenated ([E, 2 mlp], `FusedProjections`), multiplied as one matmul."""
        dt = self.config.compute_dtype
        if gate_up_kernel is None:
            gate = project(x, self.gate_proj.kernel[...].astype(dt))
            up = project(x, self.up_proj.kernel[...].astype(dt))
        else:
            gate, up = jnp.split(project(x, gate_up_kernel.astype(dt)), 2, axis=-1)
        hidden = constrain(swiglu(gate, up), ("batch", "seq", "act_mlp"))
        return project(hidden, self.down_proj.kernel[...].astype(dt))


class DecoderLayer(nnx.Module):
    """One pre-norm block. `Llama` holds a single instance whose parameters are stacked over
    layers ([L, ...]) and runs it with `lax.scan`, one layer's slice per step (or unrolled,
    one slice per call: `ModelConfig.layer_loop`)."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.weight_dtype)
        self.attn = Attention(config, rngs)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.weight_dtype)
        self.mlp = MLP(config, rngs)

    def __call__(self, x, cos, sin, mask: AttentionMask, cache_kv=None, layer=None, fused: FusedProjections | None = None):
        """fused: this layer's slice of `FusedProjections` (on one CPU device: cached forwards
        and the unrolled full forward), or None."""
        qkv, gate_up = (None, None) if fused is None else (fused.qkv, fused.gate_up)
        attn_out, cache_kv = self.attn(self.attn_norm(x), cos, sin, mask, cache_kv, layer, qkv)
        x = x + attn_out
        x = x + self.mlp(self.mlp_norm(x), gate_up)
        return constrain(x, ("batch", "seq", "act_embed")), cache_kv


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FusedProjections:
    """The stacked layers' Q/K/V kernels concatenated over heads, qkv [L, E, Hq + 2 Hkv, D],
    and gate/up kernels concatenated, gate_up [L, E, 2 mlp]: one matmul each instead of
    three and two. Built on one CPU device only (on a mesh the concatenation would move
    sharded heads between devices): once per cached forward (`Llama._cached_layers`),
    outside the layer scan, so inside a decode loop XLA computes it once per loop, not per
    step, where at decode's few rows XLA:CPU runs the wider matmuls faster
    (`docs/sampling_benchmark.md`); and once per unrolled full forward
    (`Llama.hidden_states`), whose backward then sums one input gradient per fused product
    instead of adding three and two (`docs/training_benchmark.md`)."""

    qkv: jax.Array
    gate_up: jax.Array

    @classmethod
    def of(cls, layers: DecoderLayer) -> "FusedProjections":
        attn, mlp = layers.attn, layers.mlp
        qkv = jnp.concatenate([attn.q_proj.kernel[...], attn.k_proj.kernel[...], attn.v_proj.kernel[...]], axis=2)
        return cls(qkv, jnp.concatenate([mlp.gate_proj.kernel[...], mlp.up_proj.kernel[...]], axis=-1))


# The policies under which the layers' backward can add into a passed gradient accumulator.
ACCUMULATING_REMAT = ("full", "offload")

_REMAT_POLICIES = {
    "full": None,  # save nothing inside a layer
    "offload": None,  # as full; the accumulating scan keeps the layer inputs in host memory
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names(ATTENTION_OUT, ATTENTION_LSE)),
}


def _layers_accumulating(layer, layer_params, grad_acc, x, offload_inputs: bool = False):
    """`layer(params_l, x)` scanned over the stacked `layer_params`, with a backward pass
    that adds each layer's parameter gradient into `grad_acc` in place.

    Forward: one scan that keeps only each layer's input x_l ([layers, B, T, E], as full
    remat does). Backward: a reverse scan carrying (dx, grad_acc): layer l is recomputed
    from x_l, differentiated, and its gradient added into slice l of the carried
    accumulator, so the accumulator's buffer (donated by the Trainer) is updated in place.
    The cotangent returned for `layer_params` is `grad_acc + gradient` (that is the point:
    the caller uses it as the new accumulator); `grad_acc` itself gets a zero cotangent.
    The enclosing `activation_sharding` is re-entered in the backward pass, which JAX
    traces after the forward's context has closed. offload_inputs: the saved inputs go to
    host memory as the forward writes them and come back one layer at a time in the
    backward (only inside an `activation_sharding`, which gives their layout)."""
    sharding = current_mesh()

    def moved(x, memory_kind):
        # The saved input of a layer, placed in `memory_kind` with the activations' layout.
        if not offload_inputs or sharding is None:
            return x
        mesh, rules = sharding
        return jax.device_put(x, named_sharding(mesh, ("batch", "seq", "act_embed"), x.shape, rules).with_memory_kind(memory_kind))

    def under_sharding(fn, *args):
        if sharding is None:
            return fn(*args)
        with activation_sharding(*sharding):
            return fn(*args)

    @jax.custom_vjp
    def run(layer_params, grad_acc, x):
        return forward(layer_params, grad_acc, x)[0]

    def forward(layer_params, grad_acc, x):
        y, inputs = jax.lax.scan(lambda x, params: (layer(params, x), moved(x, HOST)), x, layer_params)
        return y, (layer_params, grad_acc, inputs)

    def backward(residuals, dy):
        layer_params, grad_acc, inputs = residuals

        def step(carry, index):
            dx, acc = carry
            take = lambda a: jax.lax.dynamic_index_in_dim(a, index, keepdims=False)  # noqa: E731
            _, vjp = jax.vjp(layer, jax.tree_util.tree_map(take, layer_params), moved(inputs[index], DEVICE))
            grads, dx = vjp(dx)
            add = lambda a, g: jax.lax.dynamic_update_index_in_dim(a, take(a) + g.astype(a.dtype), index, 0)  # noqa: E731
            return (dx, jax.tree_util.tree_map(add, acc, grads)), None

        layers = inputs.shape[0]
        (dx, acc), _ = jax.lax.scan(step, (dy, grad_acc), jnp.arange(layers - 1, -1, -1))
        return acc, jax.tree_util.tree_map(jnp.zeros_like, grad_acc), dx

    run.defvjp(lambda *args: under_sharding(forward, *args), lambda res, dy: under_sharding(backward, res, dy))
    return run(layer_params, grad_acc, x)


def stacked_layers(config: ModelConfig, rngs: nnx.Rngs) -> DecoderLayer:
    """A DecoderLayer whose parameters have a leading [num_layers] axis (the layout `Llama`
    scans over). Layers draw from `rngs` one after another, so a seed gives the same
    weights as the same layers built one by one."""
    graphdef, first = nnx.split(DecoderLayer(config, rngs))
    states = [first] + [nnx.state(DecoderLayer(config, rngs)) for _ in range(config.num_layers - 1)]
    return nnx.merge(graphdef, jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *states))


def self_attention_mask(attention_mask: jax.Array, right_padded: bool = False, segment_ids=None) -> AttentionMask:
    """The `AttentionMask` of a full causal pass (`Llama.hidden_states`): packed rows by
    their segment ids [B, T]; right-padded rows by their lengths (causal masking alone keeps
    the padding out; the native kernels skip it); otherwise the valid keys of
    attention_mask [B, T] bool."""
    if segment_ids is not None:
        return AttentionMask(segment_ids=segment_ids.astype(jnp.int32))
    if right_padded:
        return AttentionMask(lengths=attention_mask.sum(axis=1, dtype=jnp.int32))
    return AttentionMask(kv_valid=attention_mask)


class Llama(nnx.Module):
    """Decoder-only LLaMA-family language model."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = config
        self.embed = Embedding(rngs, c.vocab_size, c.hidden_size, c.weight_dtype)
        self.layers = stacked_layers(c, rngs)
        self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.weight_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = Weight(rngs, (c.hidden_size, c.vocab_size), c.weight_dtype)

    # ---- building blocks --------------------------------------------------------------
    def embed_tokens(self, input_ids: jax.Array) -> jax.Array:
        """[B, T] int -> [B, T, E] in compute dtype."""
        x = jnp.take(self.embed.embedding[...], input_ids, axis=0).astype(self.config.compute_dtype)
        return constrain(x, ("batch", "seq", "act_embed"))

    def lm_head_weights(self) -> jax.Array:
        """The LM head [E, V] in compute dtype (the embedding's transpose when tied)."""
        dt = self.config.compute_dtype
        if self.config.tie_word_embeddings:
            return self.embed.embedding[...].astype(dt).T
        return self.lm_head.kernel[...].astype(dt)

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """Final-normed hidden states [..., E] -> logits [..., V] in fp32."""
        return project(hidden, self.lm_head_weights()).astype(jnp.float32)

    # ---- full forward -------------------------------------------------------------------
    def hidden_states(self, input_ids, attention_mask=None, positions=None, *, right_padded: bool = False,
                      segment_ids=None, layer_grad_acc=None) -> jax.Array:
        """Final-normed hidden states [B, T, E] of a causal pass over `input_ids` [B, T].

        attention_mask [B, T] (1/True = real token) masks padding keys, left or right;
        positions [B, T] default to the count of real tokens before each token.
        right_padded=True promises every row's real tokens come first (as the Trainer's
        micro-batches are): causal masking alone then keeps the padding out of every real
        token's attention, so no padding mask is applied (fused kernels run unmasked; the
        native CPU kernels skip each row's padding) and only padding positions' outputs
        change.
        segment_ids [B, T] int32 (packed rows, `rl.batching.pack_micro_batches`): several
        sequences side by side in a row, numbered 1, 2, ... (0 = padding); a token attends
        only to earlier tokens of its own sequence, and positions default to the count of
        tokens before it in its sequence (`segment_positions`). attention_mask and
        right_padded are then not read.

        The layers run as one `lax.scan`, or unrolled (`config.layer_loop`: by default on one
        CPU device, where XLA writes the scan's saved activations into [layers, ...] stacks
        and slices them back out for the backward, 3-8% of a small model's training step;
        docs/training_benchmark.md; unrolled on one CPU device, the layers multiply by
        `FusedProjections`); `config.remat_policy` rematerialises each layer (this is
        the training entry point; the cached path never remats). The accumulating policies
        below always scan.

        layer_grad_acc (training with `remat_policy` "full" or "offload" only): a gradient accumulator
        shaped like the stacked layer parameters (`nnx.state(self.layers)`, any float dtype).
        Differentiated, the layers' parameters then get `layer_grad_acc + their gradient`,
        added layer by layer inside the backward scan (`_layers_accumulating`), so no fresh
        [layers, ...] gradient is ever materialised beside the accumulator. Under "offload"
        the layer inputs that scan saves for the backward are kept in host memory
        (`pinned_host`) between the two scans; without a mesh they stay where they are.
        """
        b, t = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        attention_mask = attention_mask.astype(bool)
        mask = self_attention_mask(attention_mask, right_padded, segment_ids)
        if segment_ids is not None and positions is None:
            positions = segment_positions(segment_ids)
        if positions is None:
            positions = default_positions(attention_mask)
        unrolled = layer_grad_acc is None and self._unrolled_layers()  # the accumulating scan never unrolls
        tables = functools.partial(rope_cos_sin, self.config, positions)
        cos, sin = _computed_once(tables, jnp.any(attention_mask)) if unrolled else tables()
        graphdef, layer_params = nnx.split(self.layers)

        def body(x, params, fused=None):
            x, _ = nnx.merge(graphdef, params)(x, cos, sin, mask, fused=fused)
            return x, None

        x = self.embed_tokens(input_ids)
        if layer_grad_acc is not None:
            if self.config.remat_policy not in ACCUMULATING_REMAT:
                raise ValueError(f"layer_grad_acc needs remat_policy in {ACCUMULATING_REMAT} (it saves only layer inputs), got {self.config.remat_policy!r}")
            layer = lambda params, x: body(x, params)[0]  # noqa: E731
            offload = self.config.remat_policy == "offload"
            return self.final_norm(_layers_accumulating(layer, layer_params, layer_grad_acc, x, offload))
        if self.config.remat_policy != "none":
            body = jax.checkpoint(body, policy=_REMAT_POLICIES[self.config.remat_policy], prevent_cse=False)
        if unrolled:
            n = self.config.num_layers
            # On one CPU device the unrolled layers multiply by fused q/k/v and gate/up
            # kernels (concatenated here, so their gradients split back to each kernel).
            fused = unstack_layers(FusedProjections.of(self.layers), n) if one_cpu_device() else [None] * n
            for params, fused_l in zip(unstack_layers(layer_params, n), fused):
                x, _ = body(x, params, fused_l)
        else:
            x, _ = jax.lax.scan(body, x, layer_params)
        return self.final_norm(x)

    def _unrolled_layers(self) -> bool:
        """Whether the full forward unrolls the layers (`ModelConfig.layer_loop`)."""
        if self.config.layer_loop == "auto":
            return one_cpu_device()
        return self.config.layer_loop == "unrolled"

    def __call__(self, input_ids, attention_mask=None, positions=None) -> jax.Array:
        """Logits [B, T, V] (fp32) of a full causal pass; see `hidden_states`."""
        return self.logits_from_hidden(self.hidden_states(input_ids, attention_mask, positions))

    # ---- cached forward ---------------------------------------------------------------
    def forward_cached(self, input_ids, cache: KVCache, attention_mask=None, positions=None):
        """Append `input_ids` [B, T] to each row of `cache` and return (logits [B, T, V], cache).

        Serves both prefill (an empty cache and a padded prompt batch) and decode (T = 1).
        Tokens are written at slots end[b] .. end[b] + T - 1; attention_mask [B, T] marks the
        real ones. Default positions continue from the number of real tokens already cached.
        Afterwards end[b] is one past the row's last real token, so right padding is
        overwritten by the next tokens. The stacked cache is carried through the layer
        scan and updated in place; no remat (nothing is differentiated here).
        """
        b, t = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        attention_mask = attention_mask.astype(bool)
        if positions is None:
            positions = cache.num_tokens()[:, None] + default_positions(attention_mask)
        slots = cache.end[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
        rows = jnp.arange(b)[:, None]
        valid = cache.valid.at[rows, slots].set(attention_mask, mode="drop")
        mask = AttentionMask(kv_valid=valid, q_slots=slots)
        cos, sin = rope_cos_sin(self.config, positions)
        x, (keys, values) = self._cached_layers(self.embed_tokens(input_ids), cos, sin, mask, (cache.keys, cache.values))
        last_real = jnp.max(jnp.where(attention_mask, slots + 1, 0), axis=1)
        end = jnp.maximum(cache.end, last_real).astype(jnp.int32)
        return self.logits_from_hidden(self.final_norm(x)), KVCache(keys, values, valid, end)


    def forward_paged(self, tokens: jax.Array, pool: PagedKVCache, batch: PagedBatch):
        """One decode step of every row into the paged pool: `tokens` [S] int32 sit at
        position batch.cached of their rows (their keys/values are written there, in every
        layer) and attend over the row's positions 0..cached. Returns (logits [S, V] fp32,
        pool). Inactive rows write nothing; their logits are unspecified. No remat."""
        positions = batch.cached[:, None]
        cos, sin = rope_cos_sin(self.config, positions)
        x, (keys, values) = self._cached_layers(self.embed_tokens(tokens[:, None]), cos, sin, batch, (pool.keys, pool.values))
        return self.logits_from_hidden(self.final_norm(x))[:, 0], PagedKVCache(keys, values)

    def _cached_layers(self, x, cos, sin, attention, kv):
        """The decoder layers as one `lax.scan` (no remat) threading the stacked (keys,
        values) through every layer: `attention` is the `AttentionMask` (per-row cache) or
        the `PagedBatch` (paged pool) each layer attends with. On one CPU device (no mesh,
        or a mesh of one: `one_cpu_device`) the layers multiply by `FusedProjections` (a
        copy of those kernels for the call, where memory is plentiful and the wider matmuls
        pay); on a mesh of several devices the projections stay separate, since
        concatenating kernels along their sharded heads axis would move weights between
        devices, and on accelerators the copy would cost memory the plan
        (`parallel/memory.py`) does not hold."""
        graphdef, layer_params = nnx.split(self.layers)
        fused = FusedProjections.of(self.layers) if one_cpu_device() else None

        def body(carry, xs):
            x, kv = carry
            params, layer, fused_l = xs
            return nnx.merge(graphdef, params)(x, cos, sin, attention, kv, layer, fused_l), None

        layer_ids = jnp.arange(self.config.num_layers, dtype=jnp.int32)
        (x, kv), _ = jax.lax.scan(body, (x, kv), (layer_params, layer_ids, fused))
        return x, kv


def _computed_once(compute, any_real_token: jax.Array):
    """`compute()` (a tree of arrays, here the RoPE tables) evaluated into buffers of its
    own, which the fusions reading it load rather than recompute.

    With the layers unrolled, XLA:CPU fuses an elementwise producer such as the RoPE tables
    into every fusion that reads it (each layer's q and k, forward and backward) and
    evaluates it there once per element of q or k, heads included: with the polynomial
    `sincos` 2-3% of the training benchmark's step at 256 tokens, with XLA's own cos and
    sin 4-5% (`docs/training_benchmark.md`, stop 53). In the scan the tables are
    loop-invariant operands, computed once. `lax.optimization_barrier` does not stop it on
    CPU; a conditional does, since fusion never crosses one, and XLA keeps one whose
    predicate it cannot know at compile time. Hence the predicate, whether any token is
    real: with none, no output of the forward means anything, so the other branch's zeros
    change nothing that is read. (When the mask is a compile-time constant, as when
    `hidden_states` gets none, XLA folds the conditional away: the same numbers, computed
    in every fusion again.)"""
    zeros = lambda: jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(compute))  # noqa: E731
    return jax.lax.cond(any_real_token, compute, zeros)


def unstack_layers(stacked, num_layers: int) -> list:
    """The per-layer slices of a tree of [num_layers, ...] arrays, as `num_layers` trees.

    One `lax.split` per array rather than an index per layer: differentiated, a split's
    gradient is one concatenate of the layers' gradients, where indexing pads each
    layer's gradient to the full [num_layers, ...] shape and adds the pads up."""
    leaves, treedef = jax.tree_util.tree_flatten(stacked)
    pieces = [jax.lax.split(leaf, [1] * num_layers, axis=0) for leaf in leaves]
    return [treedef.unflatten([piece[index][0] for piece in pieces]) for index in range(num_layers)]


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """[B, T] int32 position of each token of packed rows ([B, T] segment ids, each segment
    one contiguous run): the count of tokens before it in its segment."""
    t = segment_ids.shape[1]
    index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), segment_ids.shape)
    previous = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    starts = jax.lax.cummax(jnp.where(segment_ids != previous, index, 0), axis=1)
    return index - starts


def default_positions(attention_mask: jax.Array) -> jax.Array:
    """Position of each token = number of real tokens before it (0 for leading padding)."""
    mask = attention_mask.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0).astype(jnp.int32)
