"""Run checkpoints: round trip with shardings, digests that catch every kind of damage,
fallback that moves a bad step aside (so it can be saved again), refusal of non-finite
weights, storage errors, a save cut off mid-way."""

import errno
import glob
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from sgs_jax.checkpoint import (INTEGRITY_KEY, CheckpointRestoreError, NonFiniteWeightsError, RunCheckpointer,
                                storage_errno, tree_digests)
from sgs_jax.faults import ENV, InjectedFault
from sgs_jax.models import abstract_model, create_model, tiny
from sgs_jax.parallel import make_mesh, state_shardings


def _abstract(config, mesh):
    _, state = abstract_model(config)
    shardings = state_shardings(state, mesh)
    return jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state, shardings)


def _like(tree):
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def test_round_trip_sharded(tmp_path):
    config = tiny()
    mesh = make_mesh(fsdp=2, tensor=2, data=2)
    model = create_model(config, seed=0, mesh=mesh)
    state = nnx.state(model)
    ckpt = RunCheckpointer(tmp_path / "ckpt")
    ckpt.save(3, {"solver": state}, {"iteration": 3, "generations": 1234})
    step, trees, meta = ckpt.restore_latest({"solver": _abstract(config, mesh)})
    assert step == 3 and meta == {"iteration": 3, "generations": 1234}  # the digests are not handed back
    for a, b in zip(jax.tree_util.tree_leaves(trees["solver"]), jax.tree_util.tree_leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding == b.sharding
    ckpt.close()


def test_digests_ignore_sharding_and_see_every_bit():
    x = jax.random.normal(jax.random.key(0), (16, 24), jnp.float32)
    mesh = make_mesh(fsdp=4, tensor=2, data=1)
    sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp", "tensor")))
    tree = {"x": x, "h": x.astype(jnp.bfloat16), "i": jnp.arange(7), "b": jnp.array([True, False])}
    digests, nonfinite = tree_digests(tree)
    assert nonfinite == [] and len(set(digests.values())) == 4
    assert tree_digests({**tree, "x": sharded})[0] == digests
    bits = np.asarray(x).view(np.uint32).copy()
    for index, bit in ((0, 0), (77, 31), (383, 12)):
        flipped = bits.copy()
        flipped.flat[index] ^= np.uint32(1 << bit)
        assert tree_digests({**tree, "x": jnp.asarray(flipped.view(np.float32))})[0]["['x']"] != digests["['x']"]
    swapped = np.asarray(x).copy()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]  # same values, other places
    assert tree_digests({**tree, "x": jnp.asarray(swapped)})[0]["['x']"] != digests["['x']"]
    assert tree_digests({"x": x.at[3, 4].set(jnp.inf)})[1] == ["['x']"]


def _two_steps(tmp_path, keep=3):
    tree = {"w": jax.random.normal(jax.random.key(1), (64, 64)), "b": jnp.ones(7, jnp.bfloat16)}
    ckpt = RunCheckpointer(tmp_path / "ckpt", keep=keep)
    ckpt.save(1, {"solver": tree}, {"iteration": 1})
    ckpt.save(2, {"solver": tree}, {"iteration": 2})
    return ckpt, tree


def _data_file(tmp_path, step):
    files = glob.glob(str(tmp_path / "ckpt" / str(step) / "solver" / "**" / "d" / "*"), recursive=True)
    return max(files, key=os.path.getsize)


def _flip(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(path, "wb").write(bytes(data))


def _edit_meta(tmp_path, step):
    path = tmp_path / "ckpt" / str(step) / "meta" / "metadata"
    path.write_text(path.read_text().replace('"iteration": 2', '"iteration": 3'))


DAMAGE = {
    "flip one bit": lambda t: _flip(_data_file(t, 2)),
    "truncate": lambda t: os.truncate(_data_file(t, 2), os.path.getsize(_data_file(t, 2)) // 2),
    "delete a data file": lambda t: os.remove(_data_file(t, 2)),
    "delete an item": lambda t: shutil.rmtree(t / "ckpt" / "2" / "solver"),
    "edit the metadata": lambda t: _edit_meta(t, 2),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_newest_is_moved_aside_and_can_be_saved_again(damage, tmp_path, caplog):
    ckpt, tree = _two_steps(tmp_path)
    ckpt.close()
    DAMAGE[damage](tmp_path)
    ckpt = RunCheckpointer(tmp_path / "ckpt", keep=3)
    with caplog.at_level("WARNING"):
        step, trees, meta = ckpt.restore_latest({"solver": _like(tree)})
    assert step == 1 and meta == {"iteration": 1}
    np.testing.assert_array_equal(np.asarray(trees["solver"]["w"]), np.asarray(tree["w"]))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("checkpoint step 2 is unreadable (") and "\n" not in warning and len(warning) < 300
    assert warning.endswith("moved it to ckpt/corrupt-2 and resumed from step 1")
    assert ckpt.steps() == [1] and sorted(os.listdir(tmp_path / "ckpt")) == ["1", "corrupt-2"]
    ckpt.save(2, {"solver": tree}, {"iteration": 2})  # orbax's StepAlreadyExistsError before
    assert ckpt.restore_latest({"solver": _like(tree)})[0] == 2
    ckpt.close()


def test_a_second_fallback_of_the_same_step_keeps_both_copies(tmp_path):
    ckpt, tree = _two_steps(tmp_path)
    for _ in range(2):
        _flip(_data_file(tmp_path, 2))
        assert ckpt.restore_latest({"solver": _like(tree)})[0] == 1
        ckpt.save(2, {"solver": tree}, {"iteration": 2})
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["1", "2", "corrupt-2", "corrupt-2.1"]
    ckpt.close()


def test_nothing_restorable_is_one_line_and_moves_nothing(tmp_path):
    ckpt, tree = _two_steps(tmp_path)
    _flip(_data_file(tmp_path, 1))
    _flip(_data_file(tmp_path, 2))
    with pytest.raises(CheckpointRestoreError) as err:
        ckpt.restore_latest({"solver": _like(tree)})
    assert "\n" not in str(err.value) and "step 2: digest mismatch" in str(err.value)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["1", "2"]
    ckpt.close()


def test_non_finite_weights_are_never_saved_nor_restored(tmp_path):
    ckpt, tree = _two_steps(tmp_path)
    bad = {**tree, "w": tree["w"].at[0, 0].set(jnp.nan)}
    with pytest.raises(NonFiniteWeightsError, match=r"solver\['w'\].*training diverged"):
        ckpt.save(3, {"solver": bad}, {"iteration": 3})
    assert ckpt.steps() == [1, 2]
    # A checkpoint written without digests (the older format) holding NaN is still refused.
    manager = ocp.CheckpointManager(tmp_path / "legacy", options=ocp.CheckpointManagerOptions(create=True))
    manager.save(1, args=ocp.args.Composite(solver=ocp.args.StandardSave(bad), meta=ocp.args.JsonSave({"iteration": 1})))
    manager.wait_until_finished()
    manager.close()
    with pytest.raises(CheckpointRestoreError, match="non-finite values in solver"):
        RunCheckpointer(tmp_path / "legacy").restore_latest({"solver": _like(tree)})
    ckpt.close()


def test_digests_are_stored_in_the_metadata(tmp_path):
    ckpt, tree = _two_steps(tmp_path)
    import json

    meta = json.loads((tmp_path / "ckpt" / "2" / "meta" / "metadata").read_text())
    assert set(meta[INTEGRITY_KEY]["trees"]["solver"]) == {"['b']", "['w']"}
    ckpt.close()


def test_a_save_cut_off_mid_way_is_invisible_and_cleaned(tmp_path, monkeypatch):
    ckpt, tree = _two_steps(tmp_path)
    monkeypatch.setenv(ENV, "checkpoint:raise")
    with pytest.raises(InjectedFault):
        ckpt.save(3, {"solver": tree}, {"iteration": 3})
    monkeypatch.delenv(ENV)
    assert glob.glob(str(tmp_path / "ckpt" / "3.orbax-checkpoint-tmp*"))
    reopened = RunCheckpointer(tmp_path / "ckpt", keep=3)
    assert reopened.steps() == [1, 2] and reopened.restore_latest({"solver": _like(tree)})[0] == 2
    reopened.save(3, {"solver": tree}, {"iteration": 3})
    assert reopened.steps() == [1, 2, 3]
    assert not glob.glob(str(tmp_path / "ckpt" / "*tmp*"))
    reopened.close()


def test_a_refused_write_is_an_oserror_naming_the_directory(tmp_path, monkeypatch):
    ckpt, tree = _two_steps(tmp_path)
    monkeypatch.setenv(ENV, "checkpoint:enospc")
    with pytest.raises(OSError) as err:
        ckpt.save(3, {"solver": tree}, {"iteration": 3})
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "ckpt")
    ckpt.close()


def test_storage_errno_reads_chains_and_tensorstore_text():
    assert storage_errno(ValueError("write failed: [OS error: No space left on device]")) == errno.ENOSPC
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as outer:
        assert storage_errno(outer) == errno.EROFS
    assert storage_errno(ValueError("shape mismatch")) is None


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep"):
        RunCheckpointer(tmp_path / "c", keep=0)


def test_empty_directory_restores_nothing(tmp_path):
    assert RunCheckpointer(tmp_path / "none").restore_latest({}) is None
