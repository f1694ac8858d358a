"""Logical-axis rules: which mesh axes each parameter and activation dimension uses.

Every parameter of the model has logical axis names (`PARAM_LOGICAL_AXES`, keyed by the
last two names of its path); `RULES` maps logical names to mesh axes. A mesh axis is
dropped for a dimension it does not divide evenly (e.g. 2 KV heads on tensor=4), so every
model runs on every mesh, replicated where it must be (`replicated_parameters` lists those
dimensions). Batch dimensions never fall back: `batch_spec` / `check_batch` refuse a batch
that does not split over (data, fsdp).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
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

# The rollout engine's weights: like RULES but replicated over data and fsdp (`embed` whole),
# so a decode step reads only local weights (no all-gather per step or chunk); heads, MLP and
# vocabulary still split over tensor. Activations follow RULES (they use `act_*` names).
INFERENCE_RULES: dict[str, tuple[str, ...] | None] = {**RULES, "embed": None}

# `sampling.weights_layout` -> the parameter rules of the sampling copy.
LAYOUTS: dict[str, dict[str, tuple[str, ...] | None]] = {"inference": INFERENCE_RULES, "training": RULES}


def layout_rules(layout: str) -> dict[str, tuple[str, ...] | None]:
    """The parameter rules of a named layout (`LAYOUTS`); ValueError naming the choices."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown weights layout {layout!r}; expected one of {tuple(LAYOUTS)}")
    return LAYOUTS[layout]


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


def _assign(
    logical_axes: Sequence[str | None], mesh: Mesh, shape: Sequence[int] | None, rules: Mapping
) -> tuple[PartitionSpec, list[tuple[int, str, str]]]:
    """(spec, dropped): the PartitionSpec, and (dim, logical name, mesh axis) of every mesh
    axis the rules asked for but that does not divide its dimension (a replication fallback)."""
    used: set[str] = set()
    spec, dropped = [], []
    for dim, name in enumerate(logical_axes):
        mesh_axes = rules.get(name) if name is not None else None
        chosen = []
        size = 1
        for axis in mesh_axes or ():
            if axis in used or axis not in mesh.shape or mesh.shape[axis] == 1:
                continue
            if shape is not None and shape[dim] % (size * mesh.shape[axis]):
                dropped.append((dim, name, axis))
                continue
            chosen.append(axis)
            size *= mesh.shape[axis]
        used.update(chosen)
        spec.append(tuple(chosen) if len(chosen) > 1 else (chosen[0] if chosen else None))
    return PartitionSpec(*spec), dropped


def logical_to_spec(
    logical_axes: Sequence[str | None],
    mesh: Mesh,
    shape: Sequence[int] | None = None,
    rules: Mapping[str, tuple[str, ...] | None] | None = None,
) -> PartitionSpec:
    """PartitionSpec for `logical_axes`, dropping mesh axes of size 1, axes that do not divide
    the dimension (when `shape` is given) and axes already used by an earlier dimension.

    Dropping is right for parameters (any model runs on any mesh, replicated where it must
    be; `replicated_parameters` lists where). Batch axes go through `batch_spec`, which
    refuses instead: a dropped batch axis makes every device run every row."""
    return _assign(logical_axes, mesh, shape, RULES if rules is None else rules)[0]


def batch_shards(mesh: Mesh, rules: Mapping | None = None) -> int:
    """Devices a batch dimension is split over: the product of the mesh axes `batch` maps to."""
    rules = RULES if rules is None else rules
    return math.prod(mesh.shape[a] for a in rules["batch"] or () if a in mesh.shape)


def check_batch(rows: int, mesh: Mesh, what: str, rules: Mapping | None = None) -> None:
    """Raise ValueError (naming `what` and the numbers) unless `rows` split evenly over the
    batch mesh axes; call before any work."""
    rules = RULES if rules is None else rules
    shards = batch_shards(mesh, rules)
    if rows % shards:
        axes = " x ".join(f"{a}={mesh.shape[a]}" for a in rules["batch"] or () if a in mesh.shape)
        up = -(-rows // shards) * shards
        raise ValueError(
            f"{what}={rows} rows do not split over the batch mesh axes ({axes} = {shards} devices): every device "
            f"would run all {rows}; use a multiple of {shards} (e.g. {up}) or change the mesh"
        )


def batch_spec(logical_axes: Sequence[str | None], mesh: Mesh, shape: Sequence[int], what: str, rules: Mapping | None = None) -> PartitionSpec:
    """`logical_to_spec` for an array whose first dimension is a batch axis; ValueError (via
    `check_batch`) instead of silently replicating rows that do not divide the mesh."""
    check_batch(shape[0], mesh, what, rules)
    return logical_to_spec(logical_axes, mesh, shape, rules)


def replicated_parameters(state: Any, mesh: Mesh, rules: Mapping | None = None) -> list[str]:
    """One line per parameter dimension whose rule's mesh axis was dropped because it does
    not divide the dimension (so that dimension is replicated over that axis)."""
    rules = RULES if rules is None else rules
    lines = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        axes = param_logical_axes(path)
        for dim, name, axis in _assign(axes, mesh, leaf.shape, rules)[1]:
            lines.append(f"{'/'.join(path_names(path))} dim {dim} ({name}, size {leaf.shape[dim]}): "
                         f"not divisible by {axis}={mesh.shape[axis]}, replicated")
    return lines


def log_replicated_parameters(state: Any, mesh: Mesh, logger, rules: Mapping | None = None) -> list[str]:
    """Log `replicated_parameters` as one block (a warning when there are any); returns the lines."""
    lines = replicated_parameters(state, mesh, rules)
    shape = " ".join(f"{k}={v}" for k, v in mesh.shape.items())
    if lines:
        logger.warning("parameters replicated where the mesh (%s) does not divide them:\n  %s", shape, "\n  ".join(lines))
    else:
        logger.info("every sharded parameter dimension divides the mesh (%s)", shape)
    return lines


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


def multi_device_mesh() -> tuple[Mesh, Mapping] | None:
    """`current_mesh()` when its mesh spans more than one device, else None: on one device
    the code that maps over devices (`shard_map`, sharded layouts) runs as a plain call."""
    current = current_mesh()
    return current if current is not None and current[0].size > 1 else None


def compile_platform() -> str:
    """The platform being compiled for: the enclosing mesh's devices (so a deviceless TPU
    compile on a CPU host picks TPU code paths), else JAX's default backend."""
    current = _CURRENT.get()
    devices = getattr(current[0], "devices", None) if current else None
    if devices is not None and np.size(devices):
        return np.ravel(devices)[0].platform
    return jax.default_backend()


def one_cpu_device() -> bool:
    """Whether the program being traced runs on one CPU device (no mesh, or a mesh of one):
    where the CPU-only code paths apply (`models.llama.project`, `rl.logprobs`)."""
    return compile_platform() == "cpu" and multi_device_mesh() is None


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """Sharding constraint on an activation; a no-op outside `activation_sharding`."""
    current = _CURRENT.get()
    if current is None:
        return x
    mesh, rules = current
    return jax.lax.with_sharding_constraint(x, named_sharding(mesh, logical_axes, x.shape, rules))
