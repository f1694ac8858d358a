"""The native CPU kernels' build on first use: a cached library per (source, flags,
compiler, jaxlib, CPU), and a clear fallback when no compiler works."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sgs_jax import native_build
from sgs_jax.models import attention, native
from sgs_jax.models.attention import AttentionMask, select_backend
from sgs_jax.models.paged_attention import select_paged_backend
from tests.models.native_support import use_portable_build

KERNELS = (native.paged_attention_target, native.flash_attention_targets)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty kernel cache and a forgotten registration (restored afterwards)."""
    monkeypatch.setenv("SGS_JAX_KERNEL_CACHE", str(tmp_path / "kernels"))
    for kernel in KERNELS:
        kernel.cache_clear()
    yield tmp_path / "kernels"
    for kernel in KERNELS:
        kernel.cache_clear()


@pytest.mark.parametrize("source", ["paged_attention.cc", "flash_attention.cc"])
def test_builds_once_into_the_cache(fresh, source):
    if native_build.compiler() is None:
        pytest.skip("no C++ compiler here")
    source = native._SOURCE_DIR / source
    first = native_build.build(source, native_build.compiler())
    assert first.parent == fresh and first.suffix == ".so" and first.stat().st_size > 0
    mtime = first.stat().st_mtime_ns
    assert native_build.build(source, native_build.compiler()) == first and first.stat().st_mtime_ns == mtime  # cached, not rebuilt
    assert [p.name for p in fresh.iterdir()] == [first.name]  # no partial files left behind


def test_a_failing_compiler_falls_back_to_the_gather(fresh, monkeypatch, caplog, tmp_path):
    broken = tmp_path / "broken-c++"
    broken.write_text("#!/bin/sh\necho 'broken compiler' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    with caplog.at_level(logging.WARNING, logger="sgs_jax"):
        assert native.paged_attention_target() is False
        assert native.flash_attention_targets() is False
    assert "broken compiler" in caplog.text and "XLA path" in caplog.text
    assert select_paged_backend("auto", "cpu") == "gather"
    assert select_backend("auto", "cpu", AttentionMask(), jnp.float32) == "blockwise"
    assert not list(fresh.glob("*.so")) and not list(fresh.glob("*.partial"))


def test_no_compiler_falls_back_to_the_gather(fresh, monkeypatch, caplog):
    monkeypatch.setattr(native_build, "compiler", lambda: None)
    with caplog.at_level(logging.WARNING, logger="sgs_jax"):
        assert native.paged_attention_target() is False
    assert "no C++ compiler" in caplog.text
    assert select_paged_backend("auto", "cpu") == "gather"
    assert select_backend("auto", "cpu", AttentionMask(), jnp.float32) == "blockwise"
    assert select_paged_backend("auto", "tpu") == "pallas_tpu"  # other platforms never ask
    with pytest.raises(ValueError, match="CPU only"):
        select_paged_backend("native", "gpu")


def test_loading_the_kernels_keeps_denormals():
    """A library built with -ffast-math would switch the whole process to flush-to-zero
    when loaded; the kernels must leave every other computation's numerics alone."""
    import numpy as np

    if not (native.paged_attention_target() and native.flash_attention_targets()):
        pytest.skip("the native kernels could not be built here")
    tiny = np.float32(1e-40)  # a denormal
    assert tiny * np.float32(1.0) > 0 and np.float32(2e-40) - tiny > 0


def _packed_attention(dim, seed=0):
    """Outputs and q/k/v gradients of the native backend on packed rows (3 rows x 150
    tokens, 4 query / 2 KV heads, segments of 1-90 tokens, trailing padding)."""
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(3, 150, h, dim)), jnp.float32) for h in (4, 2, 2))
    segments = np.zeros((3, 150), np.int32)
    for row in range(3):
        pos, seg = 0, 1
        while pos < 150 - 7 * row:
            n = min(int(rng.integers(1, 91)), 150 - 7 * row - pos)
            segments[row, pos : pos + n], pos, seg = seg, pos + n, seg + 1
    mask = AttentionMask(segment_ids=jnp.asarray(segments))
    weight = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
    fn = lambda q, k, v: attention.native(q, k, v, mask)  # noqa: E731
    loss = lambda q, k, v: jnp.sum(fn(q, k, v) * weight)  # noqa: E731
    return [np.asarray(x) for x in (jax.jit(fn)(q, k, v), *jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))]


def test_the_portable_build_of_the_training_kernels_equals_the_host_build(monkeypatch, tmp_path):
    """The flash kernels built without -march=native (the fallback build: baseline vectors,
    the register blocks for 16 registers, which an AVX-512 host's own build never runs) give
    the host build's outputs and gradients (fp32, 1e-5) for every head-dim path."""
    if not native.flash_attention_targets():
        pytest.skip("the native kernels could not be built here")
    dims = (16, 32, 64, 128)  # one vector of 16 per 16 dims: DV 1, 2, 4, 8
    host = {dim: _packed_attention(dim) for dim in dims}
    use_portable_build(monkeypatch, tmp_path, "flash_attention.cc",
                       {"FLASH_FORWARD": "SgsFlashAttentionForward", "FLASH_BACKWARD": "SgsFlashAttentionBackward"})
    for dim in dims:
        for got, want in zip(_packed_attention(dim), host[dim]):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"head dim {dim}")
