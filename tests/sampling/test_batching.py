"""Continuous batching over the paged pool: results independent of slots, chunking, page
size and pool size (preemption included), stop handling, length caps, the columnar output,
compiled-program reuse, and clear errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from sgs_jax.models import native, tiny
from sgs_jax.sampling import Completions, PromptError, Sampler, SamplingParams
from tests.sampling.conftest import BUCKETS, random_model, token_lists
from tests.sampling.reference import entropy, full_logits, warped_probs

PLAIN = SamplingParams(temperature=1.0, max_new_tokens=10, num_samples=3, max_total_len=64, seed=4)


def test_results_do_not_depend_on_slots_chunks_pages_or_pool(model, sampler, prompts):
    prompts = [p for p in prompts if len(p) <= 8]  # one prefill bucket: fewer programs to compile
    a = sampler.generate(model, prompts, PLAIN)
    # 2 slots, 3-step chunks, pages of 8 tokens in a pool of 3 pages: two rows of up to 13
    # cached tokens (2 pages each) cannot both grow, so the younger is preempted and
    # recomputed from scratch later.
    other = Sampler(model.config, max_batch=2, prompt_buckets=BUCKETS, chunk_steps=3, page_size=8, kv_pool_tokens=24)
    done = []  # (prompt, its rows) per on_prompt_done call
    b = other.generate(model, prompts, PLAIN, on_prompt_done=lambda i, c: done.append((i, c)))
    assert other.last_stats.preemptions > 0 and other.last_stats.peak_pages <= 3
    assert token_lists(a) == token_lists(b)
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
    np.testing.assert_allclose(b.entropies, a.entropies, atol=1e-5)
    # Each prompt reported once, as soon as its 3 samples finished, with the returned rows.
    assert sorted(i for i, _ in done) == list(range(len(prompts)))
    for i, rows in done:
        assert rows.prompt_index.tolist() == [i] * 3 and rows.sample_index.tolist() == [0, 1, 2]
        np.testing.assert_array_equal(rows.token_ids, b.select(b.rows_of(i)).token_ids)
    assert other.last_stats.num_slots == 2 and other.last_stats.refills >= 4
    # A different seed changes the samples; samples of one prompt differ from each other.
    d = sampler.generate(model, prompts, dataclasses.replace(PLAIN, seed=5))
    assert token_lists(d) != token_lists(a)
    assert len({tuple(x) for x in token_lists(a)[0]}) == 3


def test_samples_share_prompt_pages(model, prompts):
    """k samples of a 20-token prompt: its 19 cached tokens are 4 full pages of 4, shared,
    and a partial last page copied per sample: 4 + 8 pages before any growth, not 8 x 5."""
    s = Sampler(model.config, max_batch=8, prompt_buckets=BUCKETS, chunk_steps=4, page_size=4, kv_pool_tokens=256)
    params = SamplingParams(temperature=1.0, max_new_tokens=1, num_samples=8, max_total_len=64, seed=1, stop_token_ids=())
    out = s.generate(model, [prompts[2]], params)
    assert s.last_stats.peak_pages == 4 + 8  # one new token fits in the copied partial page
    assert s.last_stats.prefill_real_tokens == 19  # one prefill for the 8 samples
    np.testing.assert_allclose(out.entropies[:, 0], entropy(full_logits(model, prompts[2])[-1:]).repeat(8), atol=1e-4)


def test_page_counters_bound_the_pages_attention_needs(model, prompts):
    """One row of P prompt tokens and N new ones: at step t it attends over P + t positions,
    so it holds at least ceil((P + t) / page) pages; the gather backend's work list covers
    what it holds."""
    s = Sampler(model.config, max_batch=1, prompt_buckets=BUCKETS, chunk_steps=4, page_size=4, kv_pool_tokens=256,
                paged_attention="gather")
    n, prompt = 9, prompts[2]
    s.generate(model, [prompt], SamplingParams(temperature=1.0, max_new_tokens=n, max_total_len=64, seed=1, stop_token_ids=()))
    stats, p = s.last_stats, len(prompt)
    assert stats.decode_steps == n
    needed = sum(-(-(p + t) // 4) for t in range(n))
    assert needed <= stats.held_page_steps <= n * -(-(p + n) // 4)
    assert stats.held_page_steps <= stats.work_page_steps and 0.0 <= stats.attention_padding < 1.0


def test_a_long_row_does_not_idle_the_slots_refilled_beside_it(model, prompts):
    """Two slots: one row of 16 new tokens beside three of 4, run one after another in the
    other slot. The chunk queued behind the one in which a short row finished must end at
    once (the host has a row to start there), not run its 4 steps with that slot idle: the
    call takes the long row's 16 steps; with a chunk idled after each short row, the last
    short row would end at step 20 (as it did before the fix)."""
    s = Sampler(model.config, max_batch=2, prompt_buckets=BUCKETS, chunk_steps=4, page_size=4, kv_pool_tokens=256)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, max_total_len=64, seed=1, stop_token_ids=())
    short = [p for p in prompts if len(p) <= 8][:1] * 3
    out = s.generate(model, [prompts[0]] + short, params, max_new_tokens_per_prompt=[16, 4, 4, 4])
    assert out.lengths.tolist() == [16, 4, 4, 4]
    assert s.last_stats.decode_steps == 16 and s.last_stats.refills >= 3


def test_completions_are_columnar_and_frozen(model, sampler, prompts):
    out = sampler.generate(model, prompts, PLAIN)
    n = len(prompts) * 3
    assert len(out) == n and out.token_ids.shape == out.logprobs.shape == out.entropies.shape == (n, int(out.lengths.max()))
    assert (out.token_ids.dtype, out.logprobs.dtype, out.stopped.dtype) == (np.int32, np.float32, bool)
    assert out.prompt_index.tolist() == [p for p in range(len(prompts)) for _ in range(3)]  # prompt-major
    assert out.sample_index.tolist() == [0, 1, 2] * len(prompts)
    mask = np.arange(out.token_ids.shape[1])[None, :] >= out.lengths[:, None]
    assert not out.token_ids[mask].any() and not out.logprobs[mask].any()
    with pytest.raises(ValueError):
        out.token_ids[0, 0] = 5  # read-only
    assert out.texts is None and out.text(0) is None
    assert len(Completions.empty()) == 0


def test_stop_tokens_end_rows_and_are_kept(model, sampler, prompts):
    greedy = SamplingParams(temperature=0, max_new_tokens=12, num_samples=3, max_total_len=64, stop_token_ids=())
    free = token_lists(sampler.generate(model, prompts, greedy))[0][0]
    stop = free[3]
    first = free.index(stop)
    out = sampler.generate(model, prompts, dataclasses.replace(greedy, stop_token_ids=(stop,)))
    assert out.tokens(0).tolist() == free[: first + 1] and out.finish_reasons[0] == "stop"
    for row in range(len(out)):
        tokens = out.tokens(row).tolist()
        assert stop not in tokens[:-1]
        assert out.stopped[row] == (tokens[-1] == stop)


def test_total_length_cap_and_per_prompt_caps(model, sampler, prompts):
    capped = sampler.generate(model, prompts, SamplingParams(max_new_tokens=12, num_samples=3, max_total_len=24, stop_token_ids=()))
    for row in range(len(capped)):
        assert capped.lengths[row] == min(12, 24 - len(prompts[capped.prompt_index[row]])) and not capped.stopped[row]
    caps = [1, 5, 3, 12]
    out = sampler.generate(model, prompts, dataclasses.replace(PLAIN, stop_token_ids=()), max_new_tokens_per_prompt=caps)
    assert out.lengths.tolist() == [cap for cap in caps for _ in range(3)]
    st = sampler.last_stats
    assert st.generated_tokens == 3 * sum(caps) and 0 <= st.decode_waste < 1
    assert st.slot_steps == st.decode_steps * st.num_slots and st.prefill_real_tokens <= st.prefill_tokens


def test_fresh_weights_reuse_compiled_programs_in_their_own_form(model, sampler, prompts):
    greedy = SamplingParams(temperature=0, max_new_tokens=6, num_samples=3, max_total_len=64)
    sampler.generate(model, prompts, greedy)
    compiled = (sampler._decode._cache_size(), sampler._insert._cache_size())
    other = random_model(model.config, seed=11)
    out = sampler.generate(other, prompts, greedy)  # a Llama; an nnx.State works the same
    assert (sampler._decode._cache_size(), sampler._insert._cache_size()) == compiled
    assert out.tokens(0)[0] == int(np.argmax(full_logits(other, prompts[0])[-1]))
    # bf16 weights are used as they come (not cast back per call): one more compile each,
    # then reused; tokens follow the bf16 weights' own argmax.
    state = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), nnx.state(other))
    low = sampler.generate(state, prompts, greedy)
    again = sampler.generate(state, prompts, greedy)
    assert sampler._decode._cache_size() == compiled[0] + 1
    assert token_lists(low) == token_lists(again)


def test_row_count_and_prompt_lengths_do_not_change_the_programs(model, sampler, prompts):
    """Calls of one role differ in rows (prompts x k) and prompt lengths; once each prefill
    form (one prompt, several) has run, none of them compiles anything new."""
    short = [p for p in prompts if len(p) <= 8]  # one prompt bucket
    params = SamplingParams(temperature=1.0, max_new_tokens=6, num_samples=3, max_total_len=64, seed=2)
    sampler.generate(model, short, params)
    sampler.generate(model, short[:1], dataclasses.replace(params, num_samples=1))

    def compiled():
        return sampler._empty._cache_size(), sampler._insert._cache_size(), sampler._decode._cache_size()

    before = compiled()
    for rows, k in ((short[1:], 2), (short[:1], 1), (short[::-1], 1), (short[:2], 3)):
        sampler.generate(model, rows, dataclasses.replace(params, num_samples=k, seed=k))
        assert sampler.last_stats.num_slots == sampler.max_batch
    assert compiled() == before


def test_a_kept_pool_gives_the_same_samples_without_allocating(model, sampler, prompts):
    """Inside `keep_pool` the second call reuses the first call's pool, stale pages and
    all, and samples exactly what a fresh pool gives; outside it each call allocates."""
    params = SamplingParams(temperature=1.0, max_new_tokens=12, num_samples=3, max_total_len=64, seed=7)
    fresh = [sampler.generate(model, prompts[::-1], params), sampler.generate(model, prompts, dataclasses.replace(params, seed=8))]
    allocations = []
    allocate = sampler._empty
    sampler._empty = lambda *a: allocations.append(a) or allocate(*a)
    try:
        with sampler.keep_pool():
            kept = [sampler.generate(model, prompts[::-1], params), sampler.generate(model, prompts, dataclasses.replace(params, seed=8))]
            assert sampler._kept_state is not None
        assert sampler._kept_state is None  # released when the block exits
        sampler.generate(model, prompts[:1], params)
    finally:
        sampler._empty = allocate
    assert len(allocations) == 2  # the block's first call, and the call after the block
    for a, b in zip(fresh, kept):
        assert token_lists(a) == token_lists(b)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
        np.testing.assert_array_equal(a.entropies, b.entropies)


def test_the_native_kernel_starts_from_an_unwritten_pool_and_never_reads_it(model, sampler, prompts):
    """For the native kernel a new pool is left unwritten (no zero-fill program); whatever
    the memory holds, here NaN in every position, the samples are those of a zero pool,
    since the kernel reads no position its row has not written. The gather backend still
    zero-fills: it multiplies masked positions by zero."""
    if not native.paged_attention_target():
        pytest.skip("the native CPU kernel could not be built here (no C++ compiler?)")
    assert sampler.attention_backend == "native"
    num_slots, num_pages = sampler.max_batch, 64
    assert native.UNWRITTEN_POOL in sampler._empty.lower(num_slots, num_pages, sampler.page_size).as_text()
    gather = Sampler(model.config, max_batch=8, prompt_buckets=BUCKETS, chunk_steps=4, page_size=4, kv_pool_tokens=256,
                     paged_attention="gather")
    gather_empty = gather._empty.lower(num_slots, num_pages, gather.page_size).as_text()
    assert native.UNWRITTEN_POOL not in gather_empty and "broadcast" in gather_empty

    params = SamplingParams(temperature=1.0, max_new_tokens=12, num_samples=3, max_total_len=64, seed=9)
    fresh = sampler.generate(model, prompts, params)
    allocate = sampler._empty

    def poisoned(*shape):
        state = allocate(*shape)
        nan = lambda x: jnp.full(x.shape, jnp.nan, x.dtype)  # noqa: E731
        return dataclasses.replace(state, pool=type(state.pool)(nan(state.pool.keys), nan(state.pool.values)))

    sampler._empty = poisoned
    try:
        out = sampler.generate(model, prompts, params)
    finally:
        sampler._empty = allocate
    assert token_lists(out) == token_lists(fresh)
    np.testing.assert_array_equal(out.logprobs, fresh.logprobs)
    np.testing.assert_array_equal(out.entropies, fresh.entropies)


def test_first_token_frequencies_through_the_engine(model, sampler):
    """2000 one-token samples of one prompt through prefill, refills and decode match the
    top-p/temperature distribution of the full-forward logits (chi-square, fixed seed)."""
    prompt = [1, 5]
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=10, max_new_tokens=1, num_samples=2000, max_total_len=64, seed=2)
    out = sampler.generate(model, [prompt], params)
    tokens = out.token_ids[:, 0]
    expected = warped_probs(full_logits(model, prompt)[-1], 0.8, 10, 0.9)
    counts = np.bincount(tokens, minlength=expected.size)
    assert counts[expected == 0].sum() == 0
    support = expected > 0
    assert support.sum() >= 3, "the test needs a spread distribution"
    _, p_value = stats.chisquare(counts[support], len(tokens) * expected[support])
    assert p_value > 1e-3
    untempered = warped_probs(full_logits(model, prompt)[-1], 1.0, 10, 0.9)  # power check
    assert stats.chisquare(counts[support], len(tokens) * untempered[support] / untempered[support].sum())[1] < 1e-6


def test_bad_prompts_parameters_and_pools_are_clear_errors(model, sampler):
    with pytest.raises(PromptError) as info:
        sampler.generate(model, [[1, 5], [], [1] * 70, [1, 500], [1.5, 2]], PLAIN)
    assert set(info.value.problems) == {1, 2, 3, 4}
    assert "empty" in info.value.problems[1] and "max_total_len" in info.value.problems[2]
    assert "outside" in info.value.problems[3] and "integers" in info.value.problems[4]
    assert len(sampler.generate(model, [], PLAIN)) == 0
    with pytest.raises(ValueError, match="config differs"):
        sampler.generate(random_model(tiny(num_layers=1)), [[1, 2]], PLAIN)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="one cap"):
        sampler.generate(model, [[1, 2]], PLAIN, max_new_tokens_per_prompt=[1, 2])
    small = Sampler(model.config, max_batch=2, prompt_buckets=BUCKETS, page_size=4, kv_pool_tokens=16)
    assert len(small.generate(model, [[1, 2, 3]], PLAIN)) == 3  # rows of up to 2 + 10 cached tokens: 3 pages of 4
    with pytest.raises(ValueError, match="kv_pool_tokens"):
        small.generate(model, [[1, 2, 3]], dataclasses.replace(PLAIN, max_new_tokens=20))  # 22 tokens: 6 pages > 4
    with pytest.raises(ValueError, match="kv_pool_tokens"):
        Sampler(model.config, page_size=4, kv_pool_tokens=3)


def test_cpu_decode_backends_sample_alike(model, sampler, prompts):
    """The native CPU kernel (the CPU default where it builds) and the XLA gather backend
    give the same tokens for the same seed, log-probs and entropies within 1e-5; only the
    gather backend walks a padded work list."""
    if not native.paged_attention_target():
        pytest.skip("the native CPU kernel could not be built here (no C++ compiler?)")
    assert sampler.attention_backend == "native"
    gather = Sampler(model.config, max_batch=8, prompt_buckets=BUCKETS, chunk_steps=4, page_size=4, kv_pool_tokens=256,
                     paged_attention="gather")
    prompts = [p for p in prompts if len(p) <= 8]
    a, b = sampler.generate(model, prompts, PLAIN), gather.generate(model, prompts, PLAIN)
    assert token_lists(a) == token_lists(b)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    np.testing.assert_allclose(a.entropies, b.entropies, atol=1e-5)
    assert sampler.last_stats.work_page_steps == 0 < gather.last_stats.work_page_steps
    with pytest.raises(ValueError, match="paged_attention"):
        Sampler(model.config, paged_attention="flash")


def test_decode_chunk_fuses_projection_kernels_once_outside_its_loops():
    """On one device the cached forward multiplies by Q/K/V and gate/up kernels
    concatenated (`FusedProjections`); in the compiled decode chunk those concatenations
    sit in the entry computation, once per call, not in the step loop's body."""
    import re

    config = tiny(num_layers=3, hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16)
    sampler = Sampler(config, max_batch=4, kv_pool_tokens=4 * 64, page_size=8, chunk_steps=2)
    text = sampler.lower_decode(sampler.abstract_weights(), 4, 32, 8).compile().as_text()
    fused_shapes = ("[3,64,8,16]", "[3,64,192]")  # qkv: Hq + 2 Hkv = 8 heads; gate_up: 2 x 96
    by_computation = {}
    for block in re.split(r"\n(?=\S[^\n]*\{\n)", text):
        name = block.split("(", 1)[0].strip()
        by_computation[name] = [shape for shape in fused_shapes if re.search(re.escape(shape) + r"\S* concatenate\(", block)]
    entry = [name for name in by_computation if name.startswith("ENTRY")]
    assert entry and sorted(by_computation[entry[0]]) == sorted(fused_shapes), by_computation
    assert all(not found for name, found in by_computation.items() if not name.startswith("ENTRY")), by_computation


def test_a_one_device_mesh_runs_the_plain_programs(model, sampler, prompts):
    """The CPU main job samples on a mesh of its one device. There the engine runs what it
    runs without a mesh (`parallel.rules.multi_device_mesh`): the fused projection kernels,
    the native kernel's unwritten pool, and the same samples bit for bit."""
    from sgs_jax.parallel import make_mesh

    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    on_mesh = Sampler(model.config, mesh=mesh, max_batch=8, prompt_buckets=BUCKETS, chunk_steps=4, page_size=4, kv_pool_tokens=256)
    assert on_mesh.attention_backend == sampler.attention_backend
    decode = on_mesh.lower_decode(on_mesh.abstract_weights(), 8, 32, 4).as_text()
    plain = sampler.lower_decode(sampler.abstract_weights(), 8, 32, 4).as_text()
    assert decode.count("concatenate") == plain.count("concatenate") > 0  # FusedProjections, as without a mesh
    if sampler.attention_backend == "native":
        assert native.UNWRITTEN_POOL in on_mesh._empty.lower(8, 64, 4).as_text()
    out, expected = on_mesh.generate(model, prompts, PLAIN), sampler.generate(model, prompts, PLAIN)
    np.testing.assert_array_equal(out.token_ids, expected.token_ids)
    np.testing.assert_array_equal(out.logprobs, expected.logprobs)
