"""The preallocated key/value cache used by prefill and decode.

Keys and values are stacked over layers ([layers, batch, slots, kv_heads, head_dim]) so
the model's layer scan carries them and writes each layer's new tokens in place. Each
batch row owns its slots independently: `end[b]` is the next slot row b writes and
`valid[b, s]` says whether slot s holds a real token. Padding tokens are written but
marked invalid, and after a prefill `end` points just past the row's last real token, so
right-padded prompts get their padding overwritten by the first generated tokens. A row
can be reset on its own (continuous batching) with `reset_rows`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sgs_jax.models.config import ModelConfig

# Logical axes of the stacked keys/values (sgs_jax.parallel.rules).
KV_AXES = ("layers", "batch", "cache_seq", "kv_heads", "head_dim")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """keys/values: [layers, batch, max_len, kv_heads, head_dim] each.
    valid: [batch, max_len] bool. end: [batch] int32, next slot to write per row."""

    keys: jax.Array
    values: jax.Array
    valid: jax.Array
    end: jax.Array

    @classmethod
    def create(cls, config: ModelConfig, batch: int, max_len: int, dtype=None) -> "KVCache":
        """An empty cache of `max_len` slots per row, in `dtype` (default: compute dtype)."""
        dtype = config.compute_dtype if dtype is None else dtype
        shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
        return cls(
            keys=jnp.zeros(shape, dtype),
            values=jnp.zeros(shape, dtype),
            valid=jnp.zeros((batch, max_len), bool),
            end=jnp.zeros((batch,), jnp.int32),
        )

    @property
    def batch_size(self) -> int:
        return self.valid.shape[0]

    @property
    def max_len(self) -> int:
        return self.valid.shape[1]

    def num_tokens(self) -> jax.Array:
        """[batch] number of real tokens held per row."""
        return jnp.sum(self.valid, axis=1).astype(jnp.int32)

    def reset_rows(self, rows: jax.Array) -> "KVCache":
        """Empty the rows where `rows` [batch] bool is True (stale keys stay but are invalid)."""
        return dataclasses.replace(
            self,
            valid=jnp.where(rows[:, None], False, self.valid),
            end=jnp.where(rows, 0, self.end),
        )

    def repeat_rows(self, times: int) -> "KVCache":
        """Each row repeated `times` times, consecutively (k rollouts sharing one prefill)."""
        return KVCache(
            keys=jnp.repeat(self.keys, times, axis=1),
            values=jnp.repeat(self.values, times, axis=1),
            valid=jnp.repeat(self.valid, times, axis=0),
            end=jnp.repeat(self.end, times, axis=0),
        )
