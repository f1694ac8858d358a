"""Shared fixtures of the SGS loop tests."""

import json

import pytest

from sgs_jax.models import ModelConfig, create_model, save_hf
from sgs_jax.testbed.model_configs import llama_config
from sgs_jax.testbed.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def random_checkpoints(tmp_path_factory):
    """Random nano base and Guide checkpoints in HF format, with the testbed tokenizer."""
    root = tmp_path_factory.mktemp("models")
    config = ModelConfig.from_hf_dict(llama_config("nano", 1024))
    for seed, name in ((0, "base"), (1, "guide")):
        save_hf(create_model(config, seed=seed), root / name, tokenizer=load_tokenizer())
    return root



@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A finished 1-iteration SGS testbed run from the packaged base and Guide models
    (6 targets, k = 4: the Solver gets training data), and the weights its Solver and
    Conjecturer hold at the end (host copies: the reference for restores and exports)."""
    import jax
    import numpy as np
    from flax import nnx

    from sgs_jax.config import load_config
    from sgs_jax.sgs.run import SGSRun
    from sgs_jax.sgs.testbed_pretrain import MODELS_DIR
    from tests.sgs.run_support import CONFIGS, small_run_overrides

    workdir = tmp_path_factory.mktemp("trained_run") / "run"
    overrides = small_run_overrides(MODELS_DIR, workdir) + ["--config.sgs.proofs_per_problem=4"]
    run = SGSRun(load_config(str(CONFIGS / "sgs.py:testbed"), overrides))
    try:
        run.run(iterations=1)
        weights = {
            name: jax.tree_util.tree_map(np.asarray, nnx.state(trainer.model))
            for name, trainer in run.roles.trainable().items()
        }
    finally:
        run.close()
    last = [row for row in map(json.loads, open(workdir / "metrics.jsonl")) if "scalars" in row][-1]["scalars"]
    assert last.get("solver/optimizer_steps", 0) >= 1, "the Solver must have trained, or restores prove nothing"
    return workdir, weights
