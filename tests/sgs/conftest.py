"""Shared fixtures of the SGS loop tests."""

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

