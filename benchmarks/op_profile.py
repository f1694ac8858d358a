"""Where the time goes: exclusive CPU thread time per XLA operation kind for one of the
benchmarked programs, from a `jax.profiler` trace.

    python benchmarks/op_profile.py [--program train|decode] [--seq 256] [--variant default] [--calls 3] [--top 15]

train: the training benchmark's optimiser step (benchmarks/train_step.py: 8 sequences of
seq/2 to seq tokens, micro-batches of 4, under `--variant`: that benchmark's default,
dots, blockwise, packed or packed_dots settings), profiled over `--calls` steps. decode: the sampler
benchmark's batch case (benchmarks/sampler.py: 64 rows x 128 new tokens), over `--calls`
generate calls. Both are warmed up (compiled) first.

Each row is one kind of thunk the XLA:CPU runtime ran (the HLO name without its numeric
suffix: `ynn_fusion` = a YNNPACK matmul fusion, `copy_bitcast_fusion` = a materialised
transpose, `gather_bitcast_fusion` = a gather, ...), with its thread time excluding nested
thunks (a while loop's own bookkeeping, not its body), its share of all thread time, and
its count per call. Thread time sums over the traced XLA worker threads; work a library
runs on threads of its own (YNNPACK's parallel tasks) counts only in the thunk that waits
for it, so the total can be below the process's CPU time. The profiler adds overhead of
its own (a call runs up to 2x slower traced): read shares, not absolute milliseconds.
The first line says how many cores the untraced program keeps busy (process CPU time over
wall time of the same number of calls).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import pathlib
import re
import resource
import tempfile
import time

import jax
import numpy as np

from timing import host_cpu, host_malloc

# XLA:CPU's worker threads; the PjRt client threads only wait on them.
_WORKER_THREAD_PREFIX = "tf_XLAEigen"


@dataclasses.dataclass(frozen=True)
class OpTime:
    kind: str  # HLO instruction name without its numeric suffix
    thread_s: float  # exclusive thread time, seconds, summed over worker threads
    count: int  # thunks run


def exclusive_op_times(events: list[dict], thread_names: dict[tuple, str]) -> list[OpTime]:
    """Exclusive thread time per op kind from Chrome-trace complete events ("ph": "X", with
    ts/dur in microseconds, pid/tid) on the XLA worker threads, largest first. An event's
    exclusive time is its duration less the durations of the events nested directly in it
    on the same thread."""
    by_thread = collections.defaultdict(list)
    for event in events:
        key = (event.get("pid"), event.get("tid"))
        if event.get("ph") == "X" and thread_names.get(key, "").startswith(_WORKER_THREAD_PREFIX):
            by_thread[key].append(event)
    exclusive, counts = collections.Counter(), collections.Counter()
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        nested = [0.0] * len(thread_events)
        stack: list[int] = []
        for i, event in enumerate(thread_events):
            while stack and thread_events[stack[-1]]["ts"] + thread_events[stack[-1]].get("dur", 0) <= event["ts"]:
                stack.pop()
            if stack:
                nested[stack[-1]] += event.get("dur", 0)
            stack.append(i)
        for event, inner in zip(thread_events, nested):
            kind = re.sub(r"\.\d+$", "", event["name"])
            exclusive[kind] += event.get("dur", 0) - inner
            counts[kind] += 1
    return [OpTime(kind, us / 1e6, counts[kind]) for kind, us in exclusive.most_common()]


def read_trace(log_dir: str) -> tuple[list[dict], dict[tuple, str]]:
    """The events and thread names of the trace `jax.profiler` wrote under `log_dir`."""
    (path,) = pathlib.Path(log_dir).glob("plugins/profile/*/*.trace.json.gz")
    trace = json.loads(gzip.open(path).read())
    events = trace["traceEvents"]
    names = {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    return events, names


def cores_busy(fn, calls: int) -> float:
    """Process CPU time over wall time of `calls` untraced calls of fn(): how many cores the
    program keeps busy (at most the core count; spinning worker threads count as busy)."""
    cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # noqa: E731  user + system seconds
    cpu_start, start = cpu(), time.perf_counter()
    for _ in range(calls):
        fn()
    return (cpu() - cpu_start) / (time.perf_counter() - start)


def profile(fn, calls: int) -> tuple[list[OpTime], float]:
    """Op times of `calls` calls of fn() (already warmed up), and their wall time per call."""
    with tempfile.TemporaryDirectory() as log_dir:
        jax.profiler.start_trace(log_dir)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        wall = (time.perf_counter() - start) / calls
        jax.profiler.stop_trace()
        return exclusive_op_times(*read_trace(log_dir)), wall


def train_program(seq: int, variant: str = "default"):
    """The training benchmark's optimiser step on its model and batch (warmed up), under
    one of its variants (benchmarks/train_step.py VARIANTS)."""
    from train_step import VARIANTS, make_examples, model_config, train_config

    from sgs_jax.models.build import create_model
    from sgs_jax.rl.train_step import Trainer

    if variant not in VARIANTS:
        raise SystemExit(f"--variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    remat, attention, packed, *_ = VARIANTS[variant]
    config = dataclasses.replace(model_config(seq), remat_policy=remat, attention=attention)
    trainer = Trainer(create_model(config, seed=0), train_config(seq, batch=8, micro=4, packed=packed))
    examples = make_examples(8, seq, config.vocab_size)
    step = lambda: trainer.step(examples)  # noqa: E731  (step reads its metrics back: it blocks)
    step()
    return step, f"training step ({variant}), 8 seqs x {seq // 2}-{seq} tokens, micro-batches of 4 sequences' token budget"


def decode_program():
    """The sampler benchmark's batch case (warmed up)."""
    from sampler import BATCH_MODEL, batch_case, describe, make_checkpoint

    from sgs_jax.models import load_hf

    with tempfile.TemporaryDirectory() as directory:
        make_checkpoint(BATCH_MODEL, directory)
        model = load_hf(directory)
    sampler, prompts, params = batch_case(model, np.random.default_rng(0), page_size=16, chunk_steps=16)  # the benchmark's defaults
    generate = lambda: sampler.generate(model, prompts.tolist(), params)  # noqa: E731  (returns host arrays: it blocks)
    generate()
    return generate, f"sampler batch case, 64 rows x 128 new tokens ({describe(BATCH_MODEL)})"


def main(argv=None) -> list[OpTime]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", choices=("train", "decode"), default="train")
    ap.add_argument("--seq", type=int, default=256, help="train: longest sequence, tokens")
    ap.add_argument("--variant", default="default",
                    help="train: one of the training benchmark's settings (benchmarks/train_step.py VARIANTS)")
    ap.add_argument("--calls", type=int, default=3, help="profiled calls (after a warm-up call)")
    ap.add_argument("--top", type=int, default=15, help="op kinds printed")
    args = ap.parse_args(argv)
    print(host_malloc(may_restart=argv is None))
    print(host_cpu())
    fn, title = train_program(args.seq, args.variant) if args.program == "train" else decode_program()
    busy = cores_busy(fn, args.calls)
    ops, wall = profile(fn, args.calls)
    total = sum(op.thread_s for op in ops) or 1.0
    print(f"{title}; untraced, the process keeps {busy:.2f} cores busy")
    print(f"{args.calls} traced calls: wall {wall * 1e3:.1f} ms per call, "
          f"worker thread time {total / args.calls * 1e3:.1f} ms per call")
    print(f"{'op kind':<40}{'ms/call':>10}{'share':>8}{'count/call':>12}")
    for op in ops[: args.top]:
        print(f"{op.kind[:39]:<40}{op.thread_s / args.calls * 1e3:>10.2f}{op.thread_s / total:>8.1%}{op.count / args.calls:>12.1f}")
    return ops


if __name__ == "__main__":
    main()
