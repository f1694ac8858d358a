"""The rollout engine: batched sampling with a KV cache and continuous batching."""

from sgs_jax.sampling.params import Completion, GenerationStats, SamplingParams
from sgs_jax.sampling.sampler import Sampler
from sgs_jax.sampling.shapes import PromptError
from sgs_jax.sampling.text import encode_prompt, generate_records, generate_text

__all__ = [
    "Completion",
    "GenerationStats",
    "PromptError",
    "Sampler",
    "SamplingParams",
    "encode_prompt",
    "generate_records",
    "generate_text",
]
