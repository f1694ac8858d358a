"""What a generation call asks for (`SamplingParams`) and what it returns (`Completions`)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

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


def _frozen(x, dtype) -> np.ndarray:
    array = np.array(x, dtype=dtype)  # a copy: the caller's buffers stay theirs
    array.flags.writeable = False
    return array


@dataclasses.dataclass(frozen=True, eq=False)
class Completions:
    """Every sample of one `Sampler.generate` call, columnar; rows are prompt-major (row
    p * num_samples + s is sample s of prompt p). Arrays are read-only.

    prompt_index, sample_index [N] int32; lengths [N] int32: generated tokens L_i (the stop
    token included when stopped[i]). token_ids [N, L] int32, logprobs and entropies [N, L]
    float32, with L = max(lengths); entries past a row's length are 0.
    logprobs: natural-log probability of each token under the *sampling* distribution
        (temperature, then top-k, then top-p, renormalised) - the pi_old of CISPO. For
        greedy decoding (temperature 0) that distribution is a point mass, so the model's
        temperature-1 log-softmax of the chosen token is reported instead.
    entropies: entropy (nats) of the model's full temperature-1 next-token distribution
        softmax(logits) at each step, before any temperature / top-k / top-p: the
        Solver-entropy diagnostic, independent of the sampling settings.
    stopped [N] bool: a stop token ended the row (finish reason "stop"); otherwise
        max_new_tokens or max_total_len did ("length").
    texts: decoded text per row (special tokens dropped) when a tokenizer was given, else None.
    """

    prompt_index: np.ndarray
    sample_index: np.ndarray
    lengths: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray
    entropies: np.ndarray
    stopped: np.ndarray
    texts: Optional[tuple[str, ...]] = None

    def __post_init__(self):
        n = len(self.lengths)
        width = int(np.max(self.lengths, initial=0))
        for name, dtype in (("prompt_index", np.int32), ("sample_index", np.int32), ("lengths", np.int32), ("stopped", bool)):
            object.__setattr__(self, name, _frozen(getattr(self, name), dtype))
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name} must have shape ({n},), got {getattr(self, name).shape}")
        for name, dtype in (("token_ids", np.int32), ("logprobs", np.float32), ("entropies", np.float32)):
            array = np.asarray(getattr(self, name), dtype)
            if array.ndim != 2 or array.shape[0] != n:
                raise ValueError(f"{name} must have shape ({n}, L), got {array.shape}")
            if array.shape[1] < width:
                raise ValueError(f"{name} has {array.shape[1]} columns for rows of up to {width} tokens")
            object.__setattr__(self, name, _frozen(array[:, :width], dtype))
        if self.texts is not None:
            object.__setattr__(self, "texts", tuple(self.texts))
            if len(self.texts) != n:
                raise ValueError(f"{len(self.texts)} texts for {n} rows")

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def finish_reasons(self) -> tuple[str, ...]:
        return tuple("stop" if s else "length" for s in self.stopped)

    def tokens(self, row: int) -> np.ndarray:
        """Generated ids of one row [L_row] (a read-only view)."""
        return self.token_ids[row, : self.lengths[row]]

    def row_logprobs(self, row: int) -> np.ndarray:
        return self.logprobs[row, : self.lengths[row]]

    def row_entropies(self, row: int) -> np.ndarray:
        return self.entropies[row, : self.lengths[row]]

    def text(self, row: int) -> Optional[str]:
        return None if self.texts is None else self.texts[row]

    def mean_entropies(self) -> np.ndarray:
        """[N] mean per-token entropy of each row (nats; 0 for an empty row)."""
        mask = np.arange(self.entropies.shape[1])[None, :] < self.lengths[:, None]
        return np.sum(self.entropies * mask, axis=1) / np.maximum(self.lengths, 1)

    def select(self, rows) -> "Completions":
        """The given rows (an index array or slice), in that order."""
        rows = np.arange(len(self))[rows] if isinstance(rows, slice) else np.asarray(rows, np.int64)
        texts = None if self.texts is None else tuple(self.texts[i] for i in rows)
        return Completions(self.prompt_index[rows], self.sample_index[rows], self.lengths[rows], self.token_ids[rows],
                           self.logprobs[rows], self.entropies[rows], self.stopped[rows], texts)

    def rows_of(self, prompt: int) -> np.ndarray:
        """Row indices of one prompt's samples, sample order."""
        return np.flatnonzero(self.prompt_index == prompt)

    @classmethod
    def empty(cls) -> "Completions":
        z = np.zeros((0,), np.int32)
        return cls(z, z, z, np.zeros((0, 0), np.int32), np.zeros((0, 0), np.float32), np.zeros((0, 0), np.float32), np.zeros((0,), bool), ())


@dataclasses.dataclass(frozen=True)
class GenerationStats:
    """Counters of one `generate` call (for throughput and padding-waste reports).

    slot_steps: slots x decode steps executed; generated_tokens of them did real work, so
    decode padding waste = 1 - generated_tokens / slot_steps. prefill_tokens: prompt
    positions computed (bucket padding included); prefill_real_tokens: real ones.
    pool_pages / page_size: the KV pool (all shards); peak_pages: most pages held at once;
    preemptions: rows sent back to the queue because the pool was full (recomputed later).
    held_page_steps: pages the rows held (all shards) x decode steps, summed over chunks;
    work_page_steps: the same for the gather backend's work list (all shards, padding
    included; 0 for the Pallas kernels), so attention_padding = the share of the pages that
    attention visited which no row held (per layer; machine-independent, unlike wall_s).
    """

    num_slots: int
    pool_pages: int
    page_size: int
    peak_pages: int
    decode_steps: int
    slot_steps: int
    generated_tokens: int
    prefill_tokens: int
    prefill_real_tokens: int
    refills: int
    chunks: int
    preemptions: int
    wall_s: float
    held_page_steps: int
    work_page_steps: int

    @property
    def decode_waste(self) -> float:
        return 1.0 - self.generated_tokens / self.slot_steps if self.slot_steps else 0.0

    @property
    def attention_padding(self) -> float:
        return 1.0 - self.held_page_steps / self.work_page_steps if self.work_page_steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0
