"""The host allocator setting (`parallel/host_memory.py`): large blocks kept for reuse stop
XLA:CPU's per-call scratch from being faulted in again on every call, with the malloc
family's contracts kept; a bad value is refused."""

import os
import subprocess
import sys
import textwrap

import pytest

from sgs_jax import native_build
from sgs_jax.parallel.host_memory import configure_host_malloc, large_block_stats

needs_preload = pytest.mark.skipif(not sys.platform.startswith("linux") or native_build.compiler() is None,
                                   reason="LD_PRELOAD of a library built with the host's C++ compiler (Linux)")

# A program whose temporaries (64 MiB each) exceed glibc's mmap threshold; after 5 warm-up
# calls, the median minor page faults of 15 more. Also: whether the process runs with the
# library (it restarted itself), whether the library reused blocks, and whether it took
# itself out of the environment its subprocesses inherit.
_PROBE = textwrap.dedent("""
    import os, resource, statistics, sys
    from sgs_jax.parallel.host_memory import configure_host_malloc, large_block_stats
    choice = configure_host_malloc(sys.argv[1], may_restart=True)
    import jax, jax.numpy as jnp
    f = jax.jit(lambda x: jnp.cumsum(jnp.sin(x), axis=0)[-1])
    x = jnp.ones((4096, 4096), jnp.float32)
    faults = []
    for _ in range(20):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        f(x).block_until_ready()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    stats = large_block_stats()
    print(choice.kept, stats is not None and stats.reused >= 15, "large_blocks" in os.environ.get("LD_PRELOAD", ""),
          statistics.median(faults[5:]))
""")


def _probe(setting: str) -> tuple[bool, bool, bool, float]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    env.pop("SGS_HOST_MALLOC", None)
    out = subprocess.run([sys.executable, "-c", _PROBE, setting], env=env, capture_output=True, text=True, timeout=300, check=True)
    kept, reused, inherited, faults = out.stdout.split()[-4:]
    return kept == "True", reused == "True", inherited == "True", float(faults)


@needs_preload
def test_kept_large_blocks_stop_the_per_call_page_faults():
    kept, reused, inherited, faults_kept = _probe("keep")
    system, _, _, faults_system = _probe("system")
    print(f"minor page faults per call (median): kept {faults_kept:.0f}, system allocator {faults_system:.0f}")
    assert kept and reused and not inherited and not system
    # The system allocator maps each call's scratch afresh: at least the 64 MiB temporary
    # (16,384 pages of 4 KiB); kept, the block comes back already mapped.
    assert faults_system > 16_000
    assert faults_kept < faults_system / 100


# The malloc family's contracts on the library's blocks (over 32 MiB), through libc
# itself: a reused block handed out by calloc is zeroed, realloc keeps the contents either
# way, malloc_usable_size answers for them, posix_memalign refuses a bad alignment, and
# small blocks stay glibc's.
_CONTRACTS = textwrap.dedent("""
    import ctypes, errno, sys
    from sgs_jax.parallel.host_memory import configure_host_malloc, large_block_stats
    assert configure_host_malloc("keep", may_restart=True).kept
    libc = ctypes.CDLL(None)
    for name, res, args in [("malloc", ctypes.c_void_p, [ctypes.c_size_t]), ("calloc", ctypes.c_void_p, [ctypes.c_size_t] * 2),
                            ("realloc", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]), ("free", None, [ctypes.c_void_p]),
                            ("malloc_usable_size", ctypes.c_size_t, [ctypes.c_void_p]),
                            ("posix_memalign", ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t])]:
        getattr(libc, name).restype, getattr(libc, name).argtypes = res, args
    n = 40 << 20
    a = libc.malloc(n)
    ctypes.memset(a, 0xAB, n)
    assert libc.malloc_usable_size(a) >= n
    libc.free(a)
    b = libc.calloc(n // 4, 4)
    assert b == a, "the freed block is handed out again"
    assert ctypes.string_at(b, n) == bytes(n), "calloc zeroes a reused block"
    ctypes.memset(b, 7, n)
    c = libc.realloc(b, 2 * n)  # larger: a new block, contents kept
    assert ctypes.string_at(c, n) == bytes([7]) * n
    d = libc.realloc(c, 1000)  # down to a small block: glibc's, contents kept
    assert ctypes.string_at(d, 1000) == bytes([7]) * 1000
    libc.free(d)
    out = ctypes.c_void_p()
    assert libc.posix_memalign(ctypes.byref(out), 3, n) == errno.EINVAL
    assert libc.posix_memalign(ctypes.byref(out), 4096, n) == 0 and out.value % 4096 == 0
    libc.free(out.value)
    small = libc.malloc(100)
    libc.free(small)
    stats = large_block_stats()
    assert stats.reused >= 2 and stats.mapped >= 2, stats
    print("ok")
""")


@needs_preload
def test_the_library_keeps_the_malloc_contracts():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("SGS_HOST_MALLOC", None)
    out = subprocess.run([sys.executable, "-c", _CONTRACTS], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-1:] == ["ok"], out.stderr[-3000:]


def test_keep_without_a_restart_is_left_at_system_with_the_reason():
    if large_block_stats() is not None:
        pytest.skip("this test process runs with the library preloaded")
    choice = configure_host_malloc("keep", may_restart=False)
    assert not choice.kept and "restart" in choice.why


def test_keep_without_a_compiler_is_left_at_system_without_a_restart(monkeypatch):
    if large_block_stats() is not None:
        pytest.skip("this test process runs with the library preloaded")
    monkeypatch.setattr(native_build, "compiler", lambda: None)
    choice = configure_host_malloc("keep", may_restart=True)  # a restart here would replace pytest
    assert not choice.kept and "did not build" in choice.why


def test_a_failed_restart_is_left_at_system_and_leaves_the_environment_as_it_was(monkeypatch):
    if large_block_stats() is not None:
        pytest.skip("this test process runs with the library preloaded")
    if native_build.compiler() is None:
        pytest.skip("no C++ compiler here")
    monkeypatch.setenv("LD_PRELOAD", "")
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # execv raises instead of replacing pytest
    choice = configure_host_malloc("keep", may_restart=True)
    assert not choice.kept and "restart failed" in choice.why
    assert not os.environ.get("LD_PRELOAD") and "SGS_HOST_MALLOC_RESTARTED" not in os.environ


def test_an_unknown_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="SGS_HOST_MALLOC must be one of"):
        configure_host_malloc("sometimes")
