"""Test set-up: 8 simulated CPU devices for sharding tests, and the `slow` marker."""

import os

# Must happen before jax is imported anywhere (subprocesses inherit them): sharding tests run
# on 8 simulated devices, and XLA:CPU compiles its machine code unoptimised (LLVM -O0). Tests
# run tiny programs once or twice, so compiling dominates: -O0 takes about a fifth off the
# suite (16.5 -> 13.3 min on a 2-core AVX2 host, 2026-12-06). XLA's own HLO passes all still
# run, so a test checks the same program a run executes; only LLVM's codegen differs
# (tests/test_xla_test_settings.py holds a model's optimised HLO equal at both levels). A
# value already in XLA_FLAGS wins (e.g. `--xla_backend_optimization_level=3` to test
# what a run's optimised code computes).
_TEST_XLA_FLAGS = {"--xla_force_host_platform_device_count": "8", "--xla_backend_optimization_level": "0"}
_given = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join([_given, *(f"{flag}={value}" for flag, value in _TEST_XLA_FLAGS.items()
                                              if flag not in _given)]).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pathlib

import pytest

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


# The longest files (`--durations`), run first: with pytest-xdist's `--dist loadfile` (how
# `launch/local.sh test` runs) each file stays on one worker, so a long file started last
# would leave the other workers idle at the end.
LONGEST_FILES = ("sgs/test_faults.py", "parallel/test_aot_plan.py", "sgs/test_learning.py", "sgs/test_run.py",
                 "sgs/test_experiments_smoke.py", "sgs/test_conjecture_checks.py", "sgs/test_evaluation.py")


def _file_rank(item) -> int:
    path = item.path.as_posix()
    return next((i for i, name in enumerate(LONGEST_FILES) if path.endswith("tests/" + name)), len(LONGEST_FILES))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_file_rank)  # stable: the order within a file and among the rest is kept
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: pass --runslow to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


# The directory `tests/sgs/run_support.py` gives every SGS run a test starts (in process or as
# a subprocess, which inherits the environment) as `run.compile_cache_dir`.
COMPILE_CACHE_ENV = "SGS_TEST_COMPILE_CACHE"


@pytest.fixture(scope="session", autouse=True)
def shared_compile_cache(tmp_path_factory):
    """One persistent compilation cache per test worker (a worker runs one test at a time,
    so no two processes write an entry at once): the SGS loop tests build dozens of runs of
    the same nano models, whose programs would otherwise be compiled again by each."""
    directory = tmp_path_factory.getbasetemp() / "compile_cache"
    os.environ[COMPILE_CACHE_ENV] = str(directory)
    yield directory
    os.environ.pop(COMPILE_CACHE_ENV, None)


@pytest.fixture
def d3k_path():
    """Path to the real D3k target set beside the checkout; skips when it is absent."""
    path = SHARED_DATA / "d3k" / "D_3k_prover_dataset.json"
    if not path.exists():
        pytest.skip("D3k data not present at ../shared/data/d3k")
    return path
