"""ShardedVerifier: each process checks its share (n mod P), every process gets every verdict."""

import concurrent.futures
import random
import threading
import time

import pytest

from sgs_jax.verify import Status, VerifierUnavailable, VerifyRequest, VerifyResult
from sgs_jax.verify.interface import Verifier
from sgs_jax.verify.shared import ShardedVerifier


class DictExchange:
    """The key-value store of one job, in memory (what JAX's coordination service provides)."""

    def __init__(self):
        self.values, self.cond = {}, threading.Condition()

    def put(self, key, value):
        with self.cond:
            assert key not in self.values, f"{key} written twice"
            self.values[key] = value
            self.cond.notify_all()

    def get(self, key, timeout_s):
        with self.cond:
            self.cond.wait_for(lambda: key in self.values, timeout=timeout_s)
            return self.values.get(key)

    def delete(self, key):
        with self.cond:
            self.values.pop(key, None)


class SlowBackend(Verifier):
    """Verifies proofs that contain "ok", after a random delay, on worker threads."""

    name = "slow"

    def __init__(self, seed, unavailable=False):
        self.checked, self.rng, self.unavailable = [], random.Random(seed), unavailable
        self.pool = concurrent.futures.ThreadPoolExecutor(4)

    def _check(self, proof, delay):
        time.sleep(delay)
        if self.unavailable:
            raise VerifierUnavailable("key refused")
        return VerifyResult(True, Status.VERIFIED, time_s=delay) if "ok" in proof else VerifyResult.failure(Status.LEAN_ERROR, "no", time_s=delay)

    def submit(self, request):
        self.checked.append(request.proof)
        return self.pool.submit(self._check, request.proof, self.rng.random() * 0.01)

    def check_statement(self, header, statement):
        self.checked.append(statement)
        return self.pool.submit(self._check, "ok", 0.0)

    def close(self):
        self.pool.shutdown()


def _job(processes, **backend):
    exchange = DictExchange()
    records = [[] for _ in range(processes)]
    verifiers = [ShardedVerifier(SlowBackend(p, **backend), exchange, p, processes,
                                 record=lambda req, res, p=p: records[p].append((req.proof, res.status)))
                 for p in range(processes)]
    return exchange, verifiers, records


def test_each_process_checks_its_share_and_all_get_every_verdict():
    exchange, verifiers, records = _job(3)
    requests = [VerifyRequest("", f"theorem t{i} : True := by", f"  ok {i}" if i % 4 else f"  bad {i}") for i in range(20)]
    try:
        # Every process submits the same requests in the same order (the loop is the same).
        futures = [[v.submit(r) for r in requests] for v in verifiers]
        statement = [v.check_statement("", "theorem s : True := by") for v in verifiers]
        results = [[f.result(timeout=10) for f in fs] for fs in futures]
        assert all(f.result(timeout=10).verified for f in statement)
        assert results[0] == results[1] == results[2]
        assert [r.verified for r in results[0]] == [bool(i % 4) for i in range(20)]
        for p, v in enumerate(verifiers):
            assert v.local.checked == [r.proof for r in requests[p::3]] + (["theorem s : True := by"] if 20 % 3 == p else [])
            # the verdicts learnt from others are recorded (statement checks are not)
            assert sorted(records[p]) == sorted((r.proof, res.status) for i, (r, res) in enumerate(zip(requests, results[0])) if i % 3 != p)
        assert len(exchange.values) == 21
        for v in verifiers:
            v.release()
        assert exchange.values == {}
    finally:
        for v in verifiers:
            v.close()


def test_an_unavailable_backend_stops_every_process():
    _, verifiers, _ = _job(2, unavailable=True)
    try:
        futures = [[v.submit(VerifyRequest("", "theorem t : True := by", f"  ok {i}")) for i in range(2)] for v in verifiers]
        for fs in futures:
            for f in fs:
                with pytest.raises(VerifierUnavailable, match="key refused"):
                    f.result(timeout=10)
    finally:
        for v in verifiers:
            v.close()


def test_diverged_processes_get_an_error_not_another_proofs_verdict():
    _, verifiers, _ = _job(2)
    try:
        a = verifiers[0].submit(VerifyRequest("", "theorem t : True := by", "  ok 0"))
        b = verifiers[1].submit(VerifyRequest("", "theorem t : True := by", "  ok but another proof"))
        assert a.result(timeout=10).verified
        with pytest.raises(RuntimeError, match="differs between this process \\(1\\) and its owner \\(0\\)"):
            b.result(timeout=10)
    finally:
        for v in verifiers:
            v.close()
