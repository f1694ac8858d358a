"""Role placement (`roles.placement`): the config's checks, the device split, the Guide on a
sub-mesh of its own (weights, Sampler, offload leaves it alone), and a split run of the
testbed loop equal to the shared one.

8 simulated CPU devices (tests/conftest.py); random nano checkpoints (tests/sgs/conftest.py)
except in the run comparison (the packaged testbed models, so the Solver trains).
"""

import dataclasses
import json
import threading

import jax
import numpy as np
import pytest
from flax import nnx

from sgs_jax.config import ConfigError, load_config
from sgs_jax.parallel.mesh import split_devices
from sgs_jax.parallel.placement import DEVICE, HOST, memory_kinds
from sgs_jax.rl.train_step import Trainer
from sgs_jax.sampling import SamplingParams
from sgs_jax.sgs import bootstrap
from sgs_jax.sgs.phases import PhaseContext
from sgs_jax.sgs.roles import CONJECTURER, GUIDE, SOLVER, build_roles, role_meshes
from sgs_jax.sgs.run import SGSRun
from tests.sgs.run_support import CONFIGS, small_run_overrides

TESTBED = str(CONFIGS / "sgs.py:testbed")
SPLIT = ["--config.roles.placement=split", "--config.roles.guide_devices=4"]


def _config(models, tmp_path, *extra):
    return load_config(TESTBED, small_run_overrides(models, tmp_path / "run") + list(extra))


# ---- the config ------------------------------------------------------------------------------

BAD_STATIC = [
    (["--config.roles.placement=apart"], r"roles.placement must be one of \('shared', 'split'\)"),
    (["--config.roles.guide_devices=2"], r"roles.guide_devices=2 needs roles.placement='split'"),
    (["--config.roles.conjecturer_devices=2"], r"roles.conjecturer_devices=2 needs roles.placement='split'"),
    (["--config.roles.placement=split"], "roles.placement='split' needs roles.guide_devices or roles.conjecturer_devices positive"),
    (["--config.roles.placement=split", "--config.roles.guide_devices=-2"], "roles.guide_devices must be >= 0"),
    (SPLIT + ["--config.sgs.use_guide=false"], "roles.guide_devices=4 gives the Guide its own devices, but this experiment"),
    (SPLIT[:1] + ["--config.roles.guide_devices=3", "--config.mesh.tensor=2"], "roles.guide_devices=3 must be a multiple of mesh.tensor=2"),
    (SPLIT[:1] + ["--config.roles.conjecturer_devices=3", "--config.mesh.tensor=2"],
     "roles.conjecturer_devices=3 must be a multiple of mesh.tensor=2"),
    (SPLIT[:1] + ["--config.roles.conjecturer_devices=2", "--config.sgs.use_conjecturer=false"],
     "roles.conjecturer_devices=2 gives the Conjecturer its own devices, but this experiment has no Conjecturer"),
    (SPLIT[:1] + ["--config.roles.conjecturer_devices=2", "--config.model.parameter_sharing=true"],
     "roles.conjecturer_devices=2: with model.parameter_sharing the Conjecturer is the Solver's own weights"),
    (SPLIT + ["--config.mesh.tensor=-1", "--config.mesh.fsdp=1"], "mesh.tensor=-1: roles.placement='split' needs an explicit"),
]


@pytest.mark.parametrize("overrides,match", BAD_STATIC, ids=[" ".join(o) for o, _ in BAD_STATIC])
def test_bad_placement_fails_in_validate_naming_the_field(random_checkpoints, tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        _config(random_checkpoints, tmp_path, *overrides)


# On the 8 devices of one process: what only the devices can tell, before any work.
BAD_DEVICES = [
    (["--config.roles.guide_devices=8"], "roles.guide_devices=8 of the 8 devices left for it: 8 devices .8 per process. leave no device"),
    (["--config.roles.guide_devices=4", "--config.roles.conjecturer_devices=4"],
     "roles.conjecturer_devices=4 of the 4 devices left for it: 4 devices .4 per process. leave no device"),
    (["--config.roles.conjecturer_devices=3"], r"roles.conjecturer_devices=3, the Conjecturer's sub-mesh \{'data': 1, 'fsdp': 3, 'tensor': 1\}: "
                                                "sampling.max_batch=16 rows do not split"),
    (["--config.roles.conjecturer_devices=4", "--config.conjecturer_train.micro_batch_size=2",
      "--config.conjecturer_train.batch_size=8"],
     r"the Conjecturer's sub-mesh \{'data': 1, 'fsdp': 4, 'tensor': 1\}: conjecturer_train.micro_batch_size=2 rows do not split"),
    (["--config.roles.guide_devices=3"], r"roles.guide_devices=3, the Guide's sub-mesh \{'data': 3, 'fsdp': 1, 'tensor': 1\}: sampling.max_batch=16 rows "
                                         r"do not split .* use a multiple of 3 \(e.g. 18\)"),
    (["--config.roles.guide_devices=2"], r"the Solver's sub-mesh \{'data': 1, 'fsdp': 6, 'tensor': 1\}: sampling.max_batch=16"),
    (["--config.roles.guide_devices=4", "--config.mesh.fsdp=3"], r"mesh.data / mesh.fsdp / mesh.tensor: the Solver's sub-mesh has the 4 "
                                                                 "devices roles.guide_devices=4 leaves"),
    (["--config.roles.guide_devices=4", "--config.sampling.max_batch=20", "--config.solver_train.micro_batch_size=2",
      "--config.solver_train.batch_size=16"], "solver_train.micro_batch_size=2 rows do not split"),
]


@pytest.mark.parametrize("overrides,match", BAD_DEVICES, ids=[" ".join(o) for o, _ in BAD_DEVICES])
def test_bad_split_fails_before_any_work_with_the_numbers(random_checkpoints, tmp_path, overrides, match):
    cfg = _config(random_checkpoints, tmp_path, SPLIT[0], *overrides)
    with pytest.raises(ConfigError, match=match):
        role_meshes(cfg)
    with pytest.raises(ConfigError, match=match):
        SGSRun(cfg)
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


@dataclasses.dataclass(frozen=True)
class _Device:
    id: int
    process_index: int


def test_split_takes_the_same_devices_from_every_process():
    devices = [_Device(i, i // 4) for i in range(8)]  # 2 processes x 4
    rest, taken = split_devices(devices[::-1], 4)  # any input order: by (process, id)
    assert [d.id for d in taken] == [2, 3, 6, 7] and [d.id for d in rest] == [0, 1, 4, 5]
    with pytest.raises(ValueError, match="3 devices cannot be taken evenly from 2 processes"):
        split_devices(devices, 3)


def test_shared_meshes_are_the_run_mesh(random_checkpoints, tmp_path):
    meshes = role_meshes(_config(random_checkpoints, tmp_path))
    assert meshes.guide is None and dict(meshes.train.shape) == {"data": 1, "fsdp": 8, "tensor": 1}


# ---- the Guide on its own sub-mesh -----------------------------------------------------------


def _split_roles(cfg, tmp_path):
    meshes = role_meshes(cfg)
    base, guide = bootstrap.initial_models(cfg, bootstrap.load_role_tokenizer(cfg), meshes.train, str(tmp_path), meshes.guide)
    conj_base = None if meshes.conjecturer is None else bootstrap.load_model(cfg, cfg.model.checkpoint, meshes.conjecturer)
    return build_roles(cfg, base, guide, meshes, conj_base), meshes


def test_split_places_the_guide_on_its_devices_and_offload_leaves_it(random_checkpoints, tmp_path):
    cfg = _config(random_checkpoints, tmp_path, *SPLIT, "--config.mesh.tensor=2", "--config.roles.offload_idle=true")
    roles, meshes = _split_roles(cfg, tmp_path)
    assert dict(meshes.guide.shape) == {"data": 2, "fsdp": 1, "tensor": 2}
    assert dict(meshes.train.shape) == {"data": 1, "fsdp": 2, "tensor": 2}
    guide_devices, train_devices = set(meshes.guide.devices.flat), set(meshes.train.devices.flat)
    assert not guide_devices & train_devices and len(guide_devices | train_devices) == 8
    guide = roles.frozen[GUIDE]
    assert all(x.sharding.mesh == meshes.guide for x in jax.tree_util.tree_leaves(guide))
    assert all(x.sharding.mesh == meshes.train for x in jax.tree_util.tree_leaves(roles.solver.params))
    state = lambda t: (t.params, t.opt_state)  # noqa: E731
    with roles.training(SOLVER):  # the Solver's phase parks the Conjecturer, not the Guide
        assert memory_kinds(state(roles.conjecturer)) == {HOST} and memory_kinds(roles.frozen[GUIDE]) == {DEVICE}
        with roles.rollout_weights(GUIDE) as weights:  # the Guide's phase moves nothing of the trainers'
            assert weights is guide
            assert memory_kinds(state(roles.solver)) == {DEVICE} and memory_kinds(state(roles.conjecturer)) == {HOST}
    with roles.rollout_weights(SOLVER):
        assert memory_kinds(roles.frozen[GUIDE]) == {DEVICE}


APART = SPLIT[:1] + ["--config.roles.guide_devices=2", "--config.roles.conjecturer_devices=2"]  # Solver 4, Guide 2, Conjecturer 2


def test_split_places_the_conjecturer_trainer_on_its_devices_and_offload_leaves_it(random_checkpoints, tmp_path):
    """Guide on 2 devices, the Conjecturer's trainer on 2 (fsdp), the Solver on the other 4:
    the Conjecturer's weights, optimizer state and export live on its sub-mesh, and with
    offload_idle no phase parks them (its devices hold nothing else) while the Solver's
    own phases still park the Solver."""
    cfg = _config(random_checkpoints, tmp_path, *APART, "--config.roles.offload_idle=true")
    roles, meshes = _split_roles(cfg, tmp_path)
    assert dict(meshes.conjecturer.shape) == {"data": 1, "fsdp": 2, "tensor": 1}
    assert dict(meshes.guide.shape) == {"data": 2, "fsdp": 1, "tensor": 1}
    assert dict(meshes.train.shape) == {"data": 1, "fsdp": 4, "tensor": 1}
    parts = [set(m.devices.flat) for m in (meshes.train, meshes.guide, meshes.conjecturer)]
    assert sum(map(len, parts)) == len(set().union(*parts)) == 8
    on = lambda tree, mesh: all(x.sharding.mesh == mesh for x in jax.tree_util.tree_leaves(tree))  # noqa: E731
    conj, solver = roles.conjecturer, roles.solver
    assert on(conj.params, meshes.conjecturer) and on(conj.opt_state, meshes.conjecturer) and conj.mesh == meshes.conjecturer
    assert on(solver.params, meshes.train) and set(roles.own_meshes) == {GUIDE, CONJECTURER}
    state = lambda t: (t.params, t.opt_state)  # noqa: E731
    with roles.training(SOLVER):
        assert memory_kinds(state(solver)) == {DEVICE} and memory_kinds(state(conj)) == {DEVICE}
    with roles.rollout_weights(CONJECTURER) as weights:  # the Conjecturer's phase moves nothing of the Solver's
        assert on(weights, meshes.conjecturer) and memory_kinds(state(solver)) == {DEVICE}
    with roles.training(CONJECTURER):
        assert memory_kinds(state(solver)) == {DEVICE}
    with roles.rollout_weights(SOLVER):  # the Solver's sampling parks its own optimizer state, not the Conjecturer
        assert memory_kinds(solver.opt_state) == {HOST} and memory_kinds(state(conj)) == {DEVICE}


def test_a_frozen_conjecturer_on_its_own_devices_holds_the_base_there(random_checkpoints, tmp_path):
    cfg = _config(random_checkpoints, tmp_path, *APART, "--config.sgs.train_conjecturer=false")
    roles, meshes = _split_roles(cfg, tmp_path)
    assert roles.conjecturer is None and set(roles.own_meshes) == {GUIDE, CONJECTURER}
    frozen = roles.frozen[CONJECTURER]
    assert all(x.sharding.mesh == meshes.conjecturer and x.dtype == np.dtype("bfloat16") for x in jax.tree_util.tree_leaves(frozen))
    with pytest.raises(ValueError, match="needs conjecturer_base on it, and only then"):
        build_roles(cfg, bootstrap.load_model(cfg, cfg.model.checkpoint, meshes.train), None, meshes)


def test_the_guide_samples_on_its_sampler_as_on_the_shared_one(random_checkpoints, tmp_path):
    """The same Guide weights, prompts and seed give the same tokens on its own 4 devices as
    on all 8 (one Sampler per mesh: programs are compiled for one)."""
    from sgs_jax.sampling import Sampler

    cfg = _config(random_checkpoints, tmp_path, *SPLIT)
    roles, meshes = _split_roles(cfg, tmp_path)
    shared_mesh = role_meshes(_config(random_checkpoints, tmp_path)).train
    shared_guide = bootstrap.load_inference_weights(cfg, str(random_checkpoints / "guide"), shared_mesh)
    config = roles.solver.model.config
    ctx = PhaseContext.from_config(cfg, Sampler.from_config(cfg, config, meshes.train), None, None, None,
                                   {GUIDE: Sampler.from_config(cfg, config, meshes.guide)})
    assert ctx.for_role(SOLVER) is ctx and ctx.for_role(GUIDE).sampler.mesh == meshes.guide
    params = SamplingParams(max_new_tokens=10, num_samples=2, max_total_len=64, seed=5)
    prompts = [[1, 40, 41, 42], [1, 50], [1, 7, 8]]
    own = ctx.for_role(GUIDE).sampler.generate(roles.frozen[GUIDE], prompts, params)
    everywhere = Sampler.from_config(cfg, config, shared_mesh).generate(shared_guide, prompts, params)
    np.testing.assert_array_equal(own.token_ids, everywhere.token_ids)
    np.testing.assert_allclose(own.logprobs, everywhere.logprobs, rtol=1e-5, atol=1e-6)


# ---- a split run equals the shared run -------------------------------------------------------

TRAINER_FLOATS = ("solver/loss", "solver/grad_norm", "conjecturer/loss", "conjecturer/grad_norm")
TIMINGS = ("iteration/seconds", "throughput/generations_per_second", "verify/seconds")


@pytest.mark.slow  # three 2-iteration runs of the packaged testbed models: ~45 s each on 2 cores
def test_split_runs_equal_the_shared_run(tmp_path, monkeypatch):
    """The testbed `sgs` config for 2 iterations, shared on 8
    devices, split with the Guide on 4 (the Solver and Conjecturer on fsdp=4), and split
    three ways (Guide 2, Conjecturer 2, Solver 4): metrics (same names in the same order),
    target state, examples and final weights are equal; the Solver's training ran in a
    worker thread while the Guide sampled, and the Conjecturer's own sub-mesh trained in
    another beside the Solver. Exact except floats whose reduction spans a different
    number of devices: the trainers' loss / grad norm (fsdp=8 vs 4 or 2 gradient sums) and
    the Solver's mean entropy (its sampler splits 16 slots over 8 vs 4 devices) within
    1e-5 relative (measured ~2e-7); the final weights: fewer than 0.1% of the elements
    differ by more than 1e-6 and none by more than a third of one Adam step (lr / 3):
    Adam divides each element's gradient by its own scale, so an element whose gradient is
    near zero moves by up to lr on reduction noise alone (measured: 2.5e-5 at most). The
    sampled tokens, and so every count, proof and conjecture, are equal."""
    from sgs_jax.sgs.testbed_pretrain import MODELS_DIR

    threads = []
    real = Trainer.train_epoch

    def recorded(self, examples, seed=0):
        threads.append(threading.current_thread().name)
        return real(self, examples, seed=seed)

    monkeypatch.setattr(Trainer, "train_epoch", recorded)
    out = {}
    for name, extra in (("shared", []), ("split", SPLIT), ("apart", APART)):
        threads.clear()
        # k = 4 and 128-token conjectures: the Solver steps in both iterations, the Conjecturer in the first
        cfg = _config(MODELS_DIR, tmp_path / name, "--config.sgs.proofs_per_problem=4", "--config.run.compile_cache_dir=off",
                      "--config.sampling.conjecturer_max_new_tokens=128", *extra)
        run = SGSRun(cfg)
        try:
            run.run(iterations=2)
            weights = {role: jax.tree_util.tree_map(np.asarray, nnx.state(t.model)) for role, t in run.roles.trainable().items()}
        finally:
            run.close()
        workdir = tmp_path / name / "run"
        out[name] = dict(weights=weights, threads=list(threads),
                         metrics=[json.loads(line) for line in open(workdir / "metrics.jsonl")],
                         targets=json.load(open(workdir / "targets_state.json")),
                         examples=open(workdir / "examples.jsonl").read())
    shared = out["shared"]
    assert all(t == "MainThread" for t in shared["threads"])
    assert any(t.startswith("sgs-train-solver") for t in out["split"]["threads"])  # the Solver trained beside the Guide
    assert not any(t.startswith("sgs-train-conjecturer") for t in out["split"]["threads"])
    assert any(t.startswith("sgs-train-conjecturer") for t in out["apart"]["threads"])  # ... and the Conjecturer beside it
    lr = cfg.solver_train.lr  # the testbed's 3e-4, both roles
    for name in ("split", "apart"):
        split = out[name]
        assert split["targets"] == shared["targets"] and split["examples"] == shared["examples"], name
        assert len(split["metrics"]) == len(shared["metrics"])
        steps = {"solver": 0, "conjecturer": 0}
        for a, b in zip(shared["metrics"], split["metrics"]):
            assert a.get("values") == b.get("values") and list(a.get("scalars", {})) == list(b.get("scalars", {}))
            for key, x in a.get("scalars", {}).items():
                y = b["scalars"][key]
                if key in TIMINGS or x == y:
                    continue
                assert key in TRAINER_FLOATS or key == "solver/entropy", (name, a["step"], key, x, y)
                assert abs(x - y) <= 1e-5 * max(abs(x), abs(y)), (name, a["step"], key, x, y)
            for role in steps:
                steps[role] += "scalars" in a and a["step"] > 0 and a["scalars"].get(f"{role}/optimizer_steps", 0) > 0
        assert steps["solver"] == 2 and steps["conjecturer"] >= 1, steps  # the comparison covers both trainers' training
        assert shared["weights"].keys() == split["weights"].keys()
        for role in shared["weights"]:
            pairs = zip(jax.tree_util.tree_leaves(shared["weights"][role]), jax.tree_util.tree_leaves(split["weights"][role]))
            diff = np.concatenate([np.abs(x - y).ravel() for x, y in pairs])
            far = float(np.mean(diff > 1e-6))
            print(f"{name} {role}: largest weight difference {diff.max():.2e}, elements beyond 1e-6: {far:.2e}")
            assert diff.max() <= lr / 3 and far < 1e-3, (name, role)
