"""`to_global` on one process: one `device_put` of the whole tree, the same arrays (values,
dtypes, shardings) as the per-process path that several processes take."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from sgs_jax.parallel import global_arrays
from sgs_jax.parallel.mesh import make_mesh


def test_one_process_places_the_tree_as_the_per_process_path_does(monkeypatch):
    if jax.device_count() < 2:
        pytest.skip("needs several (simulated) devices")
    mesh = make_mesh(data=1, fsdp=2, tensor=1, devices=jax.devices()[:2])
    rows, whole = NamedSharding(mesh, PartitionSpec(("data", "fsdp"))), NamedSharding(mesh, PartitionSpec())
    tree = {"ids": np.arange(12, dtype=np.int32).reshape(4, 3), "mask": np.ones((4, 3), bool), "scale": np.array([0.5, 0.25], np.float32)}
    shardings = {"ids": rows, "mask": rows, "scale": whole}
    fast = global_arrays.to_global(tree, shardings)
    monkeypatch.setattr(global_arrays.jax, "process_count", lambda: 2)  # the per-process path
    slow = global_arrays.to_global(tree, shardings)
    for name in tree:
        assert fast[name].sharding == slow[name].sharding == shardings[name]
        assert fast[name].dtype == slow[name].dtype
        np.testing.assert_array_equal(np.asarray(fast[name]), np.asarray(slow[name]))
        np.testing.assert_array_equal(np.asarray(fast[name]), np.asarray(tree[name]))
