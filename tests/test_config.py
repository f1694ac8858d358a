"""Configs: every experiment file and preset loads and validates; bad values fail clearly."""

import glob
import os

import pytest

from sgs_jax.config import ConfigError, load_config, save_resolved

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_base_loads_and_overrides():
    cfg = load_config(os.path.join(ROOT, "configs/sgs.py:testbed"), ["run.iterations=3", "solver_train.lr=1", "verify.options.workers=2"])
    assert cfg.run.iterations == 3 and cfg.solver_train.lr == 1.0 and cfg.verify.options.workers == 2


@pytest.mark.parametrize(
    "override,match",
    [("run.iterations=x", "iterations"), ("nope.x=1", "unknown"), ("run.nope=1", "unknown"), ("sgs.use_guide=1", "use_guide"),
     ("run.iterations=0", "positive"), ("sgs.solver_objective='ppo'", "one of"), ("sampling.top_p=1.5", "top_p"),
     ("solver_train.micro_batch_size=5", "multiple"), ("noequals", "key=value"),
     ("sgs.keep_quantile=1.0", "keep_quantile"), ("sgs.keep_quantile=0.0", "keep_quantile")],
)
def test_bad_values_fail_with_the_field_name(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(os.path.join(ROOT, "configs/sgs.py:testbed"), [override])


def test_missing_file_and_resolved_copy(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config("configs/nope.py")
    cfg = load_config(os.path.join(ROOT, "configs/sgs.py:testbed"))
    path = save_resolved(cfg, tmp_path)
    assert '"iterations": 10' in open(path).read()


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))))
def test_every_experiment_config_and_preset_validates(path):
    if path.endswith(("__init__.py", "base.py", "presets.py")):
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("cfg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for preset in getattr(module, "PRESETS", ("",)):
        load_config(f"{path}:{preset}" if preset else path)


def test_cispo_learning_rate_is_a_third_in_every_preset():
    for preset, expected in (("paper", 1e-6), ("testbed", 1e-4)):
        cfg = load_config(os.path.join(ROOT, f"configs/cispo_sgs.py:{preset}"))
        assert abs(cfg.solver_train.lr - expected) < 1e-12 and cfg.solver_train.batch_size == 64


def test_base_without_a_checkpoint_is_rejected():
    with pytest.raises(ConfigError, match="model.checkpoint"):
        load_config(os.path.join(ROOT, "configs/base.py"))


def test_cispo_batch_must_hold_whole_groups():
    with pytest.raises(ConfigError, match="sgs.proofs_per_problem"):
        load_config(os.path.join(ROOT, "configs/cispo_sgs.py:testbed"), ["solver_train.batch_size=36", "solver_train.micro_batch_size=4"])
