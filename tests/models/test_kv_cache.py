"""Prefill + step-by-step decode through the KV cache equals one full forward pass (fp32, 1e-5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgs_jax.models import KVCache, create_model, tiny

TOL = 1e-5


def _setup(rope_scaling=()):
    config = tiny(rope_scaling=rope_scaling)
    model = create_model(config, seed=3)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, config.vocab_size, size=(3, 12)).astype(np.int32)
    return config, model, ids


def _padded(ids, lengths, side):
    """Prompt batch where row b holds its first lengths[b] tokens, padded left or right."""
    b, t = ids.shape
    prompt_len = max(lengths)
    out = np.zeros((b, prompt_len), np.int32)
    mask = np.zeros((b, prompt_len), bool)
    for row, n in enumerate(lengths):
        sl = slice(prompt_len - n, prompt_len) if side == "left" else slice(0, n)
        out[row, sl] = ids[row, :n]
        mask[row, sl] = True
    return out, mask


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("rope", [(), (("factor", 2.0), ("rope_type", "linear"))])
def test_prefill_then_decode_equals_full_forward(side, rope):
    config, model, ids = _setup(rope)
    lengths = [5, 8, 3]
    total = 12
    prompt, mask = _padded(ids, lengths, side)
    cache = KVCache.create(config, batch=3, max_len=8 + 9)  # prompt + longest decode
    step = jax.jit(lambda m, x, c, am: m.forward_cached(x, c, am))
    logits, cache = step(model, jnp.asarray(prompt), cache, jnp.asarray(mask))
    # Prompt logits: each row's real tokens against the unpadded full forward.
    for row, n in enumerate(lengths):
        full = np.asarray(model(jnp.asarray(ids[row : row + 1, :total])))[0]
        got = np.asarray(logits[row])[mask[row]]
        np.testing.assert_allclose(got, full[:n], atol=TOL, rtol=0)
    # Decode the rest of each row one token at a time (rows advance in lockstep).
    steps = total - min(lengths)
    decoded = [[] for _ in lengths]
    for s in range(steps):
        tok = np.array([[ids[row, min(lengths[row] + s, total - 1)]] for row in range(3)], np.int32)
        live = np.array([[lengths[row] + s < total] for row in range(3)])
        out, cache = step(model, jnp.asarray(tok), cache, jnp.asarray(live))
        for row in range(3):
            if live[row, 0]:
                decoded[row].append(np.asarray(out[row, 0]))
    for row, n in enumerate(lengths):
        full = np.asarray(model(jnp.asarray(ids[row : row + 1, :total])))[0]
        np.testing.assert_allclose(np.stack(decoded[row]), full[n:total], atol=TOL, rtol=0)


def test_right_padding_is_overwritten_and_end_tracks_real_tokens():
    config, model, ids = _setup()
    prompt, mask = _padded(ids, [4, 6, 2], "right")
    cache = KVCache.create(config, batch=3, max_len=10)
    _, cache = model.forward_cached(jnp.asarray(prompt), cache, jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(cache.end), [4, 6, 2])
    np.testing.assert_array_equal(np.asarray(cache.num_tokens()), [4, 6, 2])


def test_repeat_and_reset_rows():
    config, model, ids = _setup()
    cache = KVCache.create(config, batch=1, max_len=8)
    _, cache = model.forward_cached(jnp.asarray(ids[:1, :4]), cache)
    many = cache.repeat_rows(3)
    assert many.batch_size == 3
    np.testing.assert_array_equal(np.asarray(many.keys[:, 2]), np.asarray(cache.keys[:, 0]))
    reset = many.reset_rows(jnp.array([False, True, False]))
    np.testing.assert_array_equal(np.asarray(reset.num_tokens()), [4, 0, 4])
    np.testing.assert_array_equal(np.asarray(reset.end), [4, 0, 4])
