"""Where weights live: one jitted cast-and-reshard between layouts, and host offload.

`cast_and_shard` turns a parameter state into another dtype and layout in one compiled
program (out_shardings = the target layout's): the trainer's fp32 FSDP master weights
become the rollout engine's bf16 copy, replicated over data and fsdp. The cast runs on the
source shards first, so the reshard moves the target dtype's bytes (half of fp32's for bf16).

`to_memory` moves arrays between device memory and pinned host memory (the memory kinds
of `jax.sharding`), for roles that sit idle between phases (`roles.offload_idle`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from sgs_jax.parallel.rules import state_shardings

DEVICE = "device"
HOST = "pinned_host"


def _target_dtype(x, dtype) -> jnp.dtype:
    """Floating leaves take `dtype`; others (none in the model today) keep theirs."""
    return jnp.dtype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype


def in_form(state: Any, dtype, shardings: Any) -> bool:
    """Whether every leaf of `state` already has `dtype` and its sharding in `shardings`."""
    pairs = zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(shardings))
    return all(
        isinstance(x, jax.Array)
        and x.dtype == _target_dtype(x, dtype)
        and x.sharding.is_equivalent_to(s, x.ndim)
        and x.sharding.memory_kind in (None, DEVICE)
        for x, s in pairs
    )


@functools.lru_cache(maxsize=None)
def _program(treedef, in_shardings: tuple, out_shardings: tuple, dtypes: tuple):
    """The compiled cast-and-reshard of one (structure, source layout, target form)."""

    def cast(leaves):
        # Pin the cast to the source layout, so it runs on the shards before any movement.
        return [jax.lax.with_sharding_constraint(x.astype(d), s) for x, d, s in zip(leaves, dtypes, in_shardings)]

    return jax.jit(cast, in_shardings=(list(in_shardings),), out_shardings=list(out_shardings))


def cast_and_shard(state: Any, mesh: Mesh, dtype, rules) -> Any:
    """`state` (parameter arrays on `mesh`) in `dtype` and the layout `rules` give, made by one
    jitted program; `state` itself when it is already in that form (no copy).

    A new state (new buffers) otherwise: `state` is untouched and stays valid. Parameter
    dimensions as in `parallel.rules.PARAM_LOGICAL_AXES`; floating leaves are cast.
    """
    target = state_shardings(state, mesh, rules)
    if in_form(state, dtype, target):
        return state
    leaves, treedef = jax.tree_util.tree_flatten(state)
    program = _program(
        treedef,
        tuple(x.sharding for x in leaves),
        tuple(jax.tree_util.tree_leaves(target)),
        tuple(_target_dtype(x, dtype) for x in leaves),
    )
    return jax.tree_util.tree_unflatten(treedef, program(leaves))


def supports_host_memory(mesh: Mesh) -> bool:
    """Whether every device of `mesh` has a pinned host memory space (TPU, GPU, CPU do in
    current jaxlib releases)."""
    for device in mesh.devices.flat:
        try:
            kinds = {m.kind for m in device.addressable_memories()}
        except (AttributeError, NotImplementedError, RuntimeError):
            return False
        if HOST not in kinds:
            return False
    return True


def to_memory(tree: Any, kind: str) -> Any:
    """`tree`'s arrays in memory `kind` (DEVICE or HOST), same layout; leaves already there
    are returned as they are. The old buffers are released when nothing else holds them."""
    if kind not in (DEVICE, HOST):
        raise ValueError(f"memory kind must be {DEVICE!r} or {HOST!r}, got {kind!r}")

    def move(x):
        if not isinstance(x, jax.Array) or (x.sharding.memory_kind or DEVICE) == kind:
            return x
        return jax.device_put(x, x.sharding.with_memory_kind(kind))

    return jax.tree_util.tree_map(move, tree)


def memory_kinds(tree: Any) -> set[str]:
    """The memory kinds `tree`'s arrays live in (for tests and logs)."""
    return {x.sharding.memory_kind or DEVICE for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array)}
