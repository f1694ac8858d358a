"""The preallocated key/value cache used by prefill and decode.

Each batch row owns its slots independently: `end[b]` is the next slot row b writes and
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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """keys/values: one [batch, max_len, kv_heads, head_dim] array per layer.
    valid: [batch, max_len] bool. end: [batch] int32, next slot to write per row."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    valid: jax.Array
    end: jax.Array

    @classmethod
    def create(cls, config: ModelConfig, batch: int, max_len: int, dtype=None) -> "KVCache":
        """An empty cache of `max_len` slots per row, in `dtype` (default: compute dtype)."""
        dtype = config.compute_dtype if dtype is None else dtype
        shape = (batch, max_len, config.num_kv_heads, config.head_dim)
        zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
        return cls(
            keys=zeros,
            values=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
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
        rep = lambda x: jnp.repeat(x, times, axis=0)  # noqa: E731
        return jax.tree_util.tree_map(rep, self)
