"""The `prop` verification backend: the testbed's own checker behind the `Verifier` interface.

It checks exactly what the Lean backend would compile, the trusted header and statement
plus the proof body (`VerifyRequest.lean_source()`), but only for the testbed's subset:
the header must be empty (core Lean needs no imports for it). Checking is synchronous and
takes microseconds, so `submit` returns an already completed future.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import Counter
from typing import Any

from sgs_jax.testbed.checker import check_proof
from sgs_jax.testbed.lexer import LeanSyntaxError
from sgs_jax.testbed.parser import parse_statement
from sgs_jax.verify.interface import Status, Verifier, VerifyRequest, VerifyResult, register_backend


def verify_request(request: VerifyRequest) -> VerifyResult:
    """Check one request (never raises)."""
    start = time.perf_counter()
    try:
        if request.header.strip():
            return VerifyResult.failure(
                Status.REJECTED, "prop backend: the header must be empty (core Lean, no imports)",
                time_s=time.perf_counter() - start,
            )
        # Same layout as lean_source(): the proof starts on the line after the statement.
        result = check_proof(request.statement, request.proof.strip("\n"))
    except Exception as err:  # a checker bug must not take down the training loop
        return VerifyResult.failure(Status.SYSTEM_ERROR, f"prop checker crashed: {err!r}",
                                    time_s=time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    if result.ok:
        return VerifyResult(True, Status.VERIFIED, "", (), elapsed)
    status = Status.REJECTED if result.stage == "statement" else Status.LEAN_ERROR
    message = {"severity": "error", "pos": None, "endPos": None, "data": result.reason}
    return VerifyResult.failure(status, result.reason, (message,), elapsed)


def check_statement_request(header: str, statement: str) -> VerifyResult:
    """The statement check of the testbed: the parser (Lean's elaboration of a statement in
    this fragment: syntax, bound atoms, binders). Never raises."""
    start = time.perf_counter()
    if header.strip():
        return VerifyResult.failure(Status.REJECTED, "prop backend: the header must be empty (core Lean, no imports)")
    try:
        parse_statement(statement)
    except (LeanSyntaxError, RecursionError) as err:
        reason = f"statement: {err}" if isinstance(err, LeanSyntaxError) else "statement: nesting too deep"
        message = {"severity": "error", "pos": None, "endPos": None, "data": reason}
        return VerifyResult.failure(Status.LEAN_ERROR, reason, (message,), time.perf_counter() - start)
    except Exception as err:  # a parser bug must not take down the training loop
        return VerifyResult.failure(Status.SYSTEM_ERROR, f"prop parser crashed: {err!r}", time_s=time.perf_counter() - start)
    return VerifyResult(True, Status.VERIFIED, "", (), time.perf_counter() - start)


def _done(result: VerifyResult) -> "concurrent.futures.Future[VerifyResult]":
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(result)
    return future


class PropVerifier(Verifier):
    """Verifier for the embedded propositional testbed (name `prop`); options are ignored
    except `workers`, which is accepted for config compatibility."""

    name = "prop"

    def __init__(self, **options: Any):
        unknown = set(options) - {"workers", "timeout_s"}
        if unknown:
            raise ValueError(f"prop backend: unknown options {sorted(unknown)}")
        self._lock = threading.Lock()
        self._counts: Counter = Counter()
        self._time_s = 0.0

    def submit(self, request: VerifyRequest) -> "concurrent.futures.Future[VerifyResult]":
        result = verify_request(request)
        with self._lock:
            self._counts[result.status.value] += 1
            self._time_s += result.time_s
        return _done(result)

    def check_statement(self, header: str, statement: str) -> "concurrent.futures.Future[VerifyResult]":
        return _done(check_statement_request(header, statement))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            total = sum(self._counts.values())
            return {
                "backend": self.name,
                "total": total,
                "by_status": dict(self._counts),
                "time_s": self._time_s,
                "mean_time_s": self._time_s / total if total else 0.0,
            }


register_backend("prop", PropVerifier)
