"""What a generation call asks for (`SamplingParams`) and what it returns (`Completion`)."""

from __future__ import annotations

import dataclasses
from typing import Optional

FINISH_REASONS = ("stop", "length")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one `Sampler.generate` call.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_p: nucleus mass in (0, 1]; 1 keeps everything. top_k: 0 means off.
    max_new_tokens: generated tokens per sample (the stop token counts).
    max_total_len: cap on prompt + generated tokens (the Solver uses 8192).
    num_samples: completions per prompt (k); they share one prefill.
    seed: with (prompt index, sample index) it fixes each completion's random stream,
        so results do not depend on batching.
    stop_token_ids: generation of a row ends after any of these; None = the model's EOS ids,
        () = never stop early.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    max_total_len: int = 8192
    num_samples: int = 1
    seed: int = 0
    stop_token_ids: Optional[tuple[int, ...]] = None

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_total_len < 2:
            raise ValueError(f"max_total_len must be >= 2, got {self.max_total_len}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples}")
        if self.stop_token_ids is not None:
            object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filtered(self) -> bool:
        """Whether top-k / top-p change the distribution (needs a vocabulary sort)."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1)

    def resolved_stop_ids(self, eos_token_ids: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(eos_token_ids) if self.stop_token_ids is None else self.stop_token_ids


@dataclasses.dataclass(frozen=True)
class Completion:
    """One generated sample.

    token_ids: generated ids (the stop token included when finish_reason is "stop").
    logprobs: natural-log probability of each token under the *sampling* distribution
        (temperature, then top-k, then top-p, renormalised) - the pi_old of CISPO. For
        greedy decoding (temperature 0) that distribution is a point mass, so the model's
        temperature-1 log-softmax of the chosen token is reported instead.
    entropies: entropy (nats) of the model's full temperature-1 next-token distribution
        softmax(logits) at each step, before any temperature / top-k / top-p: the
        Solver-entropy diagnostic, independent of the sampling settings.
    finish_reason: "stop" (a stop token was generated) or "length" (max_new_tokens or
        max_total_len reached).
    text: decoded text (special tokens dropped) when a tokenizer was given, else None.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    entropies: tuple[float, ...]
    finish_reason: str
    prompt_index: int
    sample_index: int
    text: Optional[str] = None

    def __post_init__(self):
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if not len(self.token_ids) == len(self.logprobs) == len(self.entropies):
            raise ValueError("token_ids, logprobs and entropies must have one entry per token")


@dataclasses.dataclass(frozen=True)
class GenerationStats:
    """Counters of one `generate` call (for throughput and padding-waste reports).

    slot_steps: slots x decode steps executed; generated_tokens of them did real work, so
    decode padding waste = 1 - generated_tokens / slot_steps. prefill_tokens: prompt
    positions computed (bucket padding included); prefill_real_tokens: real ones.
    max_window: the largest attention window (cache slots) a decode chunk used.
    """

    num_slots: int
    cache_len: int
    max_window: int
    decode_steps: int
    slot_steps: int
    generated_tokens: int
    prefill_tokens: int
    prefill_real_tokens: int
    refills: int
    chunks: int
    wall_s: float

    @property
    def decode_waste(self) -> float:
        return 1.0 - self.generated_tokens / self.slot_steps if self.slot_steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0
