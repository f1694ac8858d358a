"""Test set-up: 8 simulated CPU devices for sharding tests, and the `slow` marker."""

import os

# Must happen before jax is imported anywhere: sharding tests run on 8 simulated devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pathlib

import pytest

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: pass --runslow to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.fixture
def d3k_path():
    """Path to the real D3k target set beside the checkout; skips when it is absent."""
    path = SHARED_DATA / "d3k" / "D_3k_prover_dataset.json"
    if not path.exists():
        pytest.skip("D3k data not present at ../shared/data/d3k")
    return path
