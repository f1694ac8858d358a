"""A local stand-in for Kimina Lean Server (project-numina/kimina-lean-server) for tests.

It speaks the server's protocol as its code does (server/routers/check.py, auth.py,
split.py): `POST /api/check` with {"snippets": [{"id", "code"}], "timeout", ...};
`Authorization: Bearer KEY` checked when a key is set (401 {"detail": "Missing API key"}
or {"detail": "Invalid API key"}); each snippet split into its leading `import`/blank
lines (the header, run first) and the body (run in the header's environment), judged
by the fake Lean of `fake_lean_repl`; per-item {"id", "time", "response"} or {"id",
"time", "error": "Lean REPL command timed out in N seconds"}. Whole-request failures are
HTTP errors with {"detail"}: a REPL crash while running any snippet of the request fails
the request with 500 and the crash message (as the server's gather does).

Scripted faults: `request_faults` [(code, detail), ...] answer the first requests;
`item_faults` {marker: [error, ...]} answer the first attempts of a snippet containing
the marker with a per-item `error` (e.g. the header timeout of a REPL being prepared).
"""

from __future__ import annotations

import http.server
import json
import threading
import time

from fake_lean_repl import FakeControl, FakeLean


def split_snippet(code: str) -> tuple[str, str]:
    """The server's split: leading lines that are blank or start with `import ` form the header."""
    lines = code.splitlines()
    i = 0
    while i < len(lines) and (lines[i].strip() == "" or lines[i].strip().startswith("import ")):
        i += 1
    return "\n".join(x.strip() for x in lines[:i]), "\n".join(lines[i:])


class ServerFault(Exception):
    def __init__(self, code: int, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail


class FakeKimina(http.server.ThreadingHTTPServer):
    def __init__(self, api_key=None, request_faults=(), item_faults=None, seconds_per_snippet=0.0, garbage_first=0):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api_key = api_key
        self.request_faults = list(request_faults)
        self.item_faults = {k: list(v) for k, v in (item_faults or {}).items()}
        self.seconds_per_snippet = seconds_per_snippet
        self.garbage_first = garbage_first
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

    def snippets_sent(self) -> list[dict]:
        return [s for r in self.requests for s in r["body"].get("snippets", [])]

    def check(self, snippet: dict, timeout) -> dict:
        """One snippet: header first, then the body in the header's environment."""
        with self.lock:
            for marker, errors in self.item_faults.items():
                if marker in snippet["code"] and errors:
                    return {"id": snippet["id"], "time": 0.0, "error": errors.pop(0)}
        if self.seconds_per_snippet:
            time.sleep(self.seconds_per_snippet)
        header, body = split_snippet(snippet["code"])
        lean = FakeLean()
        try:
            lean.run({"cmd": header})
            reply = lean.run({"cmd": body, "env": 0})
        except FakeControl as control:
            if control.kind == "hang":
                return {"id": snippet["id"], "time": float(timeout), "error": f"Lean REPL command timed out in {timeout} seconds"}
            raise ServerFault(500, f"Lean process encountered an error: {control.kind}") from None
        return {"id": snippet["id"], "time": 0.01, "response": reply}


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        server: FakeKimina = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        auth = self.headers.get("Authorization")
        with server.lock:
            server.requests.append({"path": self.path, "body": body, "auth": auth})
            fault = server.request_faults.pop(0) if server.request_faults else None
            garbage = len(server.requests) <= server.garbage_first
        if self.path not in ("/api/check", "/api/check/"):
            return self._send(404, {"detail": "Not Found"})
        if server.api_key is not None:
            if not auth:
                return self._send(401, {"detail": "Missing API key"})
            if auth.removeprefix("Bearer ").strip() != server.api_key:
                return self._send(401, {"detail": "Invalid API key"})
        if fault is not None:
            return self._send(fault[0], {"detail": fault[1]})
        if garbage:
            return self._send_raw(200, b"<html>proxy error</html>")
        try:
            results = [server.check(s, body["timeout"]) for s in body["snippets"]]
        except ServerFault as fault:
            return self._send(fault.code, {"detail": fault.detail})
        self._send(200, {"results": results})

    def _send(self, code, payload):
        self._send_raw(code, json.dumps(payload).encode())

    def _send_raw(self, code, data):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
