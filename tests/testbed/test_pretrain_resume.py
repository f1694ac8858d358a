"""An interrupted `testbed_pretrain` stage continues after its newest saved epoch and ends
with exactly the weights of an uninterrupted stage (each epoch starts a fresh optimiser
with its own seed; saved epochs are fp32)."""

from __future__ import annotations

import shutil

import jax
import numpy as np
from flax import nnx

from sgs_jax.models import ModelConfig, create_model
from sgs_jax.sgs.testbed_pretrain import PretrainSettings, train_stage
from sgs_jax.testbed.model_configs import llama_config
from sgs_jax.testbed.tokenizer import load_tokenizer

ROWS = [{"messages": [{"role": "user", "content": f"prove p{i} -> p{i}"}], "completion": "intro h\nexact h"} for i in range(8)]


def _weights(model):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))]


def test_a_resumed_stage_equals_an_uninterrupted_one(tmp_path):
    tokenizer = load_tokenizer()
    config = ModelConfig.from_hf_dict(llama_config("nano", max_position_embeddings=256))
    settings = PretrainSettings(size="nano", max_len=64, batch_size=4, micro_batch_size=4)
    whole = train_stage(create_model(config, seed=0), ROWS, tokenizer, settings, [1e-3, 1e-3, 3e-4], seed=5, epochs_dir=tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["epoch_1", "epoch_2", "epoch_3"]
    # A run killed during epoch 2: only epoch 1 was saved (and a torn temporary).
    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "a" / "epoch_1", tmp_path / "b" / "epoch_1")
    shutil.copytree(tmp_path / "a" / "epoch_2", tmp_path / "b" / ".epoch_2.tmp")
    resumed = train_stage(create_model(config, seed=99), ROWS, tokenizer, settings, [1e-3, 1e-3, 3e-4], seed=5, epochs_dir=tmp_path / "b")
    for a, b in zip(_weights(whole), _weights(resumed)):
        np.testing.assert_array_equal(a, b)
