"""The CPU benchmarks still run end to end against the project's current types (a tiny
size, one timing each: their figures are not checked here, only that both sides ran and a
ratio was printed)."""

import importlib.util
import pathlib

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_step_benchmark_runs_both_sides(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    _module("train_step").main(["--seq", "32", "--steps", "1", "--repeats", "1", "--batch", "2", "--micro", "1"])
    out = capsys.readouterr().out
    assert "sgs_jax Trainer (JAX, jitted)" in out and "transformers + torch.optim.Adam" in out
    assert "ratio (ours / reference tokens/s):" in out
