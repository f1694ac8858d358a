"""The LLaMA-family decoder (DeepSeek-Prover-V2-7B's architecture) in Flax NNX.

Parameter layouts are chosen for einsum and sharding, not copied from PyTorch:
  embed.embedding      [vocab, embed]
  q_proj.kernel        [embed, q_heads, head_dim]   (k_proj, v_proj: kv_heads)
  o_proj.kernel        [q_heads, head_dim, embed]
  gate/up_proj.kernel  [embed, mlp];  down_proj.kernel [mlp, embed]
  lm_head.kernel       [embed, vocab] (absent when embeddings are tied)
`sgs_jax.models.hf_io` converts to and from Hugging Face names and layouts.

Two entry points share every layer:
  `model(input_ids, attention_mask, positions)`      full causal forward -> logits
  `model.forward_cached(input_ids, cache, ...)`      append tokens to a KVCache (prefill or
                                                      decode) -> (logits, cache)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sgs_jax.models.config import ModelConfig
from sgs_jax.models.kv_cache import KVCache
from sgs_jax.models.rope import apply_rope, rope_cos_sin
from sgs_jax.parallel.rules import constrain

_INIT_STD = 0.02  # transformers' Llama initializer_range


def _param(rngs: nnx.Rngs, shape, dtype, std=_INIT_STD) -> nnx.Param:
    return nnx.Param(jax.random.normal(rngs.params(), shape, dtype) * std)


class Weight(nnx.Module):
    """One named weight tensor `kernel`; the einsum that uses it lives with its user."""

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

    def __call__(self, x, cos, sin, mask, cache_kv=None, slots=None):
        """x [B, T, E]; cos/sin [B, T, rotary]; mask [B, T, S] bool (query t may see key s).

        Without a cache S = T. With `cache_kv` ([B, S, Hkv, D] each) the new keys/values are
        written at `slots` [B, T] first. Returns (output [B, T, E], updated cache_kv or None).
        """
        c, dt = self.config, self.config.compute_dtype
        q = jnp.einsum("bte,ehd->bthd", x, self.q_proj.kernel[...].astype(dt))
        k = jnp.einsum("bte,ehd->bthd", x, self.k_proj.kernel[...].astype(dt))
        v = jnp.einsum("bte,ehd->bthd", x, self.v_proj.kernel[...].astype(dt))
        q = constrain(apply_rope(q, cos, sin), ("batch", "seq", "q_heads", "head_dim"))
        k = apply_rope(k, cos, sin)
        new_cache = None
        if cache_kv is not None:
            rows = jnp.arange(x.shape[0])[:, None]
            k = cache_kv[0].at[rows, slots].set(k.astype(cache_kv[0].dtype), mode="drop")
            v = cache_kv[1].at[rows, slots].set(v.astype(cache_kv[1].dtype), mode="drop")
            new_cache = (k, v)
        k = constrain(k, ("batch", "cache_seq", "kv_heads", "head_dim"))
        v = constrain(v, ("batch", "cache_seq", "kv_heads", "head_dim"))
        groups = c.num_heads // c.num_kv_heads
        b, t = q.shape[:2]
        q = q.reshape(b, t, c.num_kv_heads, groups, c.head_dim)
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k.astype(dt)).astype(jnp.float32)
        scores = scores * (c.head_dim**-0.5)
        scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(dt)).reshape(b, t, c.num_heads, c.head_dim)
        out = jnp.einsum("bthd,hde->bte", out, self.o_proj.kernel[...].astype(dt))
        return out, new_cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c, pd = config, config.weight_dtype
        self.config = config
        self.gate_proj = Weight(rngs, (c.hidden_size, c.intermediate_size), pd)
        self.up_proj = Weight(rngs, (c.hidden_size, c.intermediate_size), pd)
        self.down_proj = Weight(rngs, (c.intermediate_size, c.hidden_size), pd)

    def __call__(self, x):
        dt = self.config.compute_dtype
        gate = x @ self.gate_proj.kernel[...].astype(dt)
        up = x @ self.up_proj.kernel[...].astype(dt)
        hidden = constrain(jax.nn.silu(gate) * up, ("batch", "seq", "act_mlp"))
        return hidden @ self.down_proj.kernel[...].astype(dt)


class DecoderLayer(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.weight_dtype)
        self.attn = Attention(config, rngs)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.weight_dtype)
        self.mlp = MLP(config, rngs)

    def __call__(self, x, cos, sin, mask, cache_kv=None, slots=None):
        attn_out, new_cache = self.attn(self.attn_norm(x), cos, sin, mask, cache_kv, slots)
        x = x + attn_out
        x = x + self.mlp(self.mlp_norm(x))
        return constrain(x, ("batch", "seq", "act_embed")), new_cache


_REMAT_POLICIES = {
    "full": None,  # save nothing inside a layer
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _run_layer(layer: DecoderLayer, x, cos, sin, mask, cache_kv, slots):
    return layer(x, cos, sin, mask, cache_kv, slots)


class Llama(nnx.Module):
    """Decoder-only LLaMA-family language model."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = config
        self.embed = Embedding(rngs, c.vocab_size, c.hidden_size, c.weight_dtype)
        self.layers = nnx.List([DecoderLayer(c, rngs) for _ in range(c.num_layers)])
        self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.weight_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = Weight(rngs, (c.hidden_size, c.vocab_size), c.weight_dtype)

    # ---- building blocks --------------------------------------------------------------
    def _layer_fn(self):
        if self.config.remat_policy == "none":
            return _run_layer
        return nnx.remat(_run_layer, policy=_REMAT_POLICIES[self.config.remat_policy])

    def embed_tokens(self, input_ids: jax.Array) -> jax.Array:
        """[B, T] int -> [B, T, E] in compute dtype."""
        x = jnp.take(self.embed.embedding[...], input_ids, axis=0).astype(self.config.compute_dtype)
        return constrain(x, ("batch", "seq", "act_embed"))

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """Final-normed hidden states [..., E] -> logits [..., V] in fp32."""
        dt = self.config.compute_dtype
        if self.config.tie_word_embeddings:
            logits = hidden @ self.embed.embedding[...].astype(dt).T
        else:
            logits = hidden @ self.lm_head.kernel[...].astype(dt)
        return logits.astype(jnp.float32)

    # ---- full forward -------------------------------------------------------------------
    def hidden_states(self, input_ids, attention_mask=None, positions=None) -> jax.Array:
        """Final-normed hidden states [B, T, E] of a causal pass over `input_ids` [B, T].

        attention_mask [B, T] (1/True = real token) masks padding keys, left or right;
        positions [B, T] default to the count of real tokens before each token.
        """
        b, t = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        attention_mask = attention_mask.astype(bool)
        if positions is None:
            positions = default_positions(attention_mask)
        causal = jnp.tril(jnp.ones((t, t), bool))
        mask = causal[None] & attention_mask[:, None, :]
        cos, sin = rope_cos_sin(self.config, positions)
        x = self.embed_tokens(input_ids)
        layer_fn = self._layer_fn()
        for layer in self.layers:
            x, _ = layer_fn(layer, x, cos, sin, mask, None, None)
        return self.final_norm(x)

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
        overwritten by the next tokens.
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
        key_slots = jnp.arange(cache.max_len, dtype=jnp.int32)
        mask = valid[:, None, :] & (key_slots[None, None, :] <= slots[:, :, None])
        cos, sin = rope_cos_sin(self.config, positions)
        x = self.embed_tokens(input_ids)
        layer_fn = self._layer_fn()
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            x, (k, v) = layer_fn(layer, x, cos, sin, mask, (cache.keys[i], cache.values[i]), slots)
            keys.append(k)
            values.append(v)
        last_real = jnp.max(jnp.where(attention_mask, slots + 1, 0), axis=1)
        end = jnp.maximum(cache.end, last_real).astype(jnp.int32)
        new_cache = KVCache(tuple(keys), tuple(values), valid, end)
        return self.logits_from_hidden(self.final_norm(x)), new_cache


def default_positions(attention_mask: jax.Array) -> jax.Array:
    """Position of each token = number of real tokens before it (0 for leading padding)."""
    mask = attention_mask.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0).astype(jnp.int32)
