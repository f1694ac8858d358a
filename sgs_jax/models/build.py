"""Creating models: abstract (no memory), randomly initialised, or directly sharded."""

from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import Mesh

from sgs_jax.models.config import ModelConfig
from sgs_jax.models.llama import Llama
from sgs_jax.parallel.rules import state_shardings


def abstract_model(config: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """Graph definition and parameter state of shape structs; allocates nothing."""
    model = nnx.eval_shape(lambda: Llama(config, rngs=nnx.Rngs(0)))
    return nnx.split(model)


def create_model(config: ModelConfig, seed: int = 0, mesh: Mesh | None = None, rules=None) -> Llama:
    """A randomly initialised model. With `mesh`, every parameter is created directly in
    its shard (jitted init with out_shardings): no device ever holds the full model."""
    if mesh is None:
        return Llama(config, rngs=nnx.Rngs(seed))
    graphdef, abstract_state = abstract_model(config)
    shardings = state_shardings(abstract_state, mesh, rules)

    def init():
        return nnx.state(Llama(config, rngs=nnx.Rngs(seed)))

    state = jax.jit(init, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def shard_model(model: Llama, mesh: Mesh, rules=None) -> Llama:
    """Move an existing model's parameters onto `mesh` by the logical-axis rules (in place)."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, state_shardings(state, mesh, rules)))
    return model
