"""Throughput of the Lean REPL pool against the ideal, with a fake REPL of fixed cost.

The fake REPL (tests/verify/fake_lean_repl.py, real protocol) takes `--delay` seconds
per proof, so the ideal throughput is workers / delay. We measure, in one run:
- ours: `LeanPool` (queue, header-keyed sessions, proof + `#print axioms` round trips,
  verdict rules), after a warm-up that imports the header in every REPL;
- reference: the same REPL processes driven directly, one thread per process sending
  bare proof commands (the best any pool could do with this fake);
and print proofs/s with the ratio to the ideal (target: at least 0.9).

    python benchmarks/verify.py --workers 8 --delay 0.05 --proofs 400
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import threading
import time

from sgs_jax.verify.interface import VerifyRequest
from sgs_jax.verify.lean_pool import LeanPool
from sgs_jax.verify.repl import LeanRepl, ReplConfig

FAKE_REPL = pathlib.Path(__file__).resolve().parents[1] / "tests" / "verify" / "fake_lean_repl.py"
HEADER = "import Mathlib\nimport Aesop\nset_option maxHeartbeats 0\nopen BigOperators Real Nat Topology Rat\n\n"
STATEMENT = "theorem bench (x y : ℝ) (h : 0 < x ∧ 0 < y) : 0 < x * y := by"


def measure_pool(workers: int, delay: float, proofs: int) -> float:
    """Proofs per second through LeanPool (header imports done before the clock starts)."""
    cmd = [sys.executable, str(FAKE_REPL), "--delay", str(delay)]
    with LeanPool(repl_cmd=cmd, workers=workers, timeout_s=30, max_uses=10**6, memory_limit_gib=2) as pool:
        warm = [pool.submit(VerifyRequest(HEADER, STATEMENT, f"\n  positivity -- warm {i}")) for i in range(workers)]
        assert all(f.result().verified for f in warm)
        requests = [VerifyRequest(HEADER, STATEMENT, f"\n  nlinarith [h.1, h.2] -- {i}") for i in range(proofs)]
        start = time.perf_counter()
        results = pool.verify_batch(requests)
        elapsed = time.perf_counter() - start
        assert all(r.verified for r in results), "benchmark proofs must verify"
        assert pool.stats()["events"]["repl_spawn"] == workers, "no REPL may restart during the run"
    return proofs / elapsed


def measure_reference(workers: int, delay: float, proofs: int) -> float:
    """Proofs per second with one thread per REPL sending bare proof commands."""
    config = ReplConfig((sys.executable, str(FAKE_REPL), "--delay", str(delay)), address_space_bytes=2 << 30)
    repls = [LeanRepl(config) for _ in range(workers)]
    try:
        envs = [r.send({"cmd": HEADER}, 30)["env"] for r in repls]
        counter = iter(range(proofs))
        lock = threading.Lock()

        def drive(repl: LeanRepl, env: int) -> None:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                repl.send({"cmd": f"{STATEMENT}\n  nlinarith [h.1, h.2] -- {i}", "env": env}, 30)

        threads = [threading.Thread(target=drive, args=(r, e)) for r, e in zip(repls, envs)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return proofs / (time.perf_counter() - start)
    finally:
        for r in repls:
            r.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.05, help="fake seconds per proof")
    parser.add_argument("--proofs", type=int, default=400)
    args = parser.parse_args(argv)
    ideal = args.workers / args.delay
    ours = measure_pool(args.workers, args.delay, args.proofs)
    reference = measure_reference(args.workers, args.delay, args.proofs)
    print(f"Lean pool throughput: {args.workers} workers, {args.delay * 1000:.0f} ms per proof, {args.proofs} proofs")
    print(f"{'':<28}{'proofs/s':>10}{'vs ideal':>10}")
    print(f"{'ideal (workers / delay)':<28}{ideal:>10.1f}{1.0:>10.3f}")
    print(f"{'reference (bare REPLs)':<28}{reference:>10.1f}{reference / ideal:>10.3f}")
    print(f"{'ours (LeanPool)':<28}{ours:>10.1f}{ours / ideal:>10.3f}")
    print(f"ours / reference: {ours / reference:.3f}")
    return 0 if ours / ideal >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
