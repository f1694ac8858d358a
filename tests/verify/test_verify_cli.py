"""`sgs-verify`: JSONL in, verdicts out in input order, generic backend options."""

import concurrent.futures
import json

import pytest

from sgs_jax.cli import verify as cli
from sgs_jax.verify.interface import Status, Verifier, VerifyResult, register_backend
from verify_test_support import D3K_HEADER

STATEMENT = "theorem t (x : ℝ) (hx : 0 < x) : 0 < x ^ 3 := by"


def write_input(path, proofs, extra_lines=()):
    lines = [json.dumps({"header": D3K_HEADER, "statement": STATEMENT, "proof": p}) for p in proofs]
    path.write_text("\n".join(list(lines) + list(extra_lines)) + "\n")


def read_output(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_lean_backend_end_to_end(fake_repl, tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    proofs = ["\n  positivity", "\n  sorry", "\n  simp -- fake:sleep=0.2", "\n  exact bogus", "\n  simp -- fake:hang"]
    write_input(inp, proofs, ['{"header": "import Mathlib"}', "not json"])
    with open(inp, "ab") as f:  # a line with a byte that is not UTF-8
        f.write(json.dumps({"header": D3K_HEADER, "statement": STATEMENT, "proof": "simp"}).encode()[:-2] + b'\xff"}\n')
    repl_cmd = " ".join(fake_repl.cmd())
    argv = ["--backend", "lean", "--input", str(inp), "--out", str(out), "--repl-cmd", repl_cmd,
            "--workers", "2", "--timeout", "1", "--memory-limit-gib", "1", "--lean-project-dir", str(tmp_path)]
    assert cli.main(argv) == 0
    rows = read_output(out)
    assert [r["status"] for r in rows] == ["verified", "rejected", "verified", "lean_error", "timeout", "rejected", "rejected", "rejected"]
    assert [r["line"] for r in rows] == list(range(1, 9))
    assert rows[0]["verified"] is True and set(rows[0]) == {"line", "verified", "status", "reason", "messages", "time_s"}
    assert "line 6 lacks statement, proof" in rows[5]["reason"] and "line 7 is not JSON" in rows[6]["reason"]
    assert "line 8 is not valid UTF-8" in rows[7]["reason"]
    err = capsys.readouterr().err
    assert "8/8 checked, 2 verified" in err and "throughput" in err and "timeout" in err
    assert _summary(err)["invalid input lines"] == "3"


def _summary(err):
    """The summary table sgs-verify prints last on stderr, as {row: value}."""
    rows = {}
    for line in err.strip().splitlines():
        key, _, value = line.rpartition("  ")
        rows[key.strip()] = value.strip()
    return rows


# Blank, whitespace-only, malformed and non-UTF-8 lines each get their own record, in place.
ACCOUNTING_LINES = [
    ("proof", "\n  exact h"),
    ("raw", b""),
    ("raw", b"   \t"),
    ("proof", "\n  sorry"),
    ("raw", b"[1, 2]"),
    ("raw", b'{"header": "", "statement": 3, "proof": "x"}'),
    ("raw", b'{"header": "", "statement": "theorem p (a : Prop) (h : a) : a := by", "proof": "\\n  exact \xe9"}'),
    ("proof", "\n  exact h"),
]


def _accounting_input(path, statement):
    with open(path, "wb") as f:
        for kind, value in ACCOUNTING_LINES:
            line = json.dumps({"header": "", "statement": statement, "proof": value}).encode() if kind == "proof" else value
            f.write(line + b"\n")
        f.write(b"{unterminated")  # a last line without a newline


def test_one_record_per_input_line_in_order(tmp_path, capsys):
    pytest.importorskip("sgs_jax.testbed.backend")
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _accounting_input(inp, "theorem p (a : Prop) (h : a) : a := by")
    assert cli.main(["--backend", "prop", "--input", str(inp), "--out", str(out), "--no-progress"]) == 0
    rows = read_output(out)
    assert [r["line"] for r in rows] == list(range(1, 10))
    assert [r["status"] for r in rows] == ["verified", "rejected", "rejected", "lean_error", "rejected", "rejected", "rejected", "verified", "rejected"]
    reasons = [r["reason"] for r in rows]
    assert "line 2 is blank" in reasons[1] and "line 3 is blank" in reasons[2]
    assert "line 5 is not a JSON object" in reasons[4] and "must be strings" in reasons[5]
    assert "line 7 is not valid UTF-8 (byte 0xe9" in reasons[6] and "line 9 is not JSON" in reasons[8]
    summary = _summary(capsys.readouterr().err)
    assert summary["items"] == "9" and summary["verified"].startswith("2 ") and summary["invalid input lines"] == "6"
    assert float(summary["throughput"].split()[0]) > 0  # the tool's own wall clock (prop keeps none)


def test_summary_counts_and_times_for_every_backend(fake_repl, tmp_path, capsys):
    """Same input through lean (with a cache, second run all hits), remote and prop: the
    summary counts every output line; times are those of the items really checked."""
    from fake_kimina import FakeKimina

    proofs = tmp_path / "proofs.jsonl"
    write_input(proofs, ["\n  positivity", "\n  sorry", "\n  apply?"], ["", "nope"])
    repl = ["--repl-cmd", " ".join(fake_repl.cmd()), "--workers", "1"]
    server = FakeKimina()
    try:
        runs = {
            "lean": ["--backend", "lean", *repl],
            "lean-cached": ["--backend", "lean", *repl, "--cache", str(tmp_path / "cache.jsonl")],
            "lean-cache-hits": ["--backend", "lean", *repl, "--cache", str(tmp_path / "cache.jsonl")],
            "remote": ["--backend", "remote", "--url", server.url],
        }
        summaries = {}
        for name, argv in runs.items():
            argv += ["--input", str(proofs), "--out", str(tmp_path / f"{name}.out.jsonl"), "--no-progress"]
            assert cli.main(argv) == 0, name
            summaries[name] = _summary(capsys.readouterr().err)
    finally:
        server.stop()
    for name, summary in summaries.items():
        assert summary["items"] == "5", name
        assert summary["verified"].startswith("1 ") and summary["rejected"].startswith("4 "), name
        assert summary["invalid input lines"] == "2", name
        assert float(summary["throughput"].split()[0]) > 0, name
    for name in ("lean", "remote"):  # 2 items reached the checker (positivity, sorry)
        assert float(summaries[name]["mean time"].split()[0]) > 0, name
    assert summaries["lean-cache-hits"]["mean time"] == "0 ms"  # nothing was checked again
    assert summaries["lean-cache-hits"]["cache hits"] == "3 of 3"  # every well-formed line


def test_refused_api_key_stops_sgs_verify_with_the_servers_message(tmp_path, capsys, monkeypatch):
    from fake_kimina import FakeKimina

    monkeypatch.setenv("LEAN_SERVER_API_KEY", "wrong")
    inp = tmp_path / "in.jsonl"
    write_input(inp, ["\n  positivity"] * 3)
    server = FakeKimina(api_key="right")
    try:
        assert cli.main(["--backend", "remote", "--url", server.url, "--input", str(inp), "--out", str(tmp_path / "o.jsonl")]) == 2
    finally:
        server.stop()
    assert "HTTP 401 Invalid API key" in capsys.readouterr().err
    assert 1 <= len(server.requests) <= 3  # nothing retried


def test_unwritable_out_fails_before_any_work(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    write_input(inp, ["rfl"])
    assert cli.main(["--backend", "nope", "--input", str(inp), "--out", str(tmp_path / "missing-dir" / "o.jsonl")]) == 2
    assert "cannot write --out" in capsys.readouterr().err
    before = inp.read_bytes()
    assert cli.main(["--backend", "prop", "--input", str(inp), "--out", str(inp)]) == 2
    assert "is the input file" in capsys.readouterr().err and inp.read_bytes() == before


def test_cache_flag_reuses_results_across_runs(fake_repl, tmp_path):
    inp, cache = tmp_path / "in.jsonl", tmp_path / "cache.jsonl"
    write_input(inp, ["\n  positivity", "\n  nlinarith [hx]"])
    argv = ["--input", str(inp), "--repl-cmd", " ".join(fake_repl.cmd()), "--workers", "1", "--cache", str(cache), "--no-progress"]
    assert cli.main(argv + ["--out", str(tmp_path / "a.jsonl")]) == 0
    assert cli.main(argv + ["--out", str(tmp_path / "b.jsonl")]) == 0
    assert len(fake_repl.events("proof")) == 2  # second run: all cache hits
    second = read_output(tmp_path / "b.jsonl")
    assert [r["status"] for r in second] == ["verified", "verified"] and all(r["time_s"] == 0 for r in second)


class _RecordingBackend(Verifier):
    """Stand-in backend that records the options it was built with."""

    name = "cli-test-recording"
    built_with: dict = {}

    def __init__(self, **options):
        type(self).built_with = options

    def submit(self, request):
        future = concurrent.futures.Future()
        future.set_result(VerifyResult(True, Status.VERIFIED) if "rfl" in request.proof else VerifyResult.failure(Status.LEAN_ERROR, "no"))
        return future


def test_generic_backend_options(tmp_path):
    register_backend(_RecordingBackend.name, _RecordingBackend)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_input(inp, ["rfl", "simp"])
    argv = ["--backend", _RecordingBackend.name, "--input", str(inp), "--out", str(out), "--timeout", "5",
            "--option", "depth=3", "--option", "mode=fast", "--option", "flags=[1, 2]", "--no-progress"]
    assert cli.main(argv) == 0
    assert _RecordingBackend.built_with == {"timeout_s": 5.0, "depth": 3, "mode": "fast", "flags": [1, 2]}
    assert [(r["line"], r["status"]) for r in read_output(out)] == [(1, "verified"), (2, "lean_error")]


def test_prop_backend_when_present(tmp_path):
    pytest.importorskip("sgs_jax.testbed.backend")
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"header": "", "statement": "theorem p (a : Prop) (h : a) : a := by", "proof": proof} for proof in ("\n  exact h", "\n  sorry")]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["--backend", "prop", "--input", str(inp), "--out", str(out), "--workers", "1", "--timeout", "5", "--no-progress"]
    assert cli.main(argv) == 0
    results = read_output(out)
    assert len(results) == 2 and results[1]["verified"] is False
    assert {r["status"] for r in results} <= {s.value for s in Status}


def test_bad_backend_or_option_is_a_clear_error(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    write_input(inp, ["rfl"])
    assert cli.main(["--backend", "nope", "--input", str(inp), "--out", str(tmp_path / "o")]) == 2
    assert "unknown verification backend" in capsys.readouterr().err
    assert cli.main(["--backend", "remote", "--input", str(inp), "--out", str(tmp_path / "o"), "--workers", "3", "--url", "http://x"]) == 2
    assert "workers" in capsys.readouterr().err
    assert cli.main(["--backend", "lean", "--input", str(inp), "--out", str(tmp_path / "o"), "--option", "novalue"]) == 2
