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
    assert rows[0]["verified"] is True and set(rows[0]) == {"verified", "status", "reason", "messages", "time_s"}
    assert "invalid input line 6" in rows[5]["reason"] and "invalid input line 7" in rows[6]["reason"]
    assert "UTF-8" in rows[7]["reason"]
    err = capsys.readouterr().err
    assert "8/8 checked, 2 verified" in err and "throughput" in err and "timeout" in err


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
    assert [r["status"] for r in read_output(out)] == ["verified", "lean_error"]


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
