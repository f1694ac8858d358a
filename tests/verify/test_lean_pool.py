"""The local Lean backend over the fake REPL: verdicts, header reuse, faults, recycling."""

import collections
import time

import pytest

from sgs_jax.verify import make_backend
from sgs_jax.verify.interface import Status, VerifyRequest
from sgs_jax.verify.lean_pool import LeanPool
from verify_test_support import D3K_HEADER, still_running

STATEMENT = "theorem lean_workbook_1 (x y : ℝ) (h₀ : 0 < x ∧ 0 < y) : 0 < x * y + x ^ 2 := by"
OTHER_HEADER = D3K_HEADER.replace("Rat", "Rat Complex")


def req(proof, header=D3K_HEADER, statement=STATEMENT):
    return VerifyRequest(header, statement, proof)


def pool(fake, *flags, **options):
    options.setdefault("workers", 2)
    options.setdefault("timeout_s", 2.0)
    options.setdefault("header_timeout_s", 5.0)
    options.setdefault("memory_limit_gib", 1.0)
    return LeanPool(repl_cmd=fake.cmd(*flags), **options)


# One realistic case per verdict rule: (proof, status, reason fragment).
CASES = [
    ("\n  nlinarith [mul_pos h₀.1 h₀.2, sq_nonneg x]", Status.VERIFIED, ""),
    ("\n  decide", Status.VERIFIED, ""),  # no axioms at all
    ("\n  exact bogus_lemma x y", Status.LEAN_ERROR, "unknown identifier"),
    ("\n  skip", Status.LEAN_ERROR, "unsolved goals"),
    ("\n  sorry", Status.REJECTED, "sorry"),
    ("\n  native_decide", Status.REJECTED, "Lean.ofReduceBool"),
    ("\n  exact?", Status.REJECTED, "banned tactic"),
    ("\n  simp\n#eval IO.println 1", Status.REJECTED, "top-level command"),
    ("\n  simp -- fake:repl_message", Status.LEAN_ERROR, "REPL failure"),
]


def test_every_verdict_in_input_order_with_one_import_per_repl(fake_repl):
    requests = [req(proof) for proof, _, _ in CASES] * 2
    with pool(fake_repl) as verifier:
        results = verifier.verify_batch(requests)
        stats = verifier.stats()
    for result, (proof, status, reason) in zip(results, CASES * 2):
        assert result.status is status, (proof, result)
        assert result.verified is (status is Status.VERIFIED)
        assert reason in result.reason
    assert all(r.time_s >= 0 for r in results)
    verified = results[0]
    assert any("depends on axioms" in m["data"] for m in verified.messages)
    imports = collections.Counter(e["pid"] for e in fake_repl.events("import"))
    assert all(n == 1 for n in imports.values()) and 1 <= len(imports) <= 2
    # Text pre-checks never reach Lean.
    proofs_sent = [e["cmd"] for e in fake_repl.events("proof")]
    assert not any("exact?" in p or "#eval" in p for p in proofs_sent)
    assert stats["by_status"]["verified"] == 4 and stats["total"] == len(requests)


def test_sorry_warning_backtick_spelling(fake_repl):
    with pool(fake_repl, "--sorry-backtick", workers=1) as verifier:
        result = verifier.submit(req("\n  sorry")).result()
    assert result.status is Status.REJECTED
    assert any("`sorry`" in m["data"] for m in result.messages)


def test_lru_eviction_across_headers(fake_repl):
    with pool(fake_repl, workers=1) as verifier:
        headers = [D3K_HEADER, D3K_HEADER, OTHER_HEADER, D3K_HEADER]
        for header in headers:  # one at a time, so the order of use is fixed
            assert verifier.submit(req("\n  simp", header)).result().verified
        stats = verifier.stats()
    imports = [e["header"] for e in fake_repl.events("import")]
    assert imports == [D3K_HEADER, OTHER_HEADER, D3K_HEADER]
    assert stats["events"]["repl_evict"] == 2 and stats["events"]["repl_spawn"] == 3


def test_two_headers_two_workers_no_eviction(fake_repl):
    with pool(fake_repl, workers=2) as verifier:
        for header in [D3K_HEADER, OTHER_HEADER] * 3:
            assert verifier.submit(req("\n  simp", header)).result().verified
        assert "repl_evict" not in verifier.stats()["events"]
    assert len(fake_repl.events("import")) == 2


def test_timeout_kills_group_and_next_proof_succeeds(fake_repl):
    with pool(fake_repl, workers=1, timeout_s=0.8) as verifier:
        start = time.monotonic()
        hung = verifier.submit(req("\n  simp -- fake:hang")).result()
        assert time.monotonic() - start < 5
        after = verifier.submit(req("\n  simp")).result()
        stats = verifier.stats()
    assert hung.status is Status.TIMEOUT and 0.7 < hung.time_s < 3
    assert after.verified
    child = fake_repl.events("child")[0]["child_pid"]
    assert not still_running([child], grace_s=5)
    assert stats["by_status"]["timeout"] == 1 and stats["timeout_rate"] == pytest.approx(0.5)
    assert stats["repl_restarts"] == 1
    assert len(fake_repl.events("proof")) == 2  # a timeout is not retried


def test_crash_mid_batch_loses_no_item(fake_repl):
    proofs = [CASES[i % 6][0] for i in range(12)]
    # Each fake REPL dies on its 3rd proof; one worker makes the schedule deterministic:
    # REPL 1 checks items 1, 2 and crashes on 3; REPL 2 re-checks 3, checks 4, crashes on 5...
    with pool(fake_repl, "--crash-on-nth", "3", workers=1) as verifier:
        results = verifier.verify_batch([req(p) for p in proofs])
        stats = verifier.stats()
    expected = [CASES[i % 6][1] for i in range(12)]
    assert [r.status for r in results] == expected  # every crashed item was retried
    assert stats["events"]["repl_crash"] == 5 and stats["events"]["repl_spawn"] == 6
    assert stats["by_status"]["system_error"] == 0 and stats["repl_restarts"] == 5


@pytest.mark.parametrize("fault, event", [("crash", "repl_crash"), ("garbage", "repl_bad_reply"), ("leak", "repl_crash")])
def test_persistent_fault_is_retried_once_then_system_error(fake_repl, fault, event):
    with pool(fake_repl, workers=1, memory_limit_gib=0.5, timeout_s=10) as verifier:
        bad = verifier.submit(req(f"\n  simp -- fake:{fault}")).result()
        good = verifier.submit(req("\n  simp")).result()
        stats = verifier.stats()
    assert bad.status is Status.SYSTEM_ERROR and not bad.verified
    assert good.verified
    assert stats["events"][event] == 2  # first try and one retry
    assert stats["system_error_rate"] == pytest.approx(0.5)
    assert sum("fake:" in e["cmd"] for e in fake_repl.events("proof")) == 2


def test_recycling_after_max_uses(fake_repl):
    with pool(fake_repl, workers=1, max_uses=2) as verifier:
        assert all(r.verified for r in verifier.verify_batch([req("\n  simp")] * 5))
        stats = verifier.stats()
    assert stats["events"]["repl_spawn"] == 3 and stats["events"]["repl_recycle"] == 2
    assert collections.Counter(e["pid"] for e in fake_repl.events("proof")).most_common(1)[0][1] == 2


def test_bad_header_is_a_lean_error_and_imported_once(fake_repl):
    bad_header = "import Mathlib\nopen bogus_namespace\n"
    with pool(fake_repl, workers=1) as verifier:
        results = verifier.verify_batch([req("\n  simp", bad_header)] * 3)
    assert all(r.status is Status.LEAN_ERROR and "header" in r.reason for r in results)
    assert len(fake_repl.events("import")) == 1


def test_empty_header_and_unnamed_statement(fake_repl):
    with pool(fake_repl, workers=1) as verifier:
        plain = verifier.submit(req("\n  decide", header="")).result()
        unnamed = verifier.submit(req("\n  decide", statement="example : True := by")).result()
    assert plain.verified and not fake_repl.events("import")
    assert unnamed.status is Status.REJECTED and "no named theorem" in unnamed.reason


def test_async_submission_and_make_backend(fake_repl):
    verifier = make_backend("lean", repl_cmd=fake_repl.cmd("--delay", "0.05"), workers=2, timeout_s=2.0, memory_limit_gib=1.0)
    try:
        futures = [verifier.submit(req("\n  simp")) for _ in range(4)]
        assert not all(f.done() for f in futures)  # submit returns at once
        assert all(f.result().verified for f in futures)
    finally:
        verifier.close()
        verifier.close()  # idempotent


def test_missing_repl_executable_gives_system_error(tmp_path):
    with LeanPool(repl_cmd=[str(tmp_path / "nope")], workers=1) as verifier:
        result = verifier.submit(req("\n  simp")).result()
    assert result.status is Status.SYSTEM_ERROR and "cannot start REPL" in result.reason


def test_bad_configuration_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LeanPool(lean_project_dir=str(tmp_path / "missing"))
    with pytest.raises(ValueError):
        LeanPool(workers=0)


def test_close_kills_busy_repls_at_once(fake_repl):
    """A stopping run closes the pool mid-proof: it must not wait out the proof's timeout,
    and every REPL process group (children included) must be gone."""
    verifier = pool(fake_repl, workers=2, timeout_s=60.0)
    running = [verifier.submit(req("\n  simp -- fake:hang")) for _ in range(2)]
    queued = verifier.submit(req("\n  simp"))
    deadline = time.monotonic() + 10
    while len(fake_repl.events("child")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    verifier.close()
    assert time.monotonic() - start < 5
    for future in running:
        assert future.result(timeout=1).status is Status.SYSTEM_ERROR
    assert queued.cancelled() or queued.result(timeout=1).status is Status.SYSTEM_ERROR
    children = [e["child_pid"] for e in fake_repl.events("child")]
    assert not still_running(children, grace_s=5)
