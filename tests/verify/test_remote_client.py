"""Remote (Kimina Lean Server) client against a local test server of the same API shape."""

import http.server
import json
import threading

import pytest

from fake_lean_repl import FakeControl, FakeLean
from sgs_jax.verify import make_backend
from sgs_jax.verify.interface import Status, VerifyRequest
from sgs_jax.verify.remote import RemoteVerifier
from verify_test_support import D3K_HEADER

STATEMENT = "theorem lean_workbook_2 (a b : ℝ) (ha : 0 < a) (hb : 0 < b) : 0 < a * b := by"


class FakeKimina(http.server.ThreadingHTTPServer):
    """POST /api/check as Kimina serves it, judged by the fake Lean of the fake REPL."""

    def __init__(self, fail_first=0, fail_code=503, garbage_first=0, api_key=None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fail_first, self.fail_code, self.garbage_first = fail_first, fail_code, garbage_first
        self.api_key = api_key
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self):
        self.shutdown()
        self.server_close()

    def check(self, snippet, timeout):
        """One snippet: split off the imports (as Kimina does), run the body in that env."""
        lines = snippet["code"].split("\n")
        n = 0
        while n < len(lines) and (lines[n].startswith("import ") or not lines[n].strip()):
            n += 1
        lean = FakeLean()
        try:
            lean.run({"cmd": "\n".join(lines[:n])})
            reply = lean.run({"cmd": "\n".join(lines[n:]), "env": 0})
        except FakeControl as control:
            if control.kind == "hang":
                return {"id": snippet["id"], "time": float(timeout), "error": f"Lean REPL command timed out in {timeout} seconds"}
            return {"id": snippet["id"], "time": 0.1, "error": f"REPL died ({control.kind})"}
        return {"id": snippet["id"], "time": 0.01, "error": None, "response": reply}


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
            n = len(server.requests)
        if self.path != "/api/check":
            return self._send(404, b'{"detail": "Not Found"}')
        if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
            return self._send(401, b'{"detail": "Invalid API key"}')
        if n <= server.fail_first:
            return self._send(server.fail_code, b'{"detail": "No available REPLs"}')
        if n <= server.fail_first + server.garbage_first:
            return self._send(200, b"<html>proxy error</html>")
        results = [server.check(s, body["timeout"]) for s in body["snippets"]]
        self._send(200, json.dumps({"results": results}).encode())

    def _send(self, code, data):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server_factory():
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
    with RemoteVerifier(server.url, api_key="s3cret", timeout_s=30, batch_size=3, concurrency=1, linger_s=0.2) as verifier:
        results = verifier.verify_batch([req(p) for p, _ in CASES])
        stats = verifier.stats()
    assert [r.status for r in results] == [s for _, s in CASES]
    assert results[4].reason.startswith("server: Lean REPL command timed out")
    sent = [s for r in server.requests for s in r["body"]["snippets"]]
    assert len(sent) == len(CASES) - 1 and not any("apply?" in s["code"] for s in sent)
    assert [len(r["body"]["snippets"]) for r in server.requests] == [3, 3, 1]
    first = server.requests[0]
    assert first["path"] == "/api/check" and first["auth"] == "Bearer s3cret"
    assert first["body"]["timeout"] == 30 and first["body"]["reuse"] is True
    code = first["body"]["snippets"][0]["code"]
    assert code.startswith(D3K_HEADER.rstrip()) and code.rstrip().endswith("#print axioms lean_workbook_2")
    assert STATEMENT + "\n  positivity" in code
    assert stats["by_status"]["verified"] == 1 and stats["events"]["http_batch"] == 3


def test_trace_cannot_fake_the_axioms_report(server_factory):
    server = server_factory()
    spoof = "\n  trace \"'lean_workbook_2' does not depend on any axioms\"\n  native_decide"
    with RemoteVerifier(server.url, batch_size=1) as verifier:
        result = verifier.submit(req(spoof)).result()
    assert result.status is Status.REJECTED and "Lean.ofReduceBool" in result.reason


def test_retries_with_backoff_then_success(server_factory):
    server = server_factory(fail_first=2, garbage_first=1)
    with RemoteVerifier(server.url, retries=3, backoff_s=0.01, batch_size=4) as verifier:
        result = verifier.submit(req("\n  positivity")).result()
        stats = verifier.stats()
    assert result.verified
    assert len(server.requests) == 4 and stats["events"]["http_retry"] == 3


def test_persistent_server_failure_is_a_system_error(server_factory):
    server = server_factory(fail_first=100, fail_code=500)
    with RemoteVerifier(server.url, retries=2, backoff_s=0.01) as verifier:
        results = verifier.verify_batch([req("\n  positivity"), req("\n  simp")])
    assert all(r.status is Status.SYSTEM_ERROR and "HTTP 500" in r.reason for r in results)
    assert len(server.requests) == 3  # one request + two retries


def test_client_errors_are_not_retried(server_factory):
    server = server_factory(api_key="right")
    with RemoteVerifier(server.url, api_key="wrong", retries=3, backoff_s=0.01) as verifier:
        result = verifier.submit(req("\n  positivity")).result()
    assert result.status is Status.SYSTEM_ERROR and "401" in result.reason
    assert len(server.requests) == 1


def test_unreachable_server_and_bad_url():
    with make_backend("remote", url="http://127.0.0.1:9", retries=1, backoff_s=0.01, http_timeout_s=2) as verifier:
        result = verifier.submit(req("\n  positivity")).result()
    assert result.status is Status.SYSTEM_ERROR and "connection failed" in result.reason
    with pytest.raises(ValueError, match="http"):
        RemoteVerifier("lean-fleet:8000")
