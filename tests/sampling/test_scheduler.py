"""Host-side bookkeeping of continuous batching and KV pages, without a model."""

import numpy as np
import pytest

from sgs_jax.sampling.pages import PageAllocator
from sgs_jax.sampling.scheduler import PrefillWrite, SlotScheduler, work_bucket

PAGE = 4
CHUNK = 2


def make(prompt_lens, k, limit, slots, pages, shards=1, stop=(9,)):
    n = len(prompt_lens) * k
    prompt_index = np.repeat(np.arange(len(prompt_lens)), k)
    return SlotScheduler(slots, prompt_index, np.tile(np.arange(k), len(prompt_lens)), np.full(n, limit),
                         np.asarray(prompt_lens)[prompt_index], k, stop, PageAllocator(shards, pages), PAGE, 16, CHUNK)


def chunk_out(sched, plan, tokens, done):
    """Absorb a chunk whose slot s produced tokens[s] (a list) and is done per `done`."""
    steps = max(1, max(len(t) for t in tokens))
    arr = np.zeros((sched.num_slots, steps), np.int32)
    for s, t in enumerate(tokens):
        arr[s, : len(t)] = t
    count = np.array([len(t) for t in tokens], np.int32)
    return sched.absorb(plan, arr, arr * 0.5, arr * 0.25, count, np.asarray(done))


def test_samples_share_full_prompt_pages_and_copy_the_partial_one():
    sched = make([10], k=3, limit=4, slots=4, pages=32)  # 9 cached prompt tokens: 2 full pages + 1 partial
    refill = sched.take_refill(in_flight=0)
    assert [slot for slot, _ in refill.placements] == [0, 1, 2]
    full = [w for w in refill.writes if w.chunk < 2]
    partial = [w for w in refill.writes if w.chunk == 2]
    assert [(w.prompt_index, w.chunk) for w in full] == [(0, 0), (0, 1)]  # prefilled once
    assert len({w.page for w in partial}) == 3  # one own copy per sample
    assert sched.allocator.used == 2 + 3
    shared = [w.page for w in full]
    for slot in range(3):
        assert sched.slot_pages[slot][:2] == shared and sched.allocator.refs[0, shared].tolist() == [3, 3]


def test_growth_finish_and_page_release():
    sched = make([3, 3], k=2, limit=6, slots=2, pages=8)
    assert sched.take_refill(0).placements == ((0, 0), (1, 1))
    plan = sched.plan_chunk(in_flight=0)  # rows of 2 cached tokens reach 2 + CHUNK = 4: one page
    assert plan.num_pages.tolist() == [1, 1] and sched.allocator.used == 2
    plan2 = sched.plan_chunk(in_flight=1)  # one chunk still unread: pages up to 2 + 2 * CHUNK = 6 tokens
    assert plan2.num_pages.tolist() == [2, 2]
    np.testing.assert_array_equal(plan2.page_table[:, :2], [sched.slot_pages[0], sched.slot_pages[1]])
    assert chunk_out(sched, plan, [[4, 9], [5, 6]], [True, False]).tolist() == [0]  # row 0 stopped on 9
    assert sched.stopped[0] and sched.lengths.tolist()[:2] == [2, 2] and sched.allocator.used == 2
    np.testing.assert_allclose(sched.logprobs[0, :2], [2.0, 4.5])
    # Slot 0 is free: the next refill (prompt 1's two rows wait; one slot) is not a whole group.
    assert sched.take_refill(1).placements == ()
    chunk_out(sched, plan2, [[], [7, 8]], [True, False])  # slot 0's row already finished: ignored
    assert sched.tokens[1, :4].tolist() == [5, 6, 7, 8] and sched.finished.tolist() == [True, False, False, False]


def test_full_pool_pauses_refills_then_admits():
    sched = make([9, 9], k=1, limit=8, slots=2, pages=5)  # 8 cached tokens: 2 pages each, growth 1 more
    assert len(sched.take_refill(0).placements) == 1  # the second row's prompt + growth does not fit beside the first's
    plan = sched.plan_chunk(0)
    chunk_out(sched, plan, [[1, 2], []], [True, False])
    assert sched.allocator.used == 0 and sched.take_refill(0).placements == ((0, 1),)


def test_youngest_row_is_preempted_and_its_stale_outputs_dropped():
    sched = make([5, 5], k=1, limit=8, slots=2, pages=5)  # each row grows to 4 + 8 = 12 tokens: 3 pages
    assert len(sched.take_refill(0).placements) == 2  # 1 page each now, growth fits
    first = sched.plan_chunk(0)
    chunk_out(sched, first, [[1, 2], [3, 4]], [False, False])
    second = sched.plan_chunk(1)  # both rows need a third page, one is left: the younger gives way
    assert sched.preemptions == 1 and list(sched.waiting) == [1] and sched.slot_row.tolist() == [0, -1]
    assert second.kill.tolist() == [False, True] and second.slot_rows.tolist() == [0, -1]
    assert sched.lengths[1] == 0 and len(sched.slot_pages[0]) == 3
    chunk_out(sched, second, [[5, 6], [7, 8]], [False, False])  # row 1's tokens from before the preemption
    assert sched.tokens[0, :4].tolist() == [1, 2, 5, 6] and sched.lengths[1] == 0
    assert sched.plan_chunk(0).kill.tolist() == [False, False]  # a kill is sent once


def test_groups_stay_on_one_shard_and_a_row_that_cannot_fit_is_refused():
    sched = make([6, 6], k=2, limit=2, slots=4, pages=8, shards=2)
    refill = sched.take_refill(0)
    shard_of = {row: slot // 2 for slot, row in refill.placements}
    assert shard_of[0] == shard_of[1] != shard_of[2] == shard_of[3]
    assert all(isinstance(w, PrefillWrite) for w in refill.writes)
    with pytest.raises(ValueError, match="kv_pool_tokens"):
        make([30], k=1, limit=10, slots=1, pages=8)  # 39 cached tokens: 10 pages > 8


def test_work_bucket_has_four_sizes_per_octave_and_pads_at_most_a_fifth():
    sizes = [work_bucket(e) for e in range(1, 4097)]
    assert all(b >= e and (b - e) * 5 <= b for e, b in enumerate(sizes, start=1))
    assert sizes == sorted(sizes)  # monotone: more pages never get a smaller list
    assert sorted(set(sizes) & set(range(257, 513))) == [320, 384, 448, 512]
    assert [work_bucket(e) for e in (1, 8, 9, 33, 129)] == [1, 8, 10, 40, 160]
