"""Static shapes: prompt-length buckets, slot counts and cache lengths (host-side, pure).

Every jitted program is keyed by these numbers, so a run compiles a handful of programs
instead of one per batch.
"""

from __future__ import annotations

from typing import Sequence

DEFAULT_PROMPT_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
CACHE_GRANULARITY = 256  # cache lengths are multiples of this


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= length; beyond the largest, the next multiple of the largest."""
    for b in buckets:
        if length <= b:
            return b
    top = buckets[-1]
    return -(-length // top) * top


def power_of_two_at_least(n: int, cap: int) -> int:
    """Smallest power of two >= n, but at most cap (n >= 1)."""
    p = 1
    while p < n:
        p *= 2
    return min(p, cap)


def cache_length(prefill_bucket: int, max_new_tokens: int, max_total_len: int) -> int:
    """KV slots per row: enough for the longest bucketed prompt plus its generation, capped
    by max_total_len, rounded up to CACHE_GRANULARITY (and never below the prefill bucket)."""
    needed = min(prefill_bucket + max_new_tokens, max_total_len)
    rounded = -(-needed // CACHE_GRANULARITY) * CACHE_GRANULARITY
    return max(rounded, prefill_bucket)


def prompt_problem(prompt: Sequence[int], max_total_len: int, vocab_size: int) -> str | None:
    """Why `prompt` (token ids) cannot be generated from, or None when it can."""
    if len(prompt) == 0:
        return "empty prompt"
    if len(prompt) >= max_total_len:
        return f"prompt has {len(prompt)} tokens, no room under max_total_len={max_total_len}"
    bad = [t for t in prompt if not (isinstance(t, int) or hasattr(t, "__index__")) or not 0 <= int(t) < vocab_size]
    if bad:
        return f"token ids outside [0, {vocab_size}): {bad[:5]}"
    return None


class PromptError(ValueError):
    """Some prompts cannot be generated from; `problems` maps prompt index -> reason."""

    def __init__(self, problems: dict[int, str]):
        self.problems = problems
        shown = "; ".join(f"prompt {i}: {why}" for i, why in list(problems.items())[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"{len(problems)} bad prompt(s): {shown}{more}")
