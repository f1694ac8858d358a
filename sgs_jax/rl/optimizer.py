"""The optimiser of both trained roles (method.md §4 step 9), built with optax.

Adam with beta = (0.9, 0.95), eps 1e-8, gradient clipping at global norm 1.0, a constant
learning rate and no weight decay. The optimiser state is always fp32, even when the
parameters are bf16: `fp32_optimizer` initialises and updates on fp32 views of the
parameters and gradients, and `optax.apply_updates` casts each sum back to the
parameter's dtype. (For fp32 master weights with bf16 compute, set the model's
`param_dtype="float32"` and `dtype="bfloat16"`: lr 3e-6 updates would mostly vanish in
bf16 parameters.)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """learning_rate: constant (3e-6 REINFORCE½ / Conjecturer, 1e-6 CISPO in the paper).
    max_grad_norm: global-norm clip; None or <= 0 disables it."""

    learning_rate: float = 3e-6
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0

    def __post_init__(self):
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if not (0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0):
            raise ValueError(f"Adam betas must lie in [0, 1), got ({self.b1}, {self.b2})")


def _to_fp32(tree):
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), tree)


def fp32_optimizer(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner` run on fp32 casts of parameters and gradients: fp32 state and updates."""

    def init(params):
        return inner.init(_to_fp32(params))

    def update(grads, state, params=None):
        return inner.update(_to_fp32(grads), state, None if params is None else _to_fp32(params))

    return optax.GradientTransformation(init, update)


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """clip_by_global_norm -> Adam(b1, b2, eps) -> constant learning rate, all in fp32."""
    parts = []
    if config.max_grad_norm is not None and config.max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(config.max_grad_norm))
    parts.append(optax.adam(config.learning_rate, b1=config.b1, b2=config.b2, eps=config.eps))
    return fp32_optimizer(optax.chain(*parts))
