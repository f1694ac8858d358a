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
from sgs_jax.sgs.roles import GUIDE, SOLVER, build_roles, role_meshes
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
    (["--config.roles.placement=split"], "roles.guide_devices must be positive with roles.placement='split'"),
    (["--config.roles.placement=split", "--config.roles.guide_devices=-2"], "roles.guide_devices must be >= 0"),
    (SPLIT + ["--config.sgs.use_guide=false"], "roles.placement='split' gives the Guide its own devices, but this experiment"),
    (SPLIT[:1] + ["--config.roles.guide_devices=3", "--config.mesh.tensor=2"], "roles.guide_devices=3 must be a multiple of mesh.tensor=2"),
    (SPLIT + ["--config.mesh.tensor=-1", "--config.mesh.fsdp=1"], "mesh.tensor=-1: roles.placement='split' needs an explicit"),
]


@pytest.mark.parametrize("overrides,match", BAD_STATIC, ids=[" ".join(o) for o, _ in BAD_STATIC])
def test_bad_placement_fails_in_validate_naming_the_field(random_checkpoints, tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        _config(random_checkpoints, tmp_path, *overrides)


# On the 8 devices of one process: what only the devices can tell, before any work.
BAD_DEVICES = [
    (["--config.roles.guide_devices=8"], "roles.guide_devices=8 of 8 devices: 8 devices .8 per process. leave no device"),
    (["--config.roles.guide_devices=3"], r"the Guide's sub-mesh \{'data': 3, 'fsdp': 1, 'tensor': 1\}: sampling.max_batch=16 rows "
                                         r"do not split .* use a multiple of 3 \(e.g. 18\)"),
    (["--config.roles.guide_devices=2"], r"the trainers' sub-mesh \{'data': 1, 'fsdp': 6, 'tensor': 1\}: sampling.max_batch=16"),
    (["--config.roles.guide_devices=4", "--config.mesh.fsdp=3"], r"mesh.data / mesh.fsdp / mesh.tensor: the trainers' sub-mesh has the 4 "
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
    return build_roles(cfg, base, guide, meshes.train, meshes.guide), meshes


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


@pytest.mark.slow  # two 2-iteration runs of the packaged testbed models: ~45 s each on 2 cores
def test_split_run_equals_the_shared_run(tmp_path, monkeypatch):
    """The testbed `sgs` config for 2 iterations (k = 4: the Solver trains), shared on 8
    devices and split (Guide on 4, trainers on fsdp=4): metrics (same names in the same
    order), target state, examples and final weights are equal; the Solver's training ran in
    a worker thread while the Guide sampled. Exact except floats whose reduction spans a
    different number of devices: the trainers' loss / grad norm (fsdp=8 vs 4 gradient sums)
    and the Solver's mean entropy (its sampler splits 16 slots over 8 vs 4 devices) within
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
    for name, extra in (("shared", []), ("split", SPLIT)):
        threads.clear()
        cfg = _config(MODELS_DIR, tmp_path / name, "--config.sgs.proofs_per_problem=4", "--config.run.compile_cache_dir=off", *extra)
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
    shared, split = out["shared"], out["split"]
    assert all(t == "MainThread" for t in shared["threads"])
    assert any(t.startswith("sgs-train-solver") for t in split["threads"])  # the Solver trained beside the Guide
    assert split["targets"] == shared["targets"] and split["examples"] == shared["examples"]
    assert len(split["metrics"]) == len(shared["metrics"])
    steps = 0
    for a, b in zip(shared["metrics"], split["metrics"]):
        assert a.get("values") == b.get("values") and list(a.get("scalars", {})) == list(b.get("scalars", {}))
        for key, x in a.get("scalars", {}).items():
            y = b["scalars"][key]
            if key in TIMINGS or x == y:
                continue
            assert key in TRAINER_FLOATS or key == "solver/entropy", (a["step"], key, x, y)
            assert abs(x - y) <= 1e-5 * max(abs(x), abs(y)), (a["step"], key, x, y)
        steps += "scalars" in a and a["step"] > 0 and a["scalars"].get("solver/optimizer_steps", 0) > 0
    assert steps == 2  # the Solver stepped in both iterations: the comparison covers training
    assert shared["weights"].keys() == split["weights"].keys()
    lr = cfg.solver_train.lr  # the testbed's 3e-4, both roles
    for role in shared["weights"]:
        pairs = zip(jax.tree_util.tree_leaves(shared["weights"][role]), jax.tree_util.tree_leaves(split["weights"][role]))
        diff = np.concatenate([np.abs(x - y).ravel() for x, y in pairs])
        far = float(np.mean(diff > 1e-6))
        print(f"{role}: largest weight difference {diff.max():.2e}, elements beyond 1e-6: {far:.2e}")
        assert diff.max() <= lr / 3 and far < 1e-3, role
