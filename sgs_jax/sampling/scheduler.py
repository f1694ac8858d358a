"""Continuous batching on the host: which (prompt, sample) row occupies which decode slot.

Pure Python over NumPy chunk outputs; the device programs never see this bookkeeping.
Rows wait in prompt-major order; a refill is taken when enough slots are free for a whole
prompt group (so one prefill serves all k samples of a prompt), and the decode chunk is
asked to return as soon as that many slots have finished.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Row:
    """One completion to produce: sample `sample_index` of prompt `prompt_index` (of
    `prompt_len` tokens), at most `limit` new tokens."""

    prompt_index: int
    sample_index: int
    limit: int
    prompt_len: int


@dataclasses.dataclass(frozen=True)
class FinishedRow:
    row: Row
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    entropies: tuple[float, ...]
    finish_reason: str


class SlotScheduler:
    """Assigns waiting rows to `num_slots` decode slots and collects their tokens."""

    def __init__(self, num_slots: int, rows: Sequence[Row], group_size: int, stop_ids: Sequence[int]):
        self.num_slots = num_slots
        self.rows = list(rows)
        self.group_size = max(1, group_size)
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.waiting = collections.deque(range(len(self.rows)))
        self.slot_row: list[int | None] = [None] * num_slots
        self._tokens: list[list[int]] = [[] for _ in range(num_slots)]
        self._logprobs: list[list[float]] = [[] for _ in range(num_slots)]
        self._entropies: list[list[float]] = [[] for _ in range(num_slots)]
        self.finished: list[FinishedRow] = []

    @property
    def all_done(self) -> bool:
        return not self.waiting and all(r is None for r in self.slot_row)

    def _free_slots(self) -> list[int]:
        return [s for s, r in enumerate(self.slot_row) if r is None]

    def _refill_size(self) -> int:
        return min(self.group_size, len(self.waiting), self.num_slots)

    def take_refill(self) -> list[tuple[int, int]]:
        """(slot, row index) pairs to start now; empty unless a whole group fits."""
        free = self._free_slots()
        if not self.waiting or len(free) < self._refill_size():
            return []
        placed = []
        for slot in free[: len(self.waiting)]:
            index = self.waiting.popleft()
            self.slot_row[slot] = index
            placed.append((slot, index))
        return placed

    def exit_threshold(self) -> int:
        """Finished-slot count at which the decode chunk should hand back for a refill
        (num_slots + 1 = never: nothing waits)."""
        return self._refill_size() if self.waiting else self.num_slots + 1

    def cache_extent(self) -> int:
        """Cache slots the live rows occupy so far: max over them of prompt_len - 1 + generated
        (the last prompt token is fed by the first decode step); 0 when none runs."""
        return max(
            (self.rows[i].prompt_len - 1 + len(self._tokens[s]) for s, i in enumerate(self.slot_row) if i is not None),
            default=0,
        )

    def absorb(self, tokens: np.ndarray, logprobs: np.ndarray, entropies: np.ndarray, generated: np.ndarray, done: np.ndarray) -> int:
        """Take one decode chunk's outputs ([slots, chunk] each; generated and done [slots]).

        A row's new tokens are the first generated[s] - (tokens held) entries of its chunk
        row. Finished rows move to `finished` and free their slot. Returns new tokens taken.
        """
        taken = 0
        for slot, index in enumerate(self.slot_row):
            if index is None:
                continue
            new = int(generated[slot]) - len(self._tokens[slot])
            self._tokens[slot].extend(int(t) for t in tokens[slot, :new])
            self._logprobs[slot].extend(float(x) for x in logprobs[slot, :new])
            self._entropies[slot].extend(float(x) for x in entropies[slot, :new])
            taken += new
            if done[slot]:
                self._finish(slot, index)
        return taken

    def _finish(self, slot: int, index: int) -> None:
        toks = tuple(self._tokens[slot])
        reason = "stop" if toks and toks[-1] in self.stop_ids else "length"
        self.finished.append(
            FinishedRow(self.rows[index], toks, tuple(self._logprobs[slot]), tuple(self._entropies[slot]), reason)
        )
        self.slot_row[slot] = None
        self._tokens[slot], self._logprobs[slot], self._entropies[slot] = [], [], []
