"""Result cache: hits skip Lean, persistence across runs, no caching of system errors."""

import concurrent.futures
import json
import threading

from sgs_jax.verify.cache import CachingVerifier, ResultCache
from sgs_jax.verify.interface import Status, Verifier, VerifyRequest, VerifyResult
from sgs_jax.verify.lean_pool import LeanPool
from verify_test_support import D3K_HEADER

STATEMENT = "theorem t (x : ℝ) : x ^ 2 ≥ 0 := by"


class CountingVerifier(Verifier):
    """Answers from a table, counting calls; `gate` holds answers back until set."""

    name = "counting"

    def __init__(self, answers):
        self.answers, self.calls, self.gate = answers, [], threading.Event()
        self.gate.set()
        self._pool = concurrent.futures.ThreadPoolExecutor(2)

    def submit(self, request):
        self.calls.append(request.proof)
        return self._pool.submit(lambda: (self.gate.wait(5), self.answers[request.proof])[1])

    def close(self):
        self._pool.shutdown()


OK = VerifyResult(True, Status.VERIFIED, "", ({"severity": "info", "data": "'t' does not depend on any axioms"},), 1.5)
BAD = VerifyResult.failure(Status.LEAN_ERROR, "error: unsolved goals", time_s=0.7)
LOST = VerifyResult.failure(Status.SYSTEM_ERROR, "REPL failed", time_s=0.1)


def req(proof):
    return VerifyRequest(D3K_HEADER, STATEMENT, proof)


def test_hits_skip_the_backend_and_report_zero_time():
    inner = CountingVerifier({"a": OK, "b": BAD})
    with CachingVerifier(inner) as verifier:
        first = verifier.verify_batch([req("a"), req("b")])
        again = verifier.verify_batch([req("a"), req("b"), req("a")])
        stats = verifier.stats()
    assert inner.calls == ["a", "b"]
    assert first == [OK, BAD]
    assert [r.status for r in again] == [Status.VERIFIED, Status.LEAN_ERROR, Status.VERIFIED]
    assert all(r.time_s == 0.0 for r in again) and again[0].messages == OK.messages
    assert stats["cache"] == {"hits": 3, "misses": 2, "size": 2}


def test_identical_items_in_flight_are_checked_once():
    inner = CountingVerifier({"a": OK})
    inner.gate.clear()
    with CachingVerifier(inner) as verifier:
        futures = [verifier.submit(req("a")) for _ in range(3)]
        inner.gate.set()
        assert [f.result() for f in futures] == [OK] * 3
    assert inner.calls == ["a"]


def test_system_errors_are_not_cached():
    inner = CountingVerifier({"x": LOST})
    with CachingVerifier(inner) as verifier:
        verifier.submit(req("x")).result()
        verifier.submit(req("x")).result()
    assert inner.calls == ["x", "x"]


def test_persisted_cache_survives_a_restart_and_a_torn_line(tmp_path):
    path = tmp_path / "verify_cache.jsonl"
    with CachingVerifier(CountingVerifier({"a": OK, "b": BAD}), ResultCache(path)) as verifier:
        verifier.verify_batch([req("a"), req("b")])
    with open(path, "a") as f:
        f.write('{"key": ["h", "s", "p"], "result": {"verif')  # killed mid-write
    reloaded = ResultCache(path)
    assert len(reloaded) == 2
    assert reloaded.get(req("a").key()) == OK and reloaded.get(req("b").key()) == BAD
    inner = CountingVerifier({"a": OK, "b": BAD})
    with CachingVerifier(inner, reloaded) as verifier:
        assert [r.status for r in verifier.verify_batch([req("b"), req("a")])] == [Status.LEAN_ERROR, Status.VERIFIED]
    assert inner.calls == []
    rows = [json.loads(line) for line in path.read_text().splitlines()[:2]]
    assert rows[0]["key"] == [D3K_HEADER, STATEMENT, "a"] and rows[0]["result"]["status"] == "verified"


def test_a_line_torn_inside_a_multibyte_character_is_cut_and_appends_go_on(tmp_path, caplog):
    """A kill mid-write cut the last line inside `ℝ` (3 bytes in UTF-8); a line in the
    middle is garbage. Loading neither fails nor glues the next verdict onto the fragment."""
    path = tmp_path / "verify_cache.jsonl"
    with CachingVerifier(CountingVerifier({"a": OK}), ResultCache(path)) as verifier:
        verifier.verify_batch([req("a")])
    with open(path, "ab") as f:
        f.write(b"\xff garbage\n")
        f.write(json.dumps({"key": [D3K_HEADER, STATEMENT, "b"]}, ensure_ascii=False).encode()[:-6])
    with caplog.at_level("WARNING"):
        reloaded = ResultCache(path)
    assert len(reloaded) == 1 and "skipped 1 unreadable lines" in caplog.text
    assert path.read_bytes().endswith(b"\n")
    with CachingVerifier(CountingVerifier({"b": BAD}), reloaded) as verifier:
        verifier.verify_batch([req("b")])
    again = ResultCache(path)
    assert again.get(req("a").key()) == OK and again.get(req("b").key()) == BAD


def test_a_full_disk_keeps_the_cache_in_memory_with_one_warning(tmp_path, monkeypatch, caplog):
    path = tmp_path / "verify_cache.jsonl"
    cache = ResultCache(path)
    cache.put(req("a").key(), OK)
    monkeypatch.setenv("SGS_FAULT_AT", "verification:enospc")
    with caplog.at_level("WARNING"):
        cache.put(req("b").key(), BAD)
        cache.put(req("c").key(), BAD)
    monkeypatch.delenv("SGS_FAULT_AT")
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].getMessage()
    assert len(cache) == 3  # still answered from memory
    assert {tuple(json.loads(line)["key"])[2] for line in path.read_text(encoding="utf-8").splitlines()} <= {"a", "b"}
    cache.close()


def test_cache_around_the_lean_pool(fake_repl):
    inner = LeanPool(repl_cmd=fake_repl.cmd(), workers=1, timeout_s=2.0, memory_limit_gib=1.0)
    with CachingVerifier(inner) as verifier:
        for _ in range(3):
            assert verifier.submit(req("\n  simp")).result().verified
    assert len(fake_repl.events("proof")) == 1
