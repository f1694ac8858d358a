"""The host allocator setting (`parallel/host_memory.py`): a kept heap stops XLA:CPU's
per-call scratch from being faulted in again on every call; a bad value is refused."""

import os
import subprocess
import sys
import textwrap

import pytest

from sgs_jax.parallel.host_memory import configure_host_malloc

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")

# A program whose temporaries (64 MiB each) exceed glibc's mmap threshold; after 5 warm-up
# calls, the median minor page faults of 15 more. The median, since a kept heap still
# faults a call's scratch in now and then (about one call in 30 here: where the heap hands
# out a region not touched before), where the system allocator faults it in on every call.
_PROBE = textwrap.dedent("""
    import resource, statistics, sys
    from sgs_jax.parallel.host_memory import configure_host_malloc
    choice = configure_host_malloc(sys.argv[1])
    import jax, jax.numpy as jnp
    f = jax.jit(lambda x: jnp.cumsum(jnp.sin(x), axis=0)[-1])
    x = jnp.ones((4096, 4096), jnp.float32)
    faults = []
    for _ in range(20):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        f(x).block_until_ready()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(choice.kept, statistics.median(faults[5:]))
""")


def _median_faults_per_call(setting: str) -> tuple[bool, float]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    out = subprocess.run([sys.executable, "-c", _PROBE, setting], env=env, capture_output=True, text=True, timeout=300, check=True)
    kept, faults = out.stdout.split()[-2:]
    return kept == "True", float(faults)


@linux_only
def test_a_kept_heap_stops_the_per_call_page_faults():
    kept, faults_kept = _median_faults_per_call("keep")
    system, faults_system = _median_faults_per_call("system")
    print(f"minor page faults per call (median): kept {faults_kept:.0f}, system allocator {faults_system:.0f}")
    assert kept and not system
    # The system allocator maps each call's scratch afresh: at least the 64 MiB temporary
    # (16,384 pages of 4 KiB); the kept heap reuses it, already mapped.
    assert faults_system > 16_000
    assert faults_kept < faults_system / 100


def test_an_unknown_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="SGS_HOST_MALLOC must be one of"):
        configure_host_malloc("sometimes")
