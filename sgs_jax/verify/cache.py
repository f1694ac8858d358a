"""Result cache keyed by (header, statement, proof), and a caching wrapper for any backend.

The same proof is never checked twice in a run: results are kept in memory and, when a
path is given, appended to a JSONL file that lives with the run, so a resumed run loads
them back. System errors are not cached (they say nothing about the proof). Identical
items submitted while the first is still being checked share its future.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import threading
from typing import Any

from sgs_jax.verify.interface import Status, Verifier, VerifyRequest, VerifyResult

Key = tuple[str, str, str]


class ResultCache:
    """Thread-safe map (header, statement, proof) -> VerifyResult, optionally on disk.

    path: JSONL file, one `{"key": [header, statement, proof], "result": {...}}` per line;
      loaded at construction (a torn last line from a killed run is skipped) and
      appended to on every `put`.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = os.fspath(path) if path is not None else None
        self._lock = threading.Lock()
        self._results: dict[Key, VerifyResult] = {}
        if self.path and os.path.exists(self.path):
            self._load()

    def _load(self) -> None:
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                    self._results[tuple(row["key"])] = VerifyResult.from_json(row["result"])
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue  # a line torn by a crash mid-write

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
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": list(key), "result": result.to_json()}, ensure_ascii=False) + "\n")
        return True

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
