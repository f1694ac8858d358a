"""The rollout engine: batched sampling over a paged KV pool with continuous batching."""

from sgs_jax.sampling.params import Completions, GenerationStats, SamplingParams
from sgs_jax.sampling.sampler import Sampler
from sgs_jax.sampling.shapes import PromptError
from sgs_jax.sampling.text import encode_prompt, generate_records, generate_text

__all__ = [
    "Completions",
    "GenerationStats",
    "PromptError",
    "Sampler",
    "SamplingParams",
    "encode_prompt",
    "generate_records",
    "generate_text",
]
