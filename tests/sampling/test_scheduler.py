"""Host-side slot bookkeeping of continuous batching, without a model."""

import numpy as np

from sgs_jax.sampling.scheduler import Row, SlotScheduler


def test_refill_waits_for_a_whole_group_and_collects_tokens():
    rows = [Row(p, s, limit=3, prompt_len=p + 2) for p in range(3) for s in range(2)]  # 3 prompts x k=2
    sched = SlotScheduler(num_slots=3, rows=rows, group_size=2, stop_ids=[9])
    assert sched.take_refill() == [(0, 0), (1, 1), (2, 2)]
    assert sched.exit_threshold() == 2  # 3 rows wait: hand back once 2 slots are free
    assert sched.cache_extent() == 2  # row 2: prompt of 3 tokens, 2 cached before decoding
    # Chunk: slot 0 stops on token 9 after 2 tokens, slot 1 runs on, slot 2 hits its limit.
    tokens = np.array([[4, 9, 0], [5, 6, 7], [1, 2, 3]])
    done = np.array([True, False, True])
    taken = sched.absorb(tokens, tokens * 0.5, tokens * 0.25, np.array([2, 3, 3]), done)
    assert taken == 8
    assert [(f.row.prompt_index, f.token_ids, f.finish_reason) for f in sched.finished] == [(0, (4, 9), "stop"), (1, (1, 2, 3), "length")]
    assert sched.finished[0].logprobs == (2.0, 4.5)
    assert sched.take_refill() == [(0, 3), (2, 4)]
    assert sched.exit_threshold() == 1
    assert sched.cache_extent() == 2 - 1 + 3  # slot 1: prompt of 2 (1 cached) + 3 generated
    # Slot 1 had 3 tokens already: a later chunk appends only its new ones.
    sched.absorb(np.array([[1, 0, 0], [8, 0, 0], [2, 0, 0]]), np.zeros((3, 3)), np.zeros((3, 3)), np.array([1, 4, 1]), np.array([True, True, True]))
    assert [f.token_ids for f in sched.finished][-3:] == [(1,), (5, 6, 7, 8), (2,)]
    assert sched.take_refill() == [(0, 5)] and sched.exit_threshold() == 4  # nothing waits: never early
    sched.absorb(np.array([[9], [0], [0]]), np.zeros((3, 1)), np.zeros((3, 1)), np.array([1, 0, 0]), np.array([True, True, True]))
    assert sched.all_done and len(sched.finished) == 6
