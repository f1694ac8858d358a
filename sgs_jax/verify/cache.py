"""Result cache keyed by (header, statement, proof), and a caching wrapper for any backend.

The same proof is never checked twice in a run: results are kept in memory and, when a
path is given, appended to a JSONL file that lives with the run, so a resumed run loads
them back. System errors are not cached (they say nothing about the proof). Identical
items submitted while the first is still being checked share its future.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
from typing import Any

from sgs_jax import jsonl
from sgs_jax.faults import fault_point
from sgs_jax.verify.interface import Status, Verifier, VerifyRequest, VerifyResult

log = logging.getLogger(__name__)

Key = tuple[str, str, str]


class ResultCache:
    """Thread-safe map (header, statement, proof) -> VerifyResult, optionally on disk.

    path: JSONL file, one `{"key": [header, statement, proof], "result": {...}}` per line;
      loaded at construction (a torn last line from a killed run is cut off) and
      appended to on every `put`.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = os.fspath(path) if path is not None else None
        self._lock = threading.Lock()
        self._results: dict[Key, VerifyResult] = {}
        self._file: jsonl.Appender | None = None
        if self.path and os.path.exists(self.path):
            self._load()

    def _load(self) -> None:
        jsonl.repair_tail(self.path)
        rows, bad = jsonl.read_records(self.path)
        for row in rows:
            try:
                self._results[tuple(row["key"])] = VerifyResult.from_json(row["result"])
            except (KeyError, TypeError, ValueError):
                bad += 1
        if bad:
            log.warning("verdict cache %s: skipped %d unreadable lines", self.path, bad)

    def get(self, key: Key) -> VerifyResult | None:
        with self._lock:
            return self._results.get(key)

    def put(self, key: Key, result: VerifyResult) -> bool:
        """Store a result (not system errors); returns whether it was stored."""
        if result.status is Status.SYSTEM_ERROR:
            return False
        with self._lock:
            if key in self._results:
                return False
            self._results[key] = result
            if self.path:
                self._append({"key": list(key), "result": result.to_json()})
        return True

    def _append(self, row: dict) -> None:
        """Append one line (lock held); on a storage error go memory-only, with one warning."""
        try:
            if self._file is None:
                self._file = jsonl.Appender(self.path, sync=False)
            self._file.append(row)
            fault_point("verification", self.path)
        except OSError as err:
            log.warning("verdict cache %s cannot be written (%s); keeping verdicts in memory only",
                        self.path, err.strerror or err)
            self.path = None
            if self._file is not None:
                self._file.close()
                self._file = None

    def close(self) -> None:
        """Close the file (later puts reopen it)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._results)


class CachingVerifier(Verifier):
    """Wraps a backend: cache hits resolve at once (time_s = 0), misses go to `inner`."""

    def __init__(self, inner: Verifier, cache: ResultCache | None = None):
        self.inner = inner
        self.cache = cache if cache is not None else ResultCache()
        self.name = f"cached-{inner.name}"
        self._lock = threading.Lock()
        self._pending: dict[Key, concurrent.futures.Future] = {}
        self._hits = 0
        self._misses = 0

    def submit(self, request: VerifyRequest) -> "concurrent.futures.Future[VerifyResult]":
        key = request.key()
        cached = self.cache.get(key)
        with self._lock:
            if cached is None and key in self._pending:  # same item already in flight
                self._hits += 1
                return self._pending[key]
            if cached is not None:
                self._hits += 1
                done: concurrent.futures.Future = concurrent.futures.Future()
                done.set_result(dataclasses.replace(cached, time_s=0.0))
                return done
            self._misses += 1
            future = self.inner.submit(request)
            self._pending[key] = future
        future.add_done_callback(lambda f, key=key: self._finish(key, f))
        return future

    def _finish(self, key: Key, future: concurrent.futures.Future) -> None:
        if not future.cancelled() and future.exception() is None:
            self.cache.put(key, future.result())
        with self._lock:
            self._pending.pop(key, None)

    def check_statement(self, header: str, statement: str) -> "concurrent.futures.Future[VerifyResult]":
        """Statement checks are cheap and not cached: straight to the backend."""
        return self.inner.check_statement(header, statement)

    def stats(self) -> dict[str, Any]:
        stats = dict(self.inner.stats())
        with self._lock:
            stats["cache"] = {"hits": self._hits, "misses": self._misses, "size": len(self.cache)}
        return stats

    def close(self) -> None:
        self.inner.close()
        self.cache.close()
