"""The LLaMA-family decoder in Flax NNX, its config, KV cache, checkpoint I/O and tokenizer."""

from sgs_jax.models.build import abstract_model, create_model, shard_model
from sgs_jax.models.config import ModelConfig, deepseek_prover_v2_7b, preset, tiny
from sgs_jax.models.hf_io import CheckpointError, load_hf, save_hf
from sgs_jax.models.kv_cache import KVCache
from sgs_jax.models.llama import Llama

__all__ = [
    "CheckpointError",
    "KVCache",
    "Llama",
    "ModelConfig",
    "abstract_model",
    "create_model",
    "deepseek_prover_v2_7b",
    "load_hf",
    "preset",
    "save_hf",
    "shard_model",
    "tiny",
]
