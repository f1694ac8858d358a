"""Mesh construction, logical-axis sharding rules and multi-host set-up."""

from sgs_jax.parallel.distributed import maybe_initialize_distributed
from sgs_jax.parallel.mesh import MESH_AXES, make_mesh, mesh_from_config, resolve_mesh_shape
from sgs_jax.parallel.rules import (
    INFERENCE_RULES,
    LAYOUTS,
    RULES,
    activation_sharding,
    constrain,
    layout_rules,
    logical_to_spec,
    named_sharding,
    state_shardings,
)

__all__ = [
    "INFERENCE_RULES",
    "LAYOUTS",
    "MESH_AXES",
    "RULES",
    "activation_sharding",
    "constrain",
    "layout_rules",
    "logical_to_spec",
    "make_mesh",
    "maybe_initialize_distributed",
    "mesh_from_config",
    "named_sharding",
    "resolve_mesh_shape",
    "state_shardings",
]
