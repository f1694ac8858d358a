"""The roles' sampling weights: made once per phase, kept or released, frozen roles only in
the inference form, idle roles parked in pinned host memory, and one SGS iteration with
bf16 inference weights.

Random nano checkpoints (tests/sgs/conftest.py) on the 8 simulated CPU devices (mesh fsdp=8).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgs_jax.config import ConfigError, load_config
from sgs_jax.parallel import INFERENCE_RULES, make_mesh, state_shardings
from sgs_jax.parallel.placement import DEVICE, HOST, memory_kinds
from sgs_jax.rl.train_step import Trainer
from sgs_jax.sampling import Sampler, SamplingParams
from sgs_jax.sgs import bootstrap, roles as roles_module
from sgs_jax.sgs.roles import CONJECTURER, GUIDE, SOLVER, RoleMeshes, build_roles
from sgs_jax.sgs.run import SGSRun
from tests.rl.train_support import random_examples
from tests.sgs.run_support import CONFIGS, small_run_overrides


def _config(random_checkpoints, tmp_path, experiment="sgs", *extra):
    overrides = small_run_overrides(random_checkpoints, tmp_path / "run") + list(extra)
    return load_config(str(CONFIGS / f"{experiment}.py:testbed"), overrides)


def _roles(cfg, tmp_path):
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    tokenizer = bootstrap.load_role_tokenizer(cfg)
    base, guide = bootstrap.initial_models(cfg, tokenizer, mesh, str(tmp_path))
    return build_roles(cfg, base, guide, RoleMeshes(mesh)), mesh


def _leaves(tree):
    return jax.tree_util.tree_leaves(tree)


@pytest.fixture
def count_exports(monkeypatch):
    """Counts Trainer.export_for_inference calls (the real method still runs)."""
    calls = []
    real = Trainer.export_for_inference

    def counted(self, dtype, rules):
        calls.append(self)
        return real(self, dtype, rules)

    monkeypatch.setattr(Trainer, "export_for_inference", counted)
    return calls


def _in_inference_form(weights, mesh):
    target = _leaves(state_shardings(weights, mesh, INFERENCE_RULES))
    return all(x.dtype == jnp.bfloat16 and x.sharding.is_equivalent_to(s, x.ndim) for x, s in zip(_leaves(weights), target))


def test_export_per_phase_released_after_it(random_checkpoints, tmp_path, count_exports):
    roles, mesh = _roles(_config(random_checkpoints, tmp_path), tmp_path)
    with roles.rollout_weights(SOLVER) as first:
        assert _in_inference_form(first, mesh)
        assert roles.inference_weights(SOLVER) is first  # every chunk of the phase gets the same copy
    assert all(x.is_deleted() for x in _leaves(first))  # released after the phase
    assert all(not x.is_deleted() and x.dtype == jnp.float32 for x in _leaves(roles.solver.params))
    with roles.rollout_weights(SOLVER) as second:
        pass
    assert count_exports == [roles.solver, roles.solver]  # one per phase
    assert second is not first


def test_kept_export_is_reused_until_the_trainer_steps(random_checkpoints, tmp_path, count_exports):
    cfg = _config(random_checkpoints, tmp_path, "sgs", "--config.sampling.keep_inference_weights=true")
    roles, _ = _roles(cfg, tmp_path)
    with roles.rollout_weights(CONJECTURER) as first:
        pass
    with roles.rollout_weights(CONJECTURER) as again:
        pass
    assert again is first and not any(x.is_deleted() for x in _leaves(first)) and len(count_exports) == 1
    roles.conjecturer.step(random_examples(4, 64, seed=1))  # new weights: the kept copy is stale
    with roles.rollout_weights(CONJECTURER) as fresh:
        assert fresh is not first
    assert all(x.is_deleted() for x in _leaves(first)) and len(count_exports) == 2
    with roles.training(CONJECTURER):  # a training phase frees the copy it makes stale at once
        assert all(x.is_deleted() for x in _leaves(fresh))


def test_frozen_roles_hold_only_the_inference_form(random_checkpoints, tmp_path):
    roles, mesh = _roles(_config(random_checkpoints, tmp_path, "sgs", "--config.sgs.train_conjecturer=false"), tmp_path)
    assert roles.conjecturer is None and set(roles.frozen) == {CONJECTURER, GUIDE}
    for role in (CONJECTURER, GUIDE):
        assert _in_inference_form(roles.inference_weights(role), mesh), role
        with roles.rollout_weights(role) as weights:
            pass
        assert not any(x.is_deleted() for x in _leaves(weights))  # frozen weights are never released


def test_master_form_samples_exactly_as_the_trainer_model(random_checkpoints, tmp_path):
    """weights_dtype=float32 with the training layout: the sampler gets the master weights
    themselves, and samples exactly what it sampled from `trainer.model` before."""
    cfg = _config(random_checkpoints, tmp_path, "sgs", "--config.sampling.weights_dtype=float32", "--config.sampling.weights_layout=training")
    roles, mesh = _roles(cfg, tmp_path)
    sampler = Sampler(roles.solver.model.config, mesh=mesh, max_batch=8, chunk_steps=8)
    params = SamplingParams(max_new_tokens=12, num_samples=4, max_total_len=64, seed=3)
    prompts = [[1, 40, 41, 42], [1, 50]]
    legacy = sampler.generate(roles.solver.model, prompts, params)
    with roles.rollout_weights(SOLVER) as weights:
        assert all(a is b for a, b in zip(_leaves(weights), _leaves(roles.solver.params)))
        now = sampler.generate(weights, prompts, params)
    for field in ("lengths", "token_ids", "logprobs", "entropies"):
        np.testing.assert_array_equal(getattr(now, field), getattr(legacy, field))
    assert not any(x.is_deleted() for x in _leaves(roles.solver.params))  # released means forgotten, not deleted


def test_offload_idle_parks_what_a_phase_does_not_use(random_checkpoints, tmp_path):
    cfg = _config(random_checkpoints, tmp_path, "sgs", "--config.roles.offload_idle=true")
    roles, _ = _roles(cfg, tmp_path)
    trainers = (roles.solver, roles.conjecturer)
    state = lambda t: (t.params, t.opt_state)  # noqa: E731
    assert all(memory_kinds(state(t)) == {DEVICE} for t in trainers)  # a run starts on device
    with roles.rollout_weights(GUIDE) as guide:
        assert memory_kinds(guide) == {DEVICE} and all(memory_kinds(state(t)) == {HOST} for t in trainers)
    with roles.rollout_weights(SOLVER) as solver:
        assert memory_kinds(solver) == {DEVICE} and memory_kinds(roles.frozen[GUIDE]) == {HOST}
        assert memory_kinds(state(roles.solver)) == {HOST}  # only the bf16 copy samples
    with roles.training(SOLVER) as trainer:
        assert trainer is roles.solver and memory_kinds(state(trainer)) == {DEVICE}
        assert memory_kinds(state(roles.conjecturer)) == {HOST} and memory_kinds(roles.frozen[GUIDE]) == {HOST}
    roles.to_device()  # before a checkpoint
    assert all(memory_kinds(state(t)) == {DEVICE} for t in trainers) and memory_kinds(roles.frozen[GUIDE]) == {DEVICE}


def test_a_step_after_offload_equals_a_step_without(random_checkpoints, tmp_path):
    examples = random_examples(6, 64, seed=2)
    after = {}
    for offload in (False, True):
        cfg = _config(random_checkpoints, tmp_path / str(offload), "sgs", f"--config.roles.offload_idle={offload}")
        roles, _ = _roles(cfg, tmp_path / str(offload))
        with roles.rollout_weights(SOLVER):
            pass
        with roles.training(SOLVER) as trainer:
            trainer.train_epoch(examples, seed=0)
        after[offload] = jax.tree_util.tree_map(np.asarray, trainer.params)
    jax.tree_util.tree_map(np.testing.assert_array_equal, after[False], after[True])


def test_offload_without_host_memory_fails_at_start_up(random_checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(roles_module, "supports_host_memory", lambda mesh: False)
    with pytest.raises(ConfigError, match="roles.offload_idle: the cpu devices have no pinned_host memory"):
        _roles(_config(random_checkpoints, tmp_path, "sgs", "--config.roles.offload_idle=true"), tmp_path)


def test_bad_weights_settings_name_the_field(random_checkpoints, tmp_path):
    with pytest.raises(ConfigError, match="sampling.weights_dtype must be one of"):
        _config(random_checkpoints, tmp_path, "sgs", "--config.sampling.weights_dtype=int8")
    with pytest.raises(ConfigError, match="sampling.weights_layout must be one of"):
        _config(random_checkpoints, tmp_path, "sgs", "--config.sampling.weights_layout=fsdp")


def test_cispo_iteration_with_bf16_inference_weights_and_offload(tmp_path, count_exports):
    """One CISPO SGS iteration of the packaged testbed models in the default rollout form
    (bf16, inference layout) with idle roles offloaded (through the checkpoint commit):
    each trained role is exported once per sampling phase, and the logged
    importance weight compares bf16 sampling to fp32 training (close to 1, not exactly 1).
    ~30 s on 2 cores: the loop end to end is what this checks."""
    from sgs_jax.sgs.testbed_pretrain import MODELS_DIR

    cfg = _config(MODELS_DIR, tmp_path, "cispo_sgs", "--config.sgs.proofs_per_problem=4", "--config.roles.offload_idle=true")
    run = SGSRun(cfg)
    try:
        run.run(iterations=1)
        exported = {name: sum(t is trainer for t in count_exports) for name, trainer in run.roles.trainable().items()}
        # The Solver samples twice (step 0's base solve rate, then the prove phase), released
        # in between; the Conjecturer once.
        assert exported == {SOLVER: 2, CONJECTURER: 1}
        assert all(x.dtype == jnp.float32 for t in run.roles.trainable().values() for x in _leaves(t.params))
    finally:
        run.close()
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "run", "metrics.jsonl"))]
    scalars = [r for r in rows if "scalars" in r][-1]["scalars"]
    assert scalars["solver/train_sequences"] > 0
    assert 0.95 < scalars["solver/mean_importance_weight"] < 1.05 and scalars["solver/mean_importance_weight"] != 1.0
