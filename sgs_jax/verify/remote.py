"""Remote backend: a client for Kimina Lean Server (project-numina/kimina-lean-server).

Large runs check proofs on a CPU fleet behind this HTTP API. Standard library only.

Request: `POST {url}/api/check` with
  {"snippets": [{"id": str, "code": str}, ...], "timeout": int seconds,
   "debug": false, "reuse": true, "infotree": null}
and, when an API key is set, the header `Authorization: Bearer KEY`.
Reply: {"results": [{"id", "time", "error", "response", "diagnostics"}, ...]} where
`response` is the Lean REPL's own reply (`env`, `messages`, `sorries`, or `message`) and
`error` a server-side failure ("... timed out in N seconds" on timeouts).

Each code is the trusted header + statement + proof followed by `#print axioms NAME`;
the same rules as the local backend judge the reply, and only the last-positioned
message may be the axioms report (see `rules.axioms_from_messages`).

Items are batched (up to `batch_size` per request, `concurrency` requests in flight);
a failed request (connection error, HTTP 5xx/429, unparsable body) is retried with
exponential backoff, then its items become `system_error`. Registers backend `remote`.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import math
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from sgs_jax.verify import rules
from sgs_jax.verify.interface import Status, Verifier, VerifyRequest, VerifyResult, register_backend
from sgs_jax.verify.stats import VerifyStats

_STOP = object()


class RequestFailed(Exception):
    """An HTTP request that failed; `retryable` says whether trying again may help."""

    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


def remote_code(request: VerifyRequest, name: str) -> str:
    """The snippet sent to the server: the checked file plus the axioms report."""
    return request.lean_source() + "\n\n" + rules.axioms_command(name) + "\n"


def _server_reply(item: dict[str, Any]) -> tuple[dict[str, Any] | VerifyResult, float]:
    """(the Lean REPL reply, seconds) of one server result, or a failure in its place."""
    elapsed = float(item.get("time") or 0.0)
    error = item.get("error")
    if error:
        status = Status.TIMEOUT if "timed out" in str(error) else Status.SYSTEM_ERROR
        return VerifyResult.failure(status, f"server: {error}"[:200], time_s=elapsed), elapsed
    reply = item.get("response")
    if not isinstance(reply, dict):
        return VerifyResult.failure(Status.SYSTEM_ERROR, "server result without response", time_s=elapsed), elapsed
    return reply, elapsed


def judge_remote_statement(item: dict[str, Any]) -> VerifyResult:
    """VerifyResult of a statement check from one server result (see `rules.judge_statement`)."""
    reply, elapsed = _server_reply(item)
    if isinstance(reply, VerifyResult):
        return reply
    verdict = rules.judge_statement(reply)
    return VerifyResult(verdict.verified, verdict.status, verdict.reason, tuple(reply.get("messages") or []), elapsed)


def judge_remote(item: dict[str, Any], name: str) -> VerifyResult:
    """VerifyResult from one server result `{"id", "time", "error", "response"}`."""
    reply, elapsed = _server_reply(item)
    if isinstance(reply, VerifyResult):
        return reply
    messages = list(reply.get("messages") or [])
    verdict = rules.judge(reply, rules.axioms_from_messages(messages, name))
    return VerifyResult(verdict.verified, verdict.status, verdict.reason, tuple(messages), elapsed)


class RemoteVerifier(Verifier):
    """Kimina Lean Server client (see module docstring).

    url: server base URL, e.g. "http://lean-fleet:8000".
    api_key: sent as a Bearer token when set.
    timeout_s: per-proof Lean timeout asked of the server.
    batch_size: snippets per HTTP request; concurrency: requests in flight.
    retries: extra attempts per request; backoff_s: first wait, doubled each retry
      (capped at max_backoff_s).
    http_timeout_s: socket timeout per request (default: timeout_s + 60).
    linger_s: how long a sender waits to fill a batch once it has one item.
    """

    name = "remote"

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout_s: float = 200.0,
        batch_size: int = 8,
        concurrency: int = 4,
        retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        http_timeout_s: float | None = None,
        linger_s: float = 0.02,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"remote verifier needs an http(s) URL, got {url!r}")
        if batch_size < 1 or concurrency < 1 or retries < 0:
            raise ValueError("batch_size and concurrency must be >= 1, retries >= 0")
        self.endpoint = url.rstrip("/") + "/api/check"
        self.api_key, self.timeout_s = api_key, float(timeout_s)
        self.batch_size, self.retries = int(batch_size), int(retries)
        self.backoff_s, self.max_backoff_s, self.linger_s = backoff_s, max_backoff_s, linger_s
        self.http_timeout_s = http_timeout_s if http_timeout_s is not None else self.timeout_s + 60.0
        self._stats = VerifyStats()
        self._queue: queue.Queue = queue.Queue()
        self._ids = itertools.count()
        self._closed = False
        self._senders = [threading.Thread(target=self._sender, daemon=True, name=f"kimina-{i}") for i in range(concurrency)]
        self._statement_lock = threading.Lock()
        self._statement_executor: concurrent.futures.ThreadPoolExecutor | None = None  # made on first use
        for thread in self._senders:
            thread.start()

    def submit(self, request: VerifyRequest) -> "concurrent.futures.Future[VerifyResult]":
        if self._closed:
            raise RuntimeError("RemoteVerifier is closed")
        self._stats.submitted()
        future: concurrent.futures.Future = concurrent.futures.Future()
        rejected = rules.precheck(request.proof)
        name = rules.theorem_name(request.statement)
        if rejected or name is None:
            reason = rejected.reason if rejected else "statement declares no named theorem"
            self._finish(future, VerifyResult.failure(Status.REJECTED, reason))
        else:
            self._queue.put((request, name, future))
        return future

    def stats(self) -> dict[str, Any]:
        return self._stats.snapshot()

    def check_statement(self, header: str, statement: str) -> "concurrent.futures.Future[VerifyResult]":
        """The statement + `sorry` as one snippet of its own request (no axioms report)."""
        if self._closed:
            raise RuntimeError("RemoteVerifier is closed")
        with self._statement_lock:
            if self._statement_executor is None:
                self._statement_executor = concurrent.futures.ThreadPoolExecutor(
                    len(self._senders), thread_name_prefix="kimina-statement")
        return self._statement_executor.submit(self._check_statement_now, VerifyRequest.statement_check(header, statement))

    def _check_statement_now(self, request: VerifyRequest) -> VerifyResult:
        self._stats.event("statement_check")
        payload = {"snippets": [{"id": f"sgs-{next(self._ids)}", "code": request.lean_source() + "\n"}],
                   "timeout": int(math.ceil(self.timeout_s)), "debug": False, "reuse": True, "infotree": None}
        try:
            results = self._post_with_retries(payload)
            item = next((r for r in results if isinstance(r, dict)), None)
            if item is None:
                return VerifyResult.failure(Status.SYSTEM_ERROR, "server returned no result for this item")
            return judge_remote_statement(item)
        except RequestFailed as err:
            return VerifyResult.failure(Status.SYSTEM_ERROR, f"remote: {err}"[:200])
        except Exception as err:  # malformed result: never raise into a future
            return VerifyResult.failure(Status.SYSTEM_ERROR, f"malformed server result: {err!r}"[:200])

    def close(self) -> None:
        """Send what is queued, then stop the sender threads."""
        if self._closed:
            return
        self._closed = True
        if self._statement_executor is not None:
            self._statement_executor.shutdown(wait=True)
        for _ in self._senders:
            self._queue.put(_STOP)
        for thread in self._senders:
            thread.join()

    # ------------------------------------------------------------------ internals

    def _finish(self, future: concurrent.futures.Future, result: VerifyResult) -> None:
        self._stats.record(result)
        future.set_result(result)

    def _sender(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch, stop = [first], False
            deadline = time.monotonic() + self.linger_s
            while len(batch) < self.batch_size:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            self._send_batch(batch)
            if stop:
                return

    def _send_batch(self, batch: list) -> None:
        ids = [f"sgs-{next(self._ids)}" for _ in batch]
        payload = {
            "snippets": [{"id": i, "code": remote_code(r, name)} for i, (r, name, _) in zip(ids, batch)],
            "timeout": int(math.ceil(self.timeout_s)),
            "debug": False,
            "reuse": True,
            "infotree": None,
        }
        self._stats.event("http_batch")
        try:
            results = self._post_with_retries(payload)
        except RequestFailed as err:
            for _, _, future in batch:
                self._finish(future, VerifyResult.failure(Status.SYSTEM_ERROR, f"remote: {err}"[:200]))
            return
        by_id = {str(item.get("id")): item for item in results if isinstance(item, dict)}
        for snippet_id, (_, name, future) in zip(ids, batch):
            item = by_id.get(snippet_id)
            try:
                result = (
                    judge_remote(item, name)
                    if item is not None
                    else VerifyResult.failure(Status.SYSTEM_ERROR, "server returned no result for this item")
                )
            except Exception as err:  # malformed result: never raise into a future
                result = VerifyResult.failure(Status.SYSTEM_ERROR, f"malformed server result: {err!r}"[:200])
            self._finish(future, result)

    def _post_with_retries(self, payload: dict[str, Any]) -> list:
        for attempt in range(self.retries + 1):
            try:
                return self._post(payload)
            except RequestFailed as err:
                if not err.retryable or attempt == self.retries:
                    raise
                self._stats.event("http_retry")
                time.sleep(min(self.max_backoff_s, self.backoff_s * 2**attempt))
        raise AssertionError("unreachable")

    def _post(self, payload: dict[str, Any]) -> list:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        request = urllib.request.Request(self.endpoint, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.http_timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as err:
            raise RequestFailed(f"HTTP {err.code} {err.reason}", retryable=err.code >= 500 or err.code == 429) from err
        except (urllib.error.URLError, OSError) as err:  # refused, reset, socket timeout
            raise RequestFailed(f"connection failed: {err}", retryable=True) from err
        try:
            parsed = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RequestFailed(f"unparsable reply: {body[:100]!r}", retryable=True) from err
        results = parsed.get("results") if isinstance(parsed, dict) else parsed
        if not isinstance(results, list):
            raise RequestFailed(f"reply without results: {body[:100]!r}", retryable=True)
        return results


register_backend("remote", RemoteVerifier)
