"""Compile-only TPU devices for deviceless tests; skips the test when libtpu is absent."""

import importlib.util

import pytest


def tpu_devices(topology_name: str = "v5p:2x2x2", **kwargs):
    """The compile-only devices of `topology_name` (libtpu, the `tpu` extra)."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install -e '.[tpu]')")
    from sgs_jax.parallel.aot import topology

    return topology(topology_name, **kwargs).devices
