"""Mesh device order: JAX's mesh_utils on TPU topologies (one slice, several slices), plain
order only where no topology exists, and a logged fallback for irregular device sets."""

import logging

import jax
import pytest
from jax.experimental import mesh_utils

from sgs_jax.parallel.mesh import device_grid, make_mesh, mesh_and_order
from tests.parallel.tpu_support import tpu_devices


def test_simulated_cpu_devices_keep_their_order():
    mesh, how = mesh_and_order(data=2, fsdp=2, tensor=2)
    assert list(mesh.devices.flat) == jax.devices()[:8]
    assert how.startswith("row-major (simulated CPU")


def test_tpu_slice_uses_the_physical_order():
    devices = tpu_devices("v5p:2x4x4")  # 32 chips, 8 hosts
    mesh, how = mesh_and_order(data=1, fsdp=8, tensor=4, devices=devices)
    assert how.startswith("mesh_utils.create_device_mesh")
    assert (mesh.devices == mesh_utils.create_device_mesh((1, 8, 4), devices)).all()
    # Tensor-parallel groups are physical neighbours: one coordinate apart, or a torus wrap.
    for group in mesh.devices.reshape(-1, 4):
        coords = [tuple(d.coords) for d in group]
        assert all(sum(a != b for a, b in zip(x, y)) == 1 for x, y in zip(coords, coords[1:]))


def test_several_slices_meet_over_dcn_on_the_data_axis():
    devices = tpu_devices("v5p:2x2x1", num_slices=2)
    mesh, how = mesh_and_order(data=2, fsdp=4, tensor=1, devices=devices)
    assert how.startswith("hybrid: 2 slices")
    assert [{d.slice_index for d in row.flat} for row in mesh.devices] == [{0}, {1}]
    mesh, _ = mesh_and_order(data=1, fsdp=8, tensor=1, devices=devices)  # no data axis: fsdp crosses DCN
    assert {d.slice_index for d in mesh.devices[0, :4, 0]} == {0}
    with pytest.raises(ValueError, match="cannot span 2 slices"):
        make_mesh(data=1, fsdp=1, tensor=8, devices=devices)


def test_irregular_devices_fall_back_and_say_so(caplog):
    devices = tpu_devices("v5p:2x2x1")[:3]
    with caplog.at_level(logging.WARNING):
        grid, how = device_grid((1, 3, 1), devices)
        make_mesh(data=1, fsdp=3, tensor=1, devices=devices)
    assert how.startswith("row-major: mesh_utils cannot place these 3 devices")
    assert list(grid.flat) == list(devices)
    assert any("row-major: mesh_utils" in r.message for r in caplog.records)
