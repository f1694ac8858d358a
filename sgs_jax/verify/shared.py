"""Verification split over the processes of a multi-host job, verdicts shared by all.

Every process runs the same loop and so submits the same requests in the same order. The
n-th submission (proof or statement check, counted from the start of the process) belongs
to process n mod P: that process alone checks it, with its own backend (its local Lean
pool on its own CPUs, or its client of the remote fleet), and publishes the verdict; every
other process waits for the published verdict. So each host verifies a 1/P share of the
batch, and every process gets the same verdict for every request, hence makes the same
decisions (solve rates, rewards, target state, selections, dedup) whatever its own
backend's timing. Verdicts travel through an exchange of byte strings (the distributed
runtime's key-value store: `parallel.distributed.KeyValueExchange`), not device
collectives, so waiting happens on a worker thread while the devices keep sampling.

Each published verdict carries a digest of its request; a process whose n-th request differs
from the owner's (the processes' loops have diverged) gets an error naming both, never a
verdict for another proof.

`record`, when given, is called with (request, verdict) for every verdict this process
learns from another, so the verdict cache sees every verdict of the job (process 0 keeps
the job's cache file; see `sgs.run`).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import queue
import threading
from typing import Any, Callable, Protocol

from sgs_jax.verify.interface import Verifier, VerifierUnavailable, VerifyRequest, VerifyResult

log = logging.getLogger(__name__)

_POLL_S = 30.0  # waits are cut into polls this long, so `close` stops a waiter promptly


class Exchange(Protocol):
    """Write-once byte strings shared by every process of the job."""

    def put(self, key: str, value: bytes) -> None: ...

    def get(self, key: str, timeout_s: float) -> bytes | None: ...

    def delete(self, key: str) -> None: ...


class ShardedVerifier(Verifier):
    """`local` checks this process's share; the rest arrive through `exchange`.

    process_index / process_count: this process's place in the job. namespace: key prefix
    (one per job). record: called as record(request, result) for verdicts from others.
    """

    def __init__(self, local: Verifier, exchange: Exchange, process_index: int, process_count: int,
                 namespace: str = "sgs/verdict", record: Callable[[VerifyRequest, VerifyResult], Any] | None = None):
        if not 0 <= process_index < process_count:
            raise ValueError(f"process index {process_index} outside 0..{process_count - 1}")
        self.local = local
        self.exchange = exchange
        self.process_index, self.process_count = process_index, process_count
        self.namespace = namespace
        self.record = record
        self.name = f"sharded-{local.name}"
        self._lock = threading.Lock()
        self._next = 0
        self._published: list[str] = []  # keys this process wrote, deleted by `release`
        self._owned = 0
        self._waiting: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._waiter = threading.Thread(target=self._wait_loop, name="sharded-verifier", daemon=True)
        self._waiter.start()

    # ---- Verifier -----------------------------------------------------------------------
    def submit(self, request: VerifyRequest) -> "concurrent.futures.Future[VerifyResult]":
        return self._share(request, lambda: self.local.submit(request))

    def check_statement(self, header: str, statement: str) -> "concurrent.futures.Future[VerifyResult]":
        return self._share(VerifyRequest.statement_check(header, statement),
                           lambda: self.local.check_statement(header, statement), record=False)

    def stats(self) -> dict[str, Any]:
        stats = dict(self.local.stats())
        with self._lock:
            stats["shared"] = {"submitted": self._next, "checked_here": self._owned}
        return stats

    def release(self) -> None:
        """Delete the verdicts this process published. Call only after every process has
        taken every verdict submitted so far (after a barrier)."""
        with self._lock:
            keys, self._published = self._published, []
        for key in keys:
            self.exchange.delete(key)

    def close(self) -> None:
        self._closed.set()
        self._waiter.join(timeout=2 * _POLL_S)
        self.local.close()

    # ---- internals ----------------------------------------------------------------------
    def _share(self, request: VerifyRequest, check: Callable[[], concurrent.futures.Future], record: bool = True):
        with self._lock:
            n = self._next
            self._next += 1
        key = f"{self.namespace}/{n}"
        digest = _digest(request)
        if n % self.process_count == self.process_index:
            with self._lock:
                self._owned += 1
            try:
                future = check()
            except VerifierUnavailable as err:
                self._publish(key, digest, {"unavailable": str(err)})
                raise
            future.add_done_callback(lambda f: self._publish_result(key, digest, f))
            return future
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._waiting.put((key, digest, request if record else None, future))
        return future

    def _publish_result(self, key: str, digest: str, future: concurrent.futures.Future) -> None:
        err = future.exception()
        if err is None:
            self._publish(key, digest, {"result": future.result().to_json()})
        elif isinstance(err, VerifierUnavailable):
            self._publish(key, digest, {"unavailable": str(err)})
        else:  # a backend bug: the others must not wait for ever
            self._publish(key, digest, {"error": f"{type(err).__name__}: {err}"})

    def _publish(self, key: str, digest: str, payload: dict) -> None:
        self.exchange.put(key, json.dumps({**payload, "request": digest}).encode())
        with self._lock:
            self._published.append(key)

    def _wait_loop(self) -> None:
        """Resolve others' verdicts in submission order (each owner publishes its own in
        its finishing order; waiting in order still takes each as soon as it is due)."""
        while not self._closed.is_set():
            try:
                key, digest, request, future = self._waiting.get(timeout=1.0)
            except queue.Empty:
                continue
            value = None
            while value is None and not self._closed.is_set():
                value = self.exchange.get(key, _POLL_S)
            if value is None:
                future.set_exception(VerifierUnavailable(f"closed while waiting for verdict {key}"))
                continue
            payload = json.loads(value)
            if payload["request"] != digest:
                owner = int(key.rsplit("/", 1)[1]) % self.process_count
                future.set_exception(RuntimeError(
                    f"verification request {key} differs between this process ({self.process_index}) and its owner "
                    f"({owner}): the processes' loops have diverged"))
            elif "result" in payload:
                result = VerifyResult.from_json(payload["result"])
                if request is not None and self.record is not None:
                    self.record(request, result)
                future.set_result(result)
            elif "unavailable" in payload:
                future.set_exception(VerifierUnavailable(payload["unavailable"]))
            else:
                future.set_exception(RuntimeError(f"verdict {key} failed on its owner: {payload['error']}"))


def _digest(request: VerifyRequest) -> str:
    """A short digest of a request's (header, statement, proof)."""
    return hashlib.sha256(json.dumps(request.key()).encode()).hexdigest()[:16]
