"""Device mesh construction: axes `data`, `fsdp`, `tensor`."""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

MESH_AXES = ("data", "fsdp", "tensor")


def resolve_mesh_shape(data: int = 1, fsdp: int = -1, tensor: int = 1, num_devices: int | None = None) -> tuple[int, int, int]:
    """Sizes of (data, fsdp, tensor); at most one may be -1, meaning "all remaining devices"."""
    num_devices = jax.device_count() if num_devices is None else num_devices
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got data={data} fsdp={fsdp} tensor={tensor}")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh axis sizes must be positive or -1, got {sizes}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ValueError(f"{num_devices} devices cannot be split into mesh {sizes}")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, have {num_devices}")
    return tuple(sizes)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices).

    `tensor` is the fastest-varying axis so tensor-parallel groups sit on neighbouring
    devices (the fastest links on TPU slices and GPU nodes).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(data, fsdp, tensor, len(devices))
    try:
        device_grid = jax.experimental.mesh_utils.create_device_mesh(shape, devices=devices)
    except Exception:  # simulated or irregular topologies: plain row-major order
        device_grid = np.asarray(devices).reshape(shape)
    return Mesh(device_grid, MESH_AXES)


def mesh_from_config(mesh_config) -> Mesh:
    """Build from a config with fields data, fsdp, tensor (ml_collections or dict)."""
    get = mesh_config.get if hasattr(mesh_config, "get") else lambda k, d: getattr(mesh_config, k, d)
    return make_mesh(get("data", 1), get("fsdp", -1), get("tensor", 1))
