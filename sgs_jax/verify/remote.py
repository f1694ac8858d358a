"""Remote backend: a client for Kimina Lean Server (project-numina/kimina-lean-server).

Large runs check proofs on a CPU fleet behind this HTTP API. Standard library only.

Request: `POST {url}/api/check` with
  {"snippets": [{"id": str, "code": str}, ...], "timeout": int seconds,
   "debug": false, "reuse": true, "infotree": null}
and, when an API key is set (`api_key`, else the environment variable
LEAN_SERVER_API_KEY, the official client's name), the header `Authorization: Bearer KEY`.
Reply: {"results": [{"id", "time", "error", "response", "diagnostics"}, ...]} where
`response` is the Lean REPL's own reply (`env`, `messages`, `sorries`, or `message`) and
`error` a server-side failure ("Lean REPL command timed out in N seconds", "Lean REPL
header command timed out in N seconds"). Errors of the whole request come as HTTP
statuses with {"detail": message}: 401 "Missing API key" / "Invalid API key", 429 "No
available REPLs", 500 with the failure ("Failed to start REPL", "Failed to run header on
REPL", a REPL crash while running a snippet).

The server splits each snippet into a header (its leading `import` and blank lines, run
once per REPL) and a body. Each snippet is therefore the trusted header's `import`
commands, then the rest of the trusted header, the statement + proof and `#print axioms
NAME`, whatever came first in the header (a comment, say). The same rules as the local
backend judge the reply, and only the last-positioned message may be the axioms report
(see `rules.axioms_from_messages`).

Faults: items are batched (up to `batch_size` per request, `concurrency` requests in
flight). A failed request (connection error, HTTP 5xx/429, unparsable body) and an item
with a server error other than its own proof timeout (a REPL that could not be had or
prepared) are retried up to `retries` times with exponential backoff, each retried item in
a request of its own (one item that breaks the server's request cannot take others down);
then they become `system_error`. HTTP 401/403 stops everything: submit and every pending
future raise `VerifierUnavailable` with the server's message. The socket timeout of a
request grows with its size (the server may take about `timeout` per snippet).
Registers backend `remote`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import math
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from sgs_jax.verify import rules
from sgs_jax.verify.interface import Status, Verifier, VerifierUnavailable, VerifyRequest, VerifyResult, register_backend
from sgs_jax.verify.stats import VerifyStats

API_KEY_ENV = "LEAN_SERVER_API_KEY"
HTTP_MARGIN_S = 60.0  # socket timeout beyond timeout_s x snippets (queueing, transfer)
_STOP = object()


class RequestFailed(Exception):
    """An HTTP request that failed; `retryable`: trying again may help; `fatal`: no
    request can succeed (the server refuses our credentials)."""

    def __init__(self, message: str, retryable: bool, fatal: bool = False):
        super().__init__(message)
        self.retryable, self.fatal = retryable, fatal


@dataclasses.dataclass(frozen=True)
class _Item:
    request: VerifyRequest
    name: str  # the theorem the axioms report must be about
    future: concurrent.futures.Future


def split_header_imports(header: str) -> tuple[list[str], str]:
    """(the header's `import` commands, the header without them).

    Comments are respected: an `import` inside a comment is not one, and a comment that
    starts on an import line stays whole in the rest (only the command's own characters
    are removed, so line structure and every other character survive)."""
    blanked, _ = rules.scan_comments(header, keep_positions=True)
    imports: list[str] = []
    rest = list(header)
    offset = 0
    for line in blanked.split("\n"):
        command = line.strip()
        if command.startswith("import ") or command == "import":
            start = offset + line.index(command)
            imports.append(command)
            rest[start : start + len(command)] = " " * len(command)
        offset += len(line) + 1
    return imports, "".join(rest)


def _snippet(request: VerifyRequest, tail: str) -> str:
    """The trusted header's imports first (so the server's header split sees them), the
    rest of the header, the request's statement + proof, then `tail`."""
    imports, rest = split_header_imports(request.header)
    lines = rest.split("\n")
    while lines and not lines[0].strip():  # what the removed imports left behind
        lines.pop(0)
    header = "\n".join(imports + lines).rstrip()  # a header already in this order is unchanged
    return (header + "\n\n" if header else "") + request.body() + tail


def remote_code(request: VerifyRequest, name: str) -> str:
    """The snippet sent to the server: header, statement + proof, the axioms report."""
    return _snippet(request, "\n\n" + rules.axioms_command(name) + "\n")


def statement_code(request: VerifyRequest) -> str:
    """The snippet of a statement check (`VerifyRequest.statement_check`): no axioms report."""
    return _snippet(request, "\n")


def is_retryable_item_error(error: str) -> bool:
    """Whether a per-item server error is worth another try: any failure except the
    proof's own timeout (a header that timed out is a REPL preparation failure)."""
    return "timed out" not in error or "header" in error


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


def _server_message(body: bytes) -> str:
    """The server's own explanation in an error body ({"detail": ...}), else its text."""
    try:
        detail = json.loads(body).get("detail")
        if detail:
            return str(detail)[:200]
    except (ValueError, AttributeError, UnicodeDecodeError):
        pass
    return body[:200].decode("utf-8", "replace").strip()


class RemoteVerifier(Verifier):
    """Kimina Lean Server client (see module docstring).

    url: server base URL, e.g. "http://lean-fleet:8000".
    api_key: sent as a Bearer token; None reads the environment variable
      LEAN_SERVER_API_KEY (keeps the key out of `ps` and out of a run's config.json).
    timeout_s: per-proof Lean timeout asked of the server.
    batch_size: snippets per HTTP request; concurrency: requests in flight.
    retries: extra attempts per request and per item; backoff_s: first wait, doubled each
      retry (capped at max_backoff_s).
    http_timeout_s: socket timeout per request (default: timeout_s x snippets + 60 s).
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
        self.url = url.rstrip("/")
        self.endpoint = self.url + "/api/check"
        self.api_key = api_key or os.environ.get(API_KEY_ENV) or None
        self.timeout_s = float(timeout_s)
        self.batch_size, self.retries = int(batch_size), int(retries)
        self.backoff_s, self.max_backoff_s, self.linger_s = backoff_s, max_backoff_s, linger_s
        self.http_timeout_s = http_timeout_s
        self._stats = VerifyStats()
        self._queue: queue.Queue = queue.Queue()
        self._ids = itertools.count()
        self._closed = False
        self._fatal: VerifierUnavailable | None = None
        self._senders = [threading.Thread(target=self._sender, daemon=True, name=f"kimina-{i}") for i in range(concurrency)]
        self._statement_lock = threading.Lock()
        self._statement_executor: concurrent.futures.ThreadPoolExecutor | None = None  # made on first use
        for thread in self._senders:
            thread.start()

    def submit(self, request: VerifyRequest) -> "concurrent.futures.Future[VerifyResult]":
        if self._fatal is not None:
            raise self._fatal
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
            self._queue.put(_Item(request, name, future))
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
        """One request per check; the proofs' retry rules (request failures and retryable
        item errors, with backoff); after a fatal refusal it raises like `submit`."""
        self._stats.event("statement_check")
        for attempt in range(self.retries + 1):
            if self._fatal is not None:
                raise self._fatal
            last = attempt == self.retries
            if attempt:
                time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
            payload = {"snippets": [{"id": f"sgs-{next(self._ids)}", "code": statement_code(request)}],
                       "timeout": int(math.ceil(self.timeout_s)), "debug": False, "reuse": True, "infotree": None}
            try:
                results = self._post(payload, self.http_timeout(1))
            except RequestFailed as err:
                if err.fatal:
                    self._fatal = VerifierUnavailable(f"remote verifier {self.url}: {err}")
                    raise self._fatal from err
                if err.retryable and not last:
                    continue
                return VerifyResult.failure(Status.SYSTEM_ERROR, f"remote: {err}"[:200])
            entry = next((r for r in results if isinstance(r, dict)), None)
            if entry is None:
                if last:
                    return VerifyResult.failure(Status.SYSTEM_ERROR, "server returned no result for this item")
                continue
            error = str(entry.get("error") or "")
            if error and is_retryable_item_error(error) and not last:
                continue
            try:
                return judge_remote_statement(entry)
            except Exception as err:  # malformed result: never raise into a future
                return VerifyResult.failure(Status.SYSTEM_ERROR, f"malformed server result: {err!r}"[:200])
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Send what is queued (or fail it at once after a fatal error), then stop the senders."""
        if self._closed:
            return
        self._closed = True
        if self._statement_executor is not None:
            self._statement_executor.shutdown(wait=True)
        for _ in self._senders:
            self._queue.put(_STOP)
        for thread in self._senders:
            thread.join()

    def http_timeout(self, snippets: int) -> float:
        """Socket timeout of a request of `snippets` snippets, seconds."""
        if self.http_timeout_s is not None:
            return float(self.http_timeout_s)
        return self.timeout_s * snippets + HTTP_MARGIN_S

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

    def _send_batch(self, batch: list[_Item]) -> None:
        """Resolve every item of `batch`: one request, then retries of what failed, each
        retried item alone."""
        pending = self._attempt(batch, last=self.retries == 0)
        for attempt in range(1, self.retries + 1):
            if not pending:
                return
            time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
            retry: list[_Item] = []
            for item in pending:
                retry += self._attempt([item], last=attempt == self.retries)
            pending = retry

    def _attempt(self, items: list[_Item], last: bool) -> list[_Item]:
        """Send `items` in one request; resolve what is final, return what to retry."""
        if self._fatal is not None:
            for item in items:
                item.future.set_exception(self._fatal)
            return []
        ids = [f"sgs-{next(self._ids)}" for _ in items]
        payload = {
            "snippets": [{"id": i, "code": remote_code(item.request, item.name)} for i, item in zip(ids, items)],
            "timeout": int(math.ceil(self.timeout_s)),
            "debug": False,
            "reuse": True,
            "infotree": None,
        }
        self._stats.event("http_request")
        try:
            results = self._post(payload, self.http_timeout(len(items)))
        except RequestFailed as err:
            if err.fatal:
                self._fatal = VerifierUnavailable(f"remote verifier {self.url}: {err}")
                for item in items:
                    item.future.set_exception(self._fatal)
                return []
            if err.retryable and not last:
                self._stats.event("http_error")
                self._stats.event("item_retry", len(items))
                return items
            for item in items:
                self._finish(item.future, VerifyResult.failure(Status.SYSTEM_ERROR, f"remote: {err}"[:200]))
            return []
        by_id = {str(entry.get("id")): entry for entry in results if isinstance(entry, dict)}
        retry = []
        for snippet_id, item in zip(ids, items):
            entry = by_id.get(snippet_id)
            error = "server returned no result for this item" if entry is None else str(entry.get("error") or "")
            if error and is_retryable_item_error(error) and not last:
                self._stats.event("item_retry")
                retry.append(item)
                continue
            try:
                result = (
                    judge_remote(entry, item.name)
                    if entry is not None
                    else VerifyResult.failure(Status.SYSTEM_ERROR, error)
                )
            except Exception as err:  # malformed result: never raise into a future
                result = VerifyResult.failure(Status.SYSTEM_ERROR, f"malformed server result: {err!r}"[:200])
            self._finish(item.future, result)
        return retry

    def _post(self, payload: dict[str, Any], timeout_s: float) -> list:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        request = urllib.request.Request(self.endpoint, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as err:
            message = f"HTTP {err.code} {_server_message(err.read())}"
            if err.code in (401, 403):
                hint = "" if self.api_key else f" (no API key given: set {API_KEY_ENV} or api_key)"
                raise RequestFailed(f"the server refused the request: {message}{hint}", False, fatal=True) from err
            raise RequestFailed(message, retryable=err.code >= 500 or err.code == 429) from err
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
