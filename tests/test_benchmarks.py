"""The CPU benchmarks still run end to end against the project's current types (a tiny
size, one timing each: their figures are not checked here, only that both sides ran and a
ratio was printed)."""

import importlib.util
import os
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _benchmarks_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as `python benchmarks/NAME.py` has it (shared timing.py)


def test_alternated_best_warms_up_then_times_the_sides_in_turn(monkeypatch):
    timing = _module("timing")
    clock, calls = [0.0], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    costs = {"a": iter([5, 3, 3, 9, 9, 4, 4]), "b": iter([7, 2, 2, 6, 6, 8, 8])}  # a warm-up call, then 3 rounds of 2 calls

    def side(name):
        def fn():
            calls.append(name)
            clock[0] += next(costs[name])
        return fn

    best = timing.alternated_best({"a": side("a"), "b": side("b")}, repeats=3, calls=2, warmup=1)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 3  # one warm-up each, then rounds in turn
    assert best == {"a": 3.0, "b": 2.0}  # best seconds per call over the rounds (warm-up excluded)


def test_alternated_rounds_read_the_probe_between_rounds(monkeypatch):
    timing = _module("timing")
    clock, events = [0.0], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    costs = {"a": iter([5, 3, 9, 4]), "b": iter([7, 2, 6, 8])}  # a warm-up call, then 3 rounds of 1 call
    readings = iter([100.0, 450.0, 460.0, 90.0])

    def side(name):
        def fn():
            events.append(name)
            clock[0] += next(costs[name])
        return fn

    def probe():
        events.append("probe")
        return next(readings)

    rounds = timing.alternated_rounds({"a": side("a"), "b": side("b")}, repeats=3, probe=probe)
    assert events == ["a", "b", "probe"] + ["a", "b", "probe"] * 3  # after the warm-up, before and after every round
    assert [r.seconds for r in rounds] == [{"a": 3.0, "b": 2.0}, {"a": 9.0, "b": 6.0}, {"a": 4.0, "b": 8.0}]
    assert [(r.probe_before, r.probe_after) for r in rounds] == [(100.0, 450.0), (450.0, 460.0), (460.0, 90.0)]
    assert timing.best_of(rounds) == {"a": 3.0, "b": 2.0}


def test_core_round_trip_needs_two_cpus():
    timing = _module("timing")
    from sgs_jax import native_build

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or native_build.compiler() is None:
        pytest.skip("needs two CPUs and a C++ compiler")
    ns = timing.core_round_trip_ns(iterations=2_000, batches=2)
    assert ns is not None and 1 < ns < 1e6  # one cache line there and back: tens to hundreds of ns
    os.sched_setaffinity(0, cpus[:1])  # this thread only
    try:
        assert timing.core_round_trip_ns(iterations=2_000, batches=2) is None
    finally:
        os.sched_setaffinity(0, cpus)
    assert sorted(os.sched_getaffinity(0)) == cpus


def test_train_step_benchmark_runs_both_sides(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    _module("train_step").main(["--seq", "32", "--steps", "1", "--repeats", "1", "--batch", "2", "--micro", "1"])
    out = capsys.readouterr().out
    assert "sgs_jax Trainer (JAX, jitted; defaults)" in out and "transformers + torch.optim.Adam" in out
    assert "host: " in out and "vectors: " in out  # which CPU the figures come from
    assert "ratio (ours / reference tokens/s):" in out
    assert "projection matmuls alone" in out and "1.5x the reference needs our step at most" in out
    roofline = out.split("roofline: ")[1].splitlines()[0]  # the matmuls at the run's fastest rate, plus attention alone
    assert "JAX's 2048^3 product" in roofline and "torch's 2048^3 product" in roofline
    assert "attention's kernels alone" in roofline and "for the loss, Adam, norms and the rest" in roofline
    assert "the same, remat_policy=dots" in out and "with remat_policy=dots:" in out
    assert "the same, attention=blockwise" in out and "with attention=blockwise:" in out
    assert "the same, packed rows" in out and "packed:" in out
    assert "the same, packed rows and remat_policy=dots" in out and "packed and dots:" in out
    assert "  round 1 (cores' round trip " in out and "torch " in out.split("  round 1 ")[1]  # each round, with the placement


def test_matmul_benchmark_times_every_product_of_every_projection_shape(capsys):
    pytest.importorskip("torch")
    _module("matmul").main(["--tokens", "16", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "cores' round trip before: " in out and "cores' round trip after: " in out  # the placement, both ends
    rows = [line.split() for line in out.splitlines() if " x " in line and line.rstrip().endswith("x")]
    shapes = {(int(r[0]), int(r[2])) for r in rows}
    assert shapes == {(256, 128), (256, 256), (256, 688), (256, 2048), (688, 256)}  # train_step.py's model
    assert len(rows) == 3 * len(shapes)
    assert all(float(r[-3]) > 0 and float(r[-2]) > 0 and r[-1].endswith("x") for r in rows)


def test_exclusive_op_times_subtract_nested_thunks_per_worker_thread():
    op_profile = _module("op_profile")
    worker, client = (1, 10), (1, 20)
    names = {worker: "tf_XLAEigen/123", client: "tf_XLAPjRtCpuClient/4"}
    event = lambda name, ts, dur, where=worker: {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": where[0], "tid": where[1]}  # noqa: E731
    events = [
        event("while.3", 0, 100),          # body: dot.1 (30) and fusion.2 (50) nested -> 20 of its own
        event("dot.1", 10, 30),
        event("fusion.2", 45, 50),
        event("dot.7", 200, 40),           # a second dot: same kind
        event("ThunkExecutor::Execute (wait for completion)", 0, 300, client),  # not a worker: ignored
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 10, "args": {"name": "tf_XLAEigen/123"}},
    ]
    ops = {op.kind: op for op in op_profile.exclusive_op_times(events, names)}
    assert set(ops) == {"while", "dot", "fusion"}
    assert ops["dot"].thread_s == pytest.approx(70e-6) and ops["dot"].count == 2
    assert ops["fusion"].thread_s == pytest.approx(50e-6)
    assert ops["while"].thread_s == pytest.approx(20e-6) and ops["while"].count == 1
    assert [op.kind for op in op_profile.exclusive_op_times(events, names)] == ["dot", "fusion", "while"]  # largest first


def test_op_profile_breaks_down_the_training_step(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ops = _module("op_profile").main(["--program", "train", "--seq", "32", "--variant", "packed_dots", "--calls", "1", "--top", "5"])
    out = capsys.readouterr().out
    assert "training step (packed_dots), 8 seqs x 16-32 tokens" in out and "op kind" in out and "cores busy" in out
    assert ops and all(op.thread_s >= 0 for op in ops)
    assert any("dot" in op.kind or "fusion" in op.kind for op in ops)  # the matmuls were seen


def test_paged_attention_benchmark_checks_then_times_the_backends(capsys):
    _module("paged_attention").main(["--mean", "70", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "backends agree" in out and "roofline: live bytes / bandwidth" in out and "gather   per step" in out


@pytest.mark.parametrize("flags, vectors", [
    ("fpu sse2 avx avx2 fma", "AVX2 (no AVX-512)"),
    ("fpu avx2 avx512f avx512_bf16", "AVX-512 (avx512_bf16)"),
    ("fpu sse2", "no AVX2"),
])
def test_host_cpu_names_the_widest_vector_extension(flags, vectors):
    timing = _module("timing")
    cpuinfo = f"processor\t: 0\ncpu family\t: 23\nmodel\t\t: 49\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n\nprocessor\t: 1\n"
    line = timing.host_cpu(cpuinfo)
    assert line.startswith("host: AMD EPYC, family 23 model 49, ") and line.endswith(f"vectors: {vectors}")
    assert timing.host_cpu("").endswith("vectors: unknown")
