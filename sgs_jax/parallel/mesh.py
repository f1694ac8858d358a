"""Device mesh construction: axes `data`, `fsdp`, `tensor`, in the hardware's device order.

Device order matters on TPUs and multi-node GPU clusters: neighbouring positions on the
`tensor` and `fsdp` axes should be neighbouring chips (ICI / NVLink), and only the outer
axis should cross slices or hosts (DCN). `device_grid` uses JAX's `mesh_utils`:
  - one TPU slice (any number of hosts): `create_device_mesh` (physical torus order);
  - several TPU slices: `create_hybrid_device_mesh`, slices over `data` (else `fsdp`);
  - several GPU (or CPU) processes: `create_hybrid_device_mesh` with each process as a
    granule, processes over `data` (else `fsdp`);
  - one process of GPUs: `create_device_mesh` (device-id order).
`split_devices` divides the devices between two sub-meshes (`roles.placement=split`: the
Guide's or the Conjecturer's and the Solver's), the same number from every process.

Row-major order is used only where no topology exists (simulated CPU devices, one device)
or where `mesh_utils` cannot place the requested devices (an irregular subset of a slice),
and then it is logged.
"""

from __future__ import annotations

import logging
import math
from typing import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

MESH_AXES = ("data", "fsdp", "tensor")

log = logging.getLogger(__name__)


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


def _granules(devices: Sequence[jax.Device]) -> tuple[str | None, int]:
    """('slice_index' | 'process_index' | None, count): what divides `devices` into DCN
    granules (TPU slices, or processes of GPUs / CPUs), if more than one."""
    if devices[0].platform == "tpu":
        slices = {getattr(d, "slice_index", 0) for d in devices}
        return ("slice_index", len(slices)) if len(slices) > 1 else (None, 1)
    processes = {d.process_index for d in devices}
    return ("process_index", len(processes)) if len(processes) > 1 else (None, 1)


def _dcn_split(shape: tuple[int, int, int], granules: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(per-granule shape, across-granule shape): granules over `data`, else over `fsdp`."""
    data, fsdp, tensor = shape
    if data % granules == 0:
        return (data // granules, fsdp, tensor), (granules, 1, 1)
    if fsdp % granules == 0:
        return (data, fsdp // granules, tensor), (1, granules, 1)
    raise ValueError(
        f"mesh data={data} fsdp={fsdp} tensor={tensor} cannot span {granules} slices/processes: "
        f"data or fsdp must be a multiple of {granules} (tensor stays within one)"
    )


def device_grid(shape: tuple[int, int, int], devices: Sequence[jax.Device]) -> tuple[np.ndarray, str]:
    """(devices arranged as `shape`, how the order was chosen); see the module docstring."""
    devices = list(devices)
    if len(devices) == 1 or (devices[0].platform == "cpu" and len({d.process_index for d in devices}) == 1):
        return np.asarray(devices).reshape(shape), "row-major (simulated CPU devices have no topology)"
    attr, count = _granules(devices)
    if attr is not None:
        ici, dcn = _dcn_split(shape, count)
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=attr == "process_index")
        return grid, f"hybrid: {count} {'slices' if attr == 'slice_index' else 'processes'} over DCN, {ici} within each"
    try:
        return mesh_utils.create_device_mesh(shape, devices), "mesh_utils.create_device_mesh (physical order)"
    except (ValueError, NotImplementedError, AssertionError) as err:
        # e.g. 3 of a slice's 4 chips: no physical sub-mesh exists (mesh_utils asserts).
        return np.asarray(devices).reshape(shape), f"row-major: mesh_utils cannot place these {len(devices)} devices ({err})"


def mesh_and_order(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> tuple[Mesh, str]:
    """(`make_mesh`'s mesh, how its device order was chosen)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(data, fsdp, tensor, len(devices))
    grid, how = device_grid(shape, devices)
    report = log.warning if how.startswith("row-major: mesh_utils") else log.debug
    report("mesh %s over %d %s devices: %s", dict(zip(MESH_AXES, shape)), len(devices), devices[0].platform, how)
    return Mesh(grid, MESH_AXES), how


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices), in the hardware's
    device order (`device_grid`). `tensor` varies fastest, so tensor-parallel groups are
    neighbouring devices."""
    return mesh_and_order(data, fsdp, tensor, devices)[0]


def mesh_from_config(mesh_config, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Build from a config with fields data, fsdp, tensor (ml_collections or dict)."""
    get = mesh_config.get if hasattr(mesh_config, "get") else lambda k, d: getattr(mesh_config, k, d)
    return make_mesh(get("data", 1), get("fsdp", -1), get("tensor", 1), devices)


def split_devices(devices: Sequence[jax.Device], count: int) -> tuple[list[jax.Device], list[jax.Device]]:
    """(the rest, `count` devices) of `devices`: the last `count / P` of each of the P
    processes' devices (in device-id order), so every process holds devices of both
    sub-meshes and owns rows of both (the data-in rule of `parallel.global_arrays`), and
    each part is a whole number of devices per process (a hybrid mesh over processes needs
    that). Raises ValueError with the numbers when `count` is not a multiple of P or would
    leave a process without devices for the rest."""
    by_process: dict[int, list[jax.Device]] = {}
    for device in sorted(devices, key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(device.process_index, []).append(device)
    processes = len(by_process)
    if count <= 0 or count % processes:
        raise ValueError(f"{count} devices cannot be taken evenly from {processes} processes: use a positive multiple of {processes}")
    per_process = count // processes
    local = min(len(d) for d in by_process.values())
    if per_process >= local:
        raise ValueError(f"{count} devices ({per_process} per process) leave no device of the {local} per process for the rest")
    rest, taken = [], []
    for process in sorted(by_process):
        mine = by_process[process]
        rest += mine[: len(mine) - per_process]
        taken += mine[len(mine) - per_process :]
    return rest, taken
