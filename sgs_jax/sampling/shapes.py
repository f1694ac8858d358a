"""Static shapes: prompt-length buckets and power-of-two sizes (host-side, pure), prompt checks.

Every jitted program is keyed by these numbers, so a run compiles a handful of programs
instead of one per batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

DEFAULT_PROMPT_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)


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


def prompt_problem(prompt: Sequence[int], max_total_len: int, vocab_size: int) -> str | None:
    """Why `prompt` (token ids) cannot be generated from, or None when it can."""
    ids = np.asarray(prompt)
    if ids.size == 0:
        return "empty prompt"
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        return "token ids must be a flat sequence of integers"
    if len(ids) >= max_total_len:
        return f"prompt has {len(ids)} tokens, no room under max_total_len={max_total_len}"
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        return f"token ids outside [0, {vocab_size}): {bad[:5].tolist()}"
    return None


class PromptError(ValueError):
    """Some prompts cannot be generated from; `problems` maps prompt index -> reason."""

    def __init__(self, problems: dict[int, str]):
        self.problems = problems
        shown = "; ".join(f"prompt {i}: {why}" for i, why in list(problems.items())[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"{len(problems)} bad prompt(s): {shown}{more}")
