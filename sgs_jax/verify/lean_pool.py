"""Local Lean backend: a pool of long-lived REPL processes keyed by header.

Each REPL imports one header once (it becomes an environment) and then checks every
proof with that header as a command in that environment: importing Mathlib costs
seconds and gigabytes, so it is never repeated per proof. The pool holds at most
`workers` REPLs; a proof whose header has no idle REPL gets a new one, and when the
pool is full the least recently used idle REPL is evicted.

Faults: a REPL that times out, crashes or answers garbage is killed (its whole process
group) and never reused. A proof whose REPL crashed or answered garbage is retried once
on a fresh REPL, then reported as `system_error`; a timeout is final (`timeout`).
Each REPL is recycled after `max_uses` proofs. `close` kills every REPL group at once,
busy ones included (a stopping run does not wait out a 200 s proof; those proofs report
`system_error`, which is never cached). Registers the backend `lean`.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from typing import Any, Sequence

from sgs_jax.verify import rules
from sgs_jax.verify.interface import Status, Verifier, VerifyRequest, VerifyResult, register_backend
from sgs_jax.verify.repl import GIB, LeanRepl, ReplConfig, ReplCrashed, ReplError, ReplProtocolError, ReplTimeout
from sgs_jax.verify.stats import VerifyStats

DEFAULT_REPL_CMD = "lake exe repl"


class HeaderError(Exception):
    """The trusted header itself does not elaborate (every proof under it fails)."""


class _Session:
    """A REPL with one imported header: `env` is the header's environment (None if empty)."""

    def __init__(self, repl: LeanRepl, header: str, env: int | None):
        self.repl, self.header, self.env, self.uses = repl, header, env, 0


def default_workers() -> int:
    """One REPL per CPU core, minus one core for the host program."""
    return max(1, (os.cpu_count() or 2) - 1)


def check_in_session(session: _Session, request: VerifyRequest, name: str, timeout_s: float) -> VerifyResult:
    """Check one proof in a session's header environment (raises ReplError on faults).

    Sends the trusted statement + proof as one command; if it has no error or sorry,
    sends `#print axioms NAME` in the resulting environment and applies the rules.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    command: dict[str, Any] = {"cmd": request.body()}
    if session.env is not None:
        command["env"] = session.env
    reply = session.repl.send(command, timeout_s)
    messages = list(reply.get("messages") or [])
    verdict = rules.judge(reply, axioms=())  # every rule except the axioms one
    if verdict.verified:
        if not isinstance(reply.get("env"), int):
            raise ReplProtocolError(f"reply without env: {reply!r:.200}")
        axioms_reply = session.repl.send(
            {"cmd": rules.axioms_command(name), "env": reply["env"]}, max(0.0, deadline - time.monotonic())
        )
        axioms_messages = list(axioms_reply.get("messages") or [])
        messages += axioms_messages
        verdict = rules.judge(reply, rules.axioms_from_messages(axioms_messages, name))
    elapsed = time.monotonic() - start
    return VerifyResult(verdict.verified, verdict.status, verdict.reason, tuple(messages), elapsed)


def statement_in_session(session: _Session, request: VerifyRequest, timeout_s: float) -> VerifyResult:
    """Elaborate a statement-check request (statement + `sorry`) in a session (raises ReplError on faults)."""
    start = time.monotonic()
    command: dict[str, Any] = {"cmd": request.body()}
    if session.env is not None:
        command["env"] = session.env
    reply = session.repl.send(command, timeout_s)
    verdict = rules.judge_statement(reply)
    messages = tuple(reply.get("messages") or []) if isinstance(reply, dict) else ()
    return VerifyResult(verdict.verified, verdict.status, verdict.reason, messages, time.monotonic() - start)


class LeanPool(Verifier):
    """Pool of Lean REPLs (see module docstring).

    repl_cmd: REPL-compatible executable, a string or argv (default "lake exe repl").
    lean_project_dir: the Lean project (with Mathlib) the REPL runs in.
    workers: REPL processes at most (default: CPU cores - 1).
    timeout_s: wall-clock limit per proof (paper: 200 s).
    header_timeout_s: wall-clock limit for importing a header.
    memory_limit_gib: address-space limit per REPL (0 or None: none).
    max_uses: proofs per REPL before it is recycled.
    retries: extra attempts for a proof whose REPL crashed or answered garbage.
    """

    name = "lean"

    def __init__(
        self,
        repl_cmd: str | Sequence[str] = DEFAULT_REPL_CMD,
        lean_project_dir: str | None = None,
        workers: int | None = None,
        timeout_s: float = 200.0,
        header_timeout_s: float = 600.0,
        memory_limit_gib: float | None = 12.0,
        max_uses: int = 200,
        retries: int = 1,
    ):
        if lean_project_dir is not None and not os.path.isdir(lean_project_dir):
            raise ValueError(f"Lean project directory {lean_project_dir!r} does not exist")
        workers = default_workers() if workers is None else int(workers)
        if workers < 1 or max_uses < 1 or timeout_s <= 0 or retries < 0:
            raise ValueError("workers and max_uses must be >= 1, timeout_s > 0, retries >= 0")
        limit = int(memory_limit_gib * GIB) if memory_limit_gib else None
        self.config = ReplConfig(ReplConfig.parse_cmd(repl_cmd), lean_project_dir, limit)
        self.workers, self.timeout_s, self.header_timeout_s = workers, float(timeout_s), float(header_timeout_s)
        self.max_uses, self.retries = int(max_uses), int(retries)
        self._stats = VerifyStats()
        self._cond = threading.Condition()
        self._idle: list[_Session] = []  # least recently used first
        self._busy: set[LeanRepl] = set()  # REPLs importing a header or checking a proof
        self._live = 0  # sessions idle + busy + being started
        self._bad_headers: dict[str, str] = {}
        self._closed = False
        # One thread per REPL slot: a thread holds at most one session, so a slot is
        # always free (or evictable) when a thread asks for one.
        self._executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="lean-pool")

    # ------------------------------------------------------------------ public API

    def submit(self, request: VerifyRequest) -> "concurrent.futures.Future[VerifyResult]":
        if self._closed:
            raise RuntimeError("LeanPool is closed")
        self._stats.submitted()
        return self._executor.submit(self._run, request)

    def stats(self) -> dict[str, Any]:
        snap = self._stats.snapshot()
        events = snap["events"]
        snap["repl_restarts"] = sum(events.get(k, 0) for k in ("repl_timeout", "repl_crash", "repl_bad_reply"))
        with self._cond:
            snap["live_repls"] = self._live
        return snap

    def close(self) -> None:
        """Drop queued proofs, kill every REPL (busy ones too: their proofs end as system
        errors), then wait for the worker threads. Idempotent."""
        if self._closed:
            return
        with self._cond:
            self._closed = True
            busy = list(self._busy)
            self._cond.notify_all()
        for repl in busy:
            repl.kill()
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._cond:
            idle, self._idle = self._idle, []
            self._live -= len(idle)
        for session in idle:
            session.repl.kill()

    # ------------------------------------------------------------------ one proof

    def _run(self, request: VerifyRequest) -> VerifyResult:
        try:
            result = self._check(request)
        except Exception as err:  # never let a future raise: report it instead
            result = VerifyResult.failure(Status.SYSTEM_ERROR, f"internal error: {err!r}"[:200])
        self._stats.record(result)
        return result

    def _check(self, request: VerifyRequest) -> VerifyResult:
        rejected = rules.precheck(request.proof)
        if rejected:
            return VerifyResult.failure(rejected.status, rejected.reason)
        name = rules.theorem_name(request.statement)
        if name is None:
            return VerifyResult.failure(Status.REJECTED, "statement declares no named theorem")
        return self._in_session(request.header, lambda session: check_in_session(session, request, name, self.timeout_s))

    def _in_session(self, header: str, work) -> VerifyResult:
        """`work(session)` in a session for `header`, with the pool's fault handling: a
        crashed or garbled REPL is replaced and the work retried, a timeout is final."""
        last_error: ReplError | None = None
        for _ in range(1 + self.retries):
            if header in self._bad_headers:
                return VerifyResult.failure(Status.LEAN_ERROR, self._bad_headers[header])
            try:
                session = self._acquire(header)
            except HeaderError as err:
                return VerifyResult.failure(Status.LEAN_ERROR, str(err))
            except ReplError as err:
                last_error = err
                self._note_fault(err)
                continue
            healthy = False
            start = time.monotonic()
            try:
                result = work(session)
                healthy = True
                return result
            except ReplTimeout:
                self._note_fault(ReplTimeout())
                return VerifyResult.failure(
                    Status.TIMEOUT, f"no verdict within {self.timeout_s:g} s", time_s=time.monotonic() - start
                )
            except ReplError as err:
                last_error = err
                self._note_fault(err)
            finally:
                self._release(session, healthy)
        return VerifyResult.failure(Status.SYSTEM_ERROR, f"REPL failed: {last_error}"[:300])

    # ------------------------------------------------------------------ statement check

    def check_statement(self, header: str, statement: str) -> "concurrent.futures.Future[VerifyResult]":
        """One `theorem ... := by sorry` command in the header's environment (no axioms report)."""
        if self._closed:
            raise RuntimeError("LeanPool is closed")
        return self._executor.submit(self._run_statement_check, VerifyRequest.statement_check(header, statement))

    def _run_statement_check(self, request: VerifyRequest) -> VerifyResult:
        self._stats.event("statement_check")
        try:
            return self._in_session(request.header, lambda session: statement_in_session(session, request, self.timeout_s))
        except Exception as err:  # never let a future raise
            return VerifyResult.failure(Status.SYSTEM_ERROR, f"internal error: {err!r}"[:200])

    def _note_fault(self, err: ReplError) -> None:
        kind = {ReplTimeout: "repl_timeout", ReplProtocolError: "repl_bad_reply"}.get(type(err), "repl_crash")
        self._stats.event(kind)

    # ------------------------------------------------------------------ sessions

    def _acquire(self, header: str) -> _Session:
        """An idle session for `header`, or a new one (evicting the LRU idle one if full),
        marked busy."""
        evicted: _Session | None = None
        with self._cond:
            while True:
                if self._closed:
                    raise ReplCrashed("the pool is closed")
                for i in range(len(self._idle) - 1, -1, -1):  # most recently used first
                    if self._idle[i].header == header:
                        session = self._idle.pop(i)
                        self._busy.add(session.repl)
                        return session
                if self._live < self.workers:
                    self._live += 1
                    break
                if self._idle:
                    evicted = self._idle.pop(0)  # least recently used, other header
                    break
                self._cond.wait()
        if evicted is not None:
            evicted.repl.kill()
            self._stats.event("repl_evict")
        try:
            return self._start(header)
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise

    def _start(self, header: str) -> _Session:
        repl = LeanRepl(self.config)
        with self._cond:
            self._busy.add(repl)
            closed = self._closed
        if closed:  # close() ran while this REPL started, so it could not kill it
            repl.kill()
            raise ReplCrashed("the pool is closed")
        self._stats.event("repl_spawn")
        if not header.strip():
            return _Session(repl, header, None)
        try:
            reply = repl.send({"cmd": header}, self.header_timeout_s)
            self._stats.event("header_import")
            errors = [m for m in reply.get("messages") or [] if m.get("severity") == "error"]
            if errors or "message" in reply or not isinstance(reply.get("env"), int):
                detail = errors[0].get("data", "") if errors else reply.get("message", "no env")
                self._bad_headers[header] = f"header does not elaborate: {detail}"[:200]
                raise HeaderError(self._bad_headers[header])
        except BaseException:
            repl.kill()
            with self._cond:
                self._busy.discard(repl)
            raise
        return _Session(repl, header, reply["env"])

    def _release(self, session: _Session, healthy: bool) -> None:
        session.uses += 1
        keep = healthy and session.repl.alive and session.uses < self.max_uses and not self._closed
        if healthy and session.uses >= self.max_uses:
            self._stats.event("repl_recycle")
        if not keep:
            session.repl.kill()
        with self._cond:
            self._busy.discard(session.repl)
            if keep:
                self._idle.append(session)
            else:
                self._live -= 1
            self._cond.notify()


register_backend("lean", LeanPool)
