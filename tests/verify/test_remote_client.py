"""Remote (Kimina Lean Server) client against a local server speaking its protocol (fake_kimina.py)."""

import re

import pytest

from fake_kimina import FakeKimina, split_snippet
from sgs_jax.verify import make_backend, remote
from sgs_jax.verify.interface import Status, VerifierUnavailable, VerifyRequest
from sgs_jax.verify.remote import RemoteVerifier, split_header_imports
from verify_test_support import D3K_HEADER

STATEMENT = "theorem lean_workbook_2 (a b : ℝ) (ha : 0 < a) (hb : 0 < b) : 0 < a * b := by"


@pytest.fixture
def server_factory():
    """FakeKimina servers, stopped after the test."""
    servers = []

    def make(**kwargs):
        servers.append(FakeKimina(**kwargs))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


def req(proof):
    return VerifyRequest(D3K_HEADER, STATEMENT, proof)


CASES = [
    ("\n  positivity", Status.VERIFIED),
    ("\n  exact bogus_mul_pos ha hb", Status.LEAN_ERROR),
    ("\n  sorry", Status.REJECTED),
    ("\n  native_decide", Status.REJECTED),
    ("\n  simp -- fake:hang", Status.TIMEOUT),
    ("\n  simp -- fake:crash", Status.SYSTEM_ERROR),
    ("\n  apply?", Status.REJECTED),  # pre-check: never sent
    ("\n  simp -- fake:repl_message", Status.LEAN_ERROR),
]


def test_verdicts_batching_and_request_shape(server_factory):
    server = server_factory(api_key="s3cret")
    with RemoteVerifier(server.url, api_key="s3cret", timeout_s=30, batch_size=3, concurrency=1, linger_s=0.2,
                        retries=2, backoff_s=0.01) as verifier:
        results = verifier.verify_batch([req(p) for p, _ in CASES])
        stats = verifier.stats()
    assert [r.status for r in results] == [s for _, s in CASES]
    assert results[4].reason.startswith("server: Lean REPL command timed out")
    assert "HTTP 500 Lean process encountered an error: crash" in results[5].reason
    assert not any("apply?" in s["code"] for s in server.snippets_sent())
    # The crash fails its whole request (as the server's gather does); its items are then
    # retried one per request, so only the crashing item ends as a system error.
    assert [len(r["body"]["snippets"]) for r in server.requests] == [3, 3, 1, 1, 1, 1, 1]
    first = server.requests[0]
    assert first["path"] == "/api/check" and first["auth"] == "Bearer s3cret"
    assert first["body"]["timeout"] == 30 and first["body"]["reuse"] is True
    code = first["body"]["snippets"][0]["code"]
    assert code.startswith(D3K_HEADER.rstrip()) and code.rstrip().endswith("#print axioms lean_workbook_2")
    assert STATEMENT + "\n  positivity" in code
    assert stats["by_status"]["verified"] == 1 and stats["events"]["http_request"] == 7
    assert stats["events"]["item_retry"] == 3 + 1


def test_trace_cannot_fake_the_axioms_report(server_factory):
    server = server_factory()
    spoof = "\n  trace \"'lean_workbook_2' does not depend on any axioms\"\n  native_decide"
    with RemoteVerifier(server.url, batch_size=1) as verifier:
        result = verifier.submit(req(spoof)).result()
    assert result.status is Status.REJECTED and "Lean.ofReduceBool" in result.reason


def test_failed_requests_are_retried_with_backoff(server_factory):
    server = server_factory(request_faults=[(429, "No available REPLs"), (500, "Failed to start REPL")], garbage_first=3)
    with RemoteVerifier(server.url, retries=3, backoff_s=0.01, batch_size=4) as verifier:
        result = verifier.submit(req("\n  positivity")).result()
        stats = verifier.stats()
    assert result.verified
    assert len(server.requests) == 4 and stats["events"]["http_error"] == 3 and stats["events"]["item_retry"] == 3


@pytest.mark.parametrize(
    "errors",
    [
        ["Lean REPL header command timed out in 30 seconds"],  # a REPL's header preparation
        ["Failed to get REPL: pool exhausted", "No available REPLs"],
        ["REPL prep failed"],
    ],
)
def test_transient_item_errors_are_retried_alone(server_factory, errors):
    server = server_factory(item_faults={"MARK": list(errors)})
    proofs = ["\n  positivity", "\n  positivity -- MARK", "\n  nlinarith [ha, hb]"]
    with RemoteVerifier(server.url, retries=3, backoff_s=0.01, batch_size=3, concurrency=1, linger_s=0.2) as verifier:
        results = verifier.verify_batch([req(p) for p in proofs])
        stats = verifier.stats()
    assert all(r.verified for r in results)
    assert [len(r["body"]["snippets"]) for r in server.requests] == [3] + [1] * len(errors)
    assert stats["events"]["item_retry"] == len(errors)


def test_item_errors_that_persist_become_system_errors_and_timeouts_are_final(server_factory):
    server = server_factory(item_faults={"MARK": ["No available REPLs"] * 10})
    with RemoteVerifier(server.url, retries=2, backoff_s=0.01, batch_size=2, concurrency=1, linger_s=0.2) as verifier:
        marked, hung = verifier.verify_batch([req("\n  simp -- MARK"), req("\n  simp -- fake:hang")])
    assert marked.status is Status.SYSTEM_ERROR and marked.reason == "server: No available REPLs"
    assert hung.status is Status.TIMEOUT
    assert sum("fake:hang" in s["code"] for s in server.snippets_sent()) == 1  # a proof timeout is not retried


def test_persistent_server_failure_is_a_system_error(server_factory):
    server = server_factory(request_faults=[(500, "Failed to start REPL")] * 100)
    with RemoteVerifier(server.url, retries=2, backoff_s=0.01, concurrency=1, linger_s=0.2) as verifier:
        results = verifier.verify_batch([req("\n  positivity"), req("\n  simp")])
    assert all(r.status is Status.SYSTEM_ERROR and "HTTP 500 Failed to start REPL" in r.reason for r in results)
    assert [len(r["body"]["snippets"]) for r in server.requests] == [2, 1, 1, 1, 1]  # then each alone, twice


@pytest.mark.parametrize("client_key, message", [("wrong", "Invalid API key"), (None, "Missing API key")])
def test_refused_credentials_stop_everything_with_the_servers_message(server_factory, monkeypatch, client_key, message):
    monkeypatch.delenv(remote.API_KEY_ENV, raising=False)
    server = server_factory(api_key="right")
    with RemoteVerifier(server.url, api_key=client_key, retries=3, backoff_s=0.01, batch_size=1, concurrency=1) as verifier:
        futures = [verifier.submit(req("\n  positivity")), verifier.submit(req("\n  simp"))]
        for future in futures:
            with pytest.raises(VerifierUnavailable, match=f"HTTP 401 {message}"):
                future.result(timeout=10)
        with pytest.raises(VerifierUnavailable):
            verifier.submit(req("\n  rfl"))
    assert len(server.requests) == 1  # nothing retried, nothing else sent
    if client_key is None:
        assert remote.API_KEY_ENV in str(futures[0].exception())


def test_api_key_from_the_environment(server_factory, monkeypatch):
    monkeypatch.setenv(remote.API_KEY_ENV, "from-env")
    server = server_factory(api_key="from-env")
    with RemoteVerifier(server.url) as verifier:
        assert verifier.submit(req("\n  positivity")).result().verified
    assert server.requests[0]["auth"] == "Bearer from-env"


@pytest.mark.parametrize(
    "header",
    [
        "-- trusted header\n" + D3K_HEADER,  # a comment first
        "/- imports\n   below -/\nimport Mathlib\nset_option maxHeartbeats 0\nimport Aesop\nopen Real\n",  # import after a command
        "import Mathlib /- a comment that\n  spans lines -/\nimport Aesop -- and a line comment\nopen Real\n",
    ],
)
def test_imports_lead_the_snippet_whatever_the_header_starts_with(server_factory, header):
    server = server_factory()
    with RemoteVerifier(server.url) as verifier:
        result = verifier.submit(VerifyRequest(header, STATEMENT, "\n  positivity")).result()
    assert result.verified, result.reason
    server_header, body = split_snippet(server.snippets_sent()[0]["code"])
    assert server_header == "import Mathlib\nimport Aesop" and not re.search(r"^\s*import\s", body, re.M)


def test_split_header_imports_respects_comments():
    imports, rest = split_header_imports("/- import Fake -/\nimport A B -- c\nopen X\n")
    assert imports == ["import A B"]
    assert rest == "/- import Fake -/\n" + " " * 11 + "-- c\nopen X\n"  # the command blanked, the comment kept


def test_request_timeout_grows_with_the_batch(server_factory, monkeypatch):
    monkeypatch.setattr(remote, "HTTP_MARGIN_S", 0.2)
    # 4 snippets at 0.2 s each: 0.8 s, beyond timeout_s + margin (0.5 s) but within 4 x 0.3 + 0.2.
    server = server_factory(seconds_per_snippet=0.2)
    with RemoteVerifier(server.url, timeout_s=0.3, retries=0, batch_size=4, concurrency=1, linger_s=0.3) as verifier:
        assert verifier.http_timeout(1) == pytest.approx(0.5) and verifier.http_timeout(4) == pytest.approx(1.4)
        results = verifier.verify_batch([req("\n  positivity")] * 4)
    assert all(r.verified for r in results) and len(server.requests) == 1
    assert RemoteVerifier(server.url, http_timeout_s=7).http_timeout(100) == 7


def test_unreachable_server_and_bad_url():
    with make_backend("remote", url="http://127.0.0.1:9", retries=1, backoff_s=0.01, http_timeout_s=2) as verifier:
        result = verifier.submit(req("\n  positivity")).result()
    assert result.status is Status.SYSTEM_ERROR and "connection failed" in result.reason
    with pytest.raises(ValueError, match="http"):
        RemoteVerifier("lean-fleet:8000")
