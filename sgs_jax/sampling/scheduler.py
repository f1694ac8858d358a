"""Continuous batching on the host: which (prompt, sample) row runs in which slot, which KV
pages it holds, and its generated tokens (columnar NumPy buffers).

Pure Python/NumPy over whole chunk outputs (no per-token Python work); the device programs
never see this bookkeeping. Rows wait in prompt-major order. A refill is taken when enough
slots are free for a whole prompt group, so one prefill serves all k samples of a prompt on
a batch shard: they share its full prompt pages and each gets its own copy of a partly
filled last page.

Pages are taken as rows grow: before each chunk, every live row gets pages for every token
it can reach by the end of that chunk (and of the chunk still in flight). When a shard's
pool runs out, refills pause (a group is admitted only if its prompt and first growth fit
beside what live rows need), and a live row that cannot grow preempts the youngest row of
its shard (latest admitted; possibly itself): that row gives its pages back and goes to the
front of the queue, to be recomputed from scratch later. Its random stream depends only on
(seed, prompt, sample, step), so the restart reproduces the same tokens, and the oldest
row always progresses (its worst case fits a shard's pool: checked up front), so there is
no deadlock.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np

from sgs_jax.sampling.pages import PageAllocator


WORK_FLOOR_TOKENS = 32  # smallest work list, in tokens per slot (see SlotScheduler.plan_chunk)


def work_bucket(entries: int) -> int:
    """Smallest size >= entries of the form m * 2^n with m in 4..7 (sizes up to 8 exact):
    four shapes per octave, so at most a fifth of a work list is padding. Two per octave
    (2^n, 3 * 2^n: up to a third) cost the CPU straggler case about 10% of the short rows'
    tokens/s, as the list's size steps in every chunk (docs/sampling_benchmark.md)."""
    if entries <= 8:
        return max(entries, 1)
    unit = 1 << ((entries - 1).bit_length() - 3)  # entries is in (4 * unit, 8 * unit]
    return -(-entries // unit) * unit


def pages_for(tokens, page_size: int):
    """Pages that hold `tokens` tokens (array or int)."""
    return -(-np.asarray(tokens) // page_size)


def pool_pages_per_shard(pool_tokens: int, page_size: int, shards: int) -> int:
    """Pages each batch shard's pool holds for a capacity of `pool_tokens` tokens (rounded
    up to whole pages per shard: the pool is shards x this many pages)."""
    return int(pages_for(pool_tokens, page_size * shards))


@dataclasses.dataclass(frozen=True)
class PrefillWrite:
    """One page of a prompt's prefill to write: chunk `chunk` (positions chunk * page_size..)
    of prompt `prompt_index` goes to local page `page` of batch shard `shard`."""

    prompt_index: int
    shard: int
    chunk: int
    page: int


@dataclasses.dataclass(frozen=True)
class Refill:
    """Rows to start now: placements (slot, row) and the prefill pages to write."""

    placements: tuple[tuple[int, int], ...]
    writes: tuple[PrefillWrite, ...]


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """The host side of one decode chunk.

    page_table [S, max_pages] int32 and num_pages [S] int32 (0 for slots without a live row)
    go to the device; kill [S] bool: slots preempted since the last chunk; work_size:
    ragged work-list entries per shard (`work_bucket` of the most pages any shard's rows
    hold, at least 128 tokens' worth per slot or the whole shard pool, whichever is less);
    exit_new: finished slots after which the chunk returns early. slot_rows / slot_epochs
    [S]: which row (and admission) each slot served, to attribute the outputs."""

    page_table: np.ndarray
    num_pages: np.ndarray
    kill: np.ndarray
    work_size: int
    exit_new: int
    slot_rows: np.ndarray
    slot_epochs: np.ndarray


class SlotScheduler:
    """Rows over `num_slots` decode slots (split evenly over `shards` batch shards), their KV
    pages in `allocator`, and their outputs.

    Rows are given columnar, prompt-major: prompt_index, sample_index, limit (new-token cap)
    and prompt_len, [N] each. chunk_steps: the device chunk length (growth is planned for
    it); max_pages: page-table width (pages of the longest row)."""

    def __init__(self, num_slots: int, prompt_index, sample_index, limit, prompt_len, group_size: int, stop_ids: Sequence[int],
                 allocator: PageAllocator, page_size: int, max_pages: int, chunk_steps: int):
        self.num_slots = num_slots
        self.shards = allocator.shards
        if num_slots % self.shards:
            raise ValueError(f"{num_slots} slots do not split over {self.shards} batch shards")
        self.slots_per_shard = num_slots // self.shards
        self.prompt_index = np.asarray(prompt_index, np.int32)
        self.sample_index = np.asarray(sample_index, np.int32)
        self.limit = np.asarray(limit, np.int32)
        self.prompt_len = np.asarray(prompt_len, np.int32)
        self.group_size = max(1, group_size)
        self.stop_ids = np.asarray(sorted(set(int(t) for t in stop_ids)), np.int32)
        self.allocator = allocator
        self.page_size = page_size
        self.max_pages = max_pages
        self.chunk_steps = chunk_steps
        n = len(self.prompt_index)
        self.max_cached = self.prompt_len - 1 + self.limit  # the last generated token is never cached
        worst = int(pages_for(self.max_cached, page_size).max(initial=0))
        if worst > allocator.pages_per_shard or worst > max_pages:
            raise ValueError(
                f"a row of up to {int(self.max_cached.max())} cached tokens needs {worst} pages of {page_size} tokens; a batch "
                f"shard's pool has {allocator.pages_per_shard} (raise sampling.kv_pool_tokens)"
            )
        self.waiting = collections.deque(range(n))
        self.slot_row = np.full(num_slots, -1, np.int64)
        self.slot_pages: list[list[int]] = [[] for _ in range(num_slots)]
        self.page_table = np.zeros((num_slots, max_pages), np.int32)
        self.row_epoch = np.zeros(n, np.int64)
        self.row_seq = np.zeros(n, np.int64)
        self._admissions = 0
        self.kill = np.zeros(num_slots, bool)
        self.preemptions = 0
        longest = int(self.limit.max(initial=1))
        self.lengths = np.zeros(n, np.int32)
        self.finished = np.zeros(n, bool)
        self.stopped = np.zeros(n, bool)
        self.tokens = np.zeros((n, longest), np.int32)
        self.logprobs = np.zeros((n, longest), np.float32)
        self.entropies = np.zeros((n, longest), np.float32)

    # ---- views ----------------------------------------------------------------------------
    @property
    def all_done(self) -> bool:
        return bool(self.finished.all())

    def _shard(self, slot: int) -> int:
        return slot // self.slots_per_shard

    @property
    def has_live(self) -> bool:
        """Whether some slot holds a row not known to have finished."""
        return bool(len(self._live_slots()))

    def _live_slots(self) -> np.ndarray:
        rows = self.slot_row
        live = rows >= 0
        live[live] = ~self.finished[rows[live]]
        return np.flatnonzero(live)

    def _free_slots(self, shard: int) -> list[int]:
        base = shard * self.slots_per_shard
        return [s for s in range(base, base + self.slots_per_shard) if self.slot_row[s] < 0]

    def _target_pages(self, row, ahead: int):
        """Pages a row needs to reach `ahead` more tokens (capped at its worst case)."""
        cached = self.prompt_len[row] - 1 + self.lengths[row]
        return pages_for(np.minimum(cached + ahead, self.max_cached[row]), self.page_size)

    def _reserved(self, shard: int, ahead: int) -> int:
        """Pages the live rows of `shard` still need for the next chunk."""
        slots = [s for s in self._live_slots() if self._shard(s) == shard]
        need = [int(self._target_pages(self.slot_row[s], ahead)) - len(self.slot_pages[s]) for s in slots]
        return sum(max(0, x) for x in need)

    def _refill_size(self) -> int:
        return min(self.group_size, len(self.waiting), self.num_slots)

    # ---- refills --------------------------------------------------------------------------
    def take_refill(self, in_flight: int) -> Refill:
        """Rows to start in free slots now (`in_flight`: chunks dispatched but not absorbed).
        Empty unless free slots hold a whole group; stops (pauses) at the first group whose
        pages do not fit beside what live rows need."""
        placements: list[tuple[int, int]] = []
        writes: list[PrefillWrite] = []
        free = {d: self._free_slots(d) for d in range(self.shards)}
        if not self.waiting or sum(len(f) for f in free.values()) < self._refill_size():
            return Refill((), ())
        ahead = (in_flight + 1) * self.chunk_steps
        reserved = {d: self._reserved(d, ahead) for d in range(self.shards)}
        while self.waiting and any(free.values()):
            first = self.waiting[0]
            prompt = int(self.prompt_index[first])
            group = [r for r in list(self.waiting)[: self.num_slots] if self.prompt_index[r] == prompt]
            portions = self._place(group, free, reserved, ahead)
            placed: set[int] = set()
            for shard, rows in portions:
                slots = [free[shard].pop(0) for _ in rows]
                writes += self._admit(shard, prompt, rows, slots)
                placements += list(zip(slots, rows))
                reserved[shard] += sum(int(self._target_pages(r, ahead)) - len(self.slot_pages[s]) for r, s in zip(rows, slots))
                placed.update(rows)
            if placed:
                self.waiting = collections.deque(r for r in self.waiting if r not in placed)
            if len(placed) < len(group):
                break  # slots or pages ran out: the rest waits
        return Refill(tuple(placements), tuple(writes))

    def _place(self, group: list[int], free, reserved, ahead: int) -> list[tuple[int, list[int]]]:
        """[(shard, rows)] for rows of one prompt: on one shard when one has the slots (most
        free pages first), else spread; as many rows as the shards' free slots and pages
        (beside what their live rows need) allow, possibly none."""
        full = (int(self.prompt_len[group[0]]) - 1) // self.page_size
        private = int(self._target_pages(group[0], ahead)) - full  # pages of each row beyond the shared ones
        room = {d: self.allocator.available(d) - reserved[d] for d in free}
        order = sorted(free, key=lambda d: (len(free[d]) < len(group), -room[d]))
        portions, left = [], list(group)
        for d in order:
            fit = len(left) if private == 0 else max(0, (room[d] - full) // private)
            take = min(len(left), len(free[d]), fit)
            if take:
                portions.append((d, left[:take]))
                left = left[take:]
            if not left:
                break
        return portions

    def _admit(self, shard: int, prompt: int, rows: list[int], slots: list[int]) -> list[PrefillWrite]:
        """Start `rows` of `prompt` in `slots` of `shard`: shared full prompt pages, one own
        copy of a partly filled last page each."""
        n = int(self.prompt_len[rows[0]]) - 1
        full, partial = divmod(n, self.page_size)
        shared = self.allocator.take(shard, full, holders=len(rows))
        writes = [PrefillWrite(prompt, shard, j, page) for j, page in enumerate(shared)]
        for row, slot in zip(rows, slots):
            own = self.allocator.take(shard, 1) if partial else []
            writes += [PrefillWrite(prompt, shard, full, page) for page in own]
            self._seat(row, slot, shared + own)
        return writes

    def _seat(self, row: int, slot: int, pages: list[int]) -> None:
        self.slot_row[slot] = row
        self.slot_pages[slot] = list(pages)
        self.page_table[slot, : len(pages)] = pages
        self.row_epoch[row] += 1
        self._admissions += 1
        self.row_seq[row] = self._admissions
        self.lengths[row] = 0

    # ---- chunks ---------------------------------------------------------------------------
    def plan_chunk(self, in_flight: int) -> ChunkPlan:
        """Give every live row pages for `in_flight` + 1 more chunks (preempting the youngest
        rows of a shard that runs out) and describe the chunk to dispatch."""
        ahead = (in_flight + 1) * self.chunk_steps
        for shard in range(self.shards):
            self._grow(shard, ahead)
        live = self._live_slots()
        num_pages = np.zeros(self.num_slots, np.int32)
        num_pages[live] = [len(self.slot_pages[s]) for s in live]
        per_shard = num_pages.reshape(self.shards, -1).sum(axis=1)
        # Floor: WORK_FLOOR_TOKENS per slot, so rows shorter than that share one work-list
        # shape; above it the list follows the live pages (a 128-token floor cost the CPU
        # batch benchmark 7-14% of its tokens/s to save up to four work-list shapes).
        floor = min(self.allocator.pages_per_shard, self.slots_per_shard * max(1, WORK_FLOOR_TOKENS // self.page_size))
        work = work_bucket(max(int(per_shard.max(initial=1)), floor))
        kill, self.kill = self.kill, np.zeros(self.num_slots, bool)
        rows = self.slot_row.copy()
        epochs = np.where(rows >= 0, self.row_epoch[np.maximum(rows, 0)], -1)
        waiting = len(self.waiting)
        free = int(np.sum(self.slot_row < 0))
        exit_new = max(1, self._refill_size() - free) if waiting else self.num_slots + 1
        return ChunkPlan(self.page_table.copy(), num_pages, kill, work, exit_new, rows, epochs)

    def _grow(self, shard: int, ahead: int) -> None:
        slots = [s for s in self._live_slots() if self._shard(s) == shard]
        slots.sort(key=lambda s: self.row_seq[self.slot_row[s]])  # oldest first
        for slot in slots:
            row = int(self.slot_row[slot])
            if row < 0:
                continue  # preempted below for an older row
            extra = int(self._target_pages(row, ahead)) - len(self.slot_pages[slot])
            while extra > self.allocator.available(shard):
                victim = max((s for s in slots if self.slot_row[s] >= 0), key=lambda s: self.row_seq[self.slot_row[s]])
                self._preempt(victim)
                if victim == slot:
                    break
            if self.slot_row[slot] < 0 or extra <= 0:
                continue
            pages = self.allocator.take(shard, extra)
            held = len(self.slot_pages[slot])
            self.page_table[slot, held : held + extra] = pages
            self.slot_pages[slot] += pages

    def _preempt(self, slot: int) -> None:
        row = int(self.slot_row[slot])
        self._free(slot)
        self.kill[slot] = True
        self.row_epoch[row] += 1  # outputs of chunks already in flight are dropped
        self.lengths[row] = 0
        self.waiting.appendleft(row)
        self.preemptions += 1

    def _free(self, slot: int) -> None:
        self.allocator.release(self._shard(slot), self.slot_pages[slot])
        self.slot_pages[slot] = []
        self.slot_row[slot] = -1

    def absorb(self, plan: ChunkPlan, tokens: np.ndarray, logprobs: np.ndarray, entropies: np.ndarray, count: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Take one chunk's outputs ([S, chunk] each; count and done [S]) for the rows the
        chunk ran (`plan`); finished rows give their slot and pages back. Returns the rows
        that finished, as an index array."""
        rows = plan.slot_rows
        ok = rows >= 0
        safe = np.maximum(rows, 0)
        ok &= (self.row_epoch[safe] == plan.slot_epochs) & ~self.finished[safe]
        count = np.where(ok, count, 0)
        steps = tokens.shape[1]
        mask = np.arange(steps)[None, :] < count[:, None]
        where_rows = np.broadcast_to(safe[:, None], mask.shape)[mask]
        where_cols = (self.lengths[safe][:, None] + np.arange(steps)[None, :])[mask]
        self.tokens[where_rows, where_cols] = tokens[mask]
        self.logprobs[where_rows, where_cols] = logprobs[mask]
        self.entropies[where_rows, where_cols] = entropies[mask]
        np.add.at(self.lengths, safe[ok], count[ok])
        ended = np.flatnonzero(ok & done)
        for slot in ended:
            row = rows[slot]
            last = self.tokens[row, self.lengths[row] - 1] if self.lengths[row] else -1
            self.stopped[row] = bool(np.isin(last, self.stop_ids))
            self.finished[row] = True
            self._free(int(slot))
        return rows[ended]
