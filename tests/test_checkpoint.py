"""Run checkpoints: round trip with shardings, resume from the newest, skip a corrupted one."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sgs_jax.checkpoint import CheckpointRestoreError, RunCheckpointer
from sgs_jax.models import abstract_model, create_model, tiny
from sgs_jax.parallel import make_mesh, state_shardings


def _abstract(config, mesh):
    _, state = abstract_model(config)
    shardings = state_shardings(state, mesh)
    return jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state, shardings)


def test_round_trip_sharded(tmp_path):
    config = tiny()
    mesh = make_mesh(fsdp=2, tensor=2, data=2)
    model = create_model(config, seed=0, mesh=mesh)
    state = nnx.state(model)
    ckpt = RunCheckpointer(tmp_path / "ckpt")
    ckpt.save(3, {"solver": state}, {"iteration": 3, "generations": 1234})
    step, trees, meta = ckpt.restore_latest({"solver": _abstract(config, mesh)})
    assert step == 3 and meta == {"iteration": 3, "generations": 1234}
    for a, b in zip(jax.tree_util.tree_leaves(trees["solver"]), jax.tree_util.tree_leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding == b.sharding
    ckpt.close()


def test_corrupted_latest_falls_back_to_previous(tmp_path):
    config = tiny()
    mesh = make_mesh(fsdp=-1)
    state = nnx.state(create_model(config, seed=0))
    ckpt = RunCheckpointer(tmp_path / "ckpt", keep=3)
    ckpt.save(1, {"solver": state}, {"iteration": 1})
    ckpt.save(2, {"solver": state}, {"iteration": 2})
    # Damage step 2: remove its parameter data.
    step_dir = tmp_path / "ckpt" / "2" / "solver"
    shutil.rmtree(step_dir)
    step, _, meta = ckpt.restore_latest({"solver": _abstract(config, mesh)})
    assert step == 1 and meta["iteration"] == 1
    shutil.rmtree(tmp_path / "ckpt" / "1" / "solver")
    with pytest.raises(CheckpointRestoreError, match="no checkpoint"):
        ckpt.restore_latest({"solver": _abstract(config, mesh)})


def test_empty_directory_restores_nothing(tmp_path):
    assert RunCheckpointer(tmp_path / "none").restore_latest({}) is None
