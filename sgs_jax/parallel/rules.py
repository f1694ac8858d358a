"""Logical-axis rules: which mesh axes each parameter and activation dimension uses.

Every parameter of the model has logical axis names (`PARAM_LOGICAL_AXES`, keyed by the
last two names of its path); `RULES` maps logical names to mesh axes. A mesh axis is
dropped for a dimension it does not divide evenly (e.g. 2 KV heads on tensor=4), so every
model runs on every mesh, replicated where it must be.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# logical axis -> mesh axes (None = replicated). FSDP shards the embedding dimension of
# weights; tensor parallelism shards heads, MLP and vocabulary.
RULES: dict[str, tuple[str, ...] | None] = {
    "layers": None,  # the stacked-layers axis the decoder scans over: every device holds all layers
    "batch": ("data", "fsdp"),
    "seq": None,
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "q_heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": None,
    "mlp": ("tensor",),
    "norm": None,
    "act_embed": None,  # activations keep the embedding dim whole
    "act_mlp": ("tensor",),
    "act_vocab": ("tensor",),
    "cache_seq": None,
    "kv_pages": ("data", "fsdp"),  # the sampler's paged KV pool: pages split like the rows that hold them
}

# (module name, parameter name) -> logical axes of the parameter's dimensions. Per-layer
# parameters are stacked over layers (`layers`, leading).
PARAM_LOGICAL_AXES: dict[tuple[str, str], tuple[str, ...]] = {
    ("embed", "embedding"): ("vocab", "embed"),
    ("q_proj", "kernel"): ("layers", "embed", "q_heads", "head_dim"),
    ("k_proj", "kernel"): ("layers", "embed", "kv_heads", "head_dim"),
    ("v_proj", "kernel"): ("layers", "embed", "kv_heads", "head_dim"),
    ("o_proj", "kernel"): ("layers", "q_heads", "head_dim", "embed"),
    ("gate_proj", "kernel"): ("layers", "embed", "mlp"),
    ("up_proj", "kernel"): ("layers", "embed", "mlp"),
    ("down_proj", "kernel"): ("layers", "mlp", "embed"),
    ("attn_norm", "scale"): ("layers", "norm"),
    ("mlp_norm", "scale"): ("layers", "norm"),
    ("final_norm", "scale"): ("norm",),
    ("lm_head", "kernel"): ("embed", "vocab"),
}

_CURRENT: contextvars.ContextVar[tuple[Mesh, Mapping] | None] = contextvars.ContextVar("sgs_mesh", default=None)


def path_names(path: Sequence[Any]) -> tuple[str, ...]:
    """Readable names of a pytree path of an `nnx.State` (integers kept as str, 'value' dropped)."""
    names = []
    for entry in path:
        key = getattr(entry, "key", getattr(entry, "name", getattr(entry, "idx", entry)))
        names.append(str(key))
    if names and names[-1] == "value":
        names.pop()
    return tuple(names)


def param_logical_axes(path: Sequence[Any]) -> tuple[str, ...]:
    """Logical axes of the parameter at `path` (an nnx.State pytree path)."""
    names = path_names(path)
    key = tuple(names[-2:])
    if key not in PARAM_LOGICAL_AXES:
        raise KeyError(f"no logical axes for parameter {'/'.join(names)}; add it to PARAM_LOGICAL_AXES")
    return PARAM_LOGICAL_AXES[key]


def logical_to_spec(
    logical_axes: Sequence[str | None],
    mesh: Mesh,
    shape: Sequence[int] | None = None,
    rules: Mapping[str, tuple[str, ...] | None] | None = None,
) -> PartitionSpec:
    """PartitionSpec for `logical_axes`, dropping mesh axes of size 1, axes that do not divide
    the dimension (when `shape` is given) and axes already used by an earlier dimension."""
    rules = RULES if rules is None else rules
    used: set[str] = set()
    spec = []
    for dim, name in enumerate(logical_axes):
        mesh_axes = rules.get(name) if name is not None else None
        chosen = []
        size = 1
        for axis in mesh_axes or ():
            if axis in used or axis not in mesh.shape or mesh.shape[axis] == 1:
                continue
            if shape is not None and shape[dim] % (size * mesh.shape[axis]):
                continue
            chosen.append(axis)
            size *= mesh.shape[axis]
        used.update(chosen)
        spec.append(tuple(chosen) if len(chosen) > 1 else (chosen[0] if chosen else None))
    return PartitionSpec(*spec)


def state_shardings(state: Any, mesh: Mesh, rules: Mapping | None = None) -> Any:
    """A pytree of NamedSharding matching a model's parameter state (arrays or shape structs)."""

    def one(path, leaf):
        spec = logical_to_spec(param_logical_axes(path), mesh, leaf.shape, rules)
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(one, state)


def named_sharding(mesh: Mesh, logical_axes: Sequence[str | None], shape=None, rules=None) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(logical_axes, mesh, shape, rules))


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Mapping | None = None):
    """Within this context, `constrain` pins activations to `mesh` with `rules`."""
    token = _CURRENT.set((mesh, RULES if rules is None else rules))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_mesh() -> tuple[Mesh, Mapping] | None:
    """(mesh, rules) of the enclosing `activation_sharding`, or None outside one."""
    return _CURRENT.get()


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """Sharding constraint on an activation; a no-op outside `activation_sharding`."""
    current = _CURRENT.get()
    if current is None:
        return x
    mesh, rules = current
    return jax.lax.with_sharding_constraint(x, named_sharding(mesh, logical_axes, x.shape, rules))
