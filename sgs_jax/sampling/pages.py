"""Host bookkeeping of the paged KV pool: free pages per batch shard, with reference counts.

Pure Python/NumPy; the device never sees it. Page ids are local to their shard (the device
pool's pages axis is split over the batch axes, see `sgs_jax.models.paged_cache`). A page
is free when no row holds it; the k samples of a prompt hold its full prompt pages
together (count k), so the pages go back only when the last of them finishes.
"""

from __future__ import annotations

import numpy as np


class PageAllocator:
    """`shards` x `pages_per_shard` pages, each free or held by one or more rows."""

    def __init__(self, shards: int, pages_per_shard: int):
        if shards < 1 or pages_per_shard < 1:
            raise ValueError(f"need at least one shard and one page per shard, got {shards} x {pages_per_shard}")
        self.shards = shards
        self.pages_per_shard = pages_per_shard
        self.refs = np.zeros((shards, pages_per_shard), np.int32)
        # Stacks, lowest id on top (so a fresh pool fills from page 0 up).
        self._free = [list(range(pages_per_shard - 1, -1, -1)) for _ in range(shards)]
        self.peak_used = 0

    def available(self, shard: int) -> int:
        return len(self._free[shard])

    @property
    def used(self) -> int:
        return self.shards * self.pages_per_shard - sum(len(f) for f in self._free)

    def take(self, shard: int, count: int, holders: int = 1) -> list[int]:
        """`count` free pages of `shard`, each now held by `holders` rows. ValueError when
        fewer are free (callers check `available` first)."""
        free = self._free[shard]
        if count > len(free):
            raise ValueError(f"shard {shard}: {count} pages asked, {len(free)} free")
        pages = [free.pop() for _ in range(count)]
        self.refs[shard, pages] = holders
        self.peak_used = max(self.peak_used, self.used)
        return pages

    def release(self, shard: int, pages) -> None:
        """One holder lets go of each of `pages`; pages nobody holds become free."""
        for page in pages:
            if self.refs[shard, page] <= 0:
                raise ValueError(f"shard {shard}: page {page} released but not held")
            self.refs[shard, page] -= 1
            if self.refs[shard, page] == 0:
                self._free[shard].append(page)
