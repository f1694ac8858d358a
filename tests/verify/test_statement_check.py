"""`Verifier.check_statement` on every backend: a conjecture elaborated with `sorry`.

Lean pool and remote speak to the fake Lean (real REPL protocol, and the Kimina API);
the prop backend uses the testbed parser. Well-formed statements come back VERIFIED,
ill-formed ones LEAN_ERROR, a hung check TIMEOUT; no `#print axioms` is spent on them.
"""

import pytest

from sgs_jax.testbed.backend import PropVerifier
from sgs_jax.verify.cache import CachingVerifier
from sgs_jax.verify.interface import Status, Verifier, VerifyRequest
from sgs_jax.verify.lean_pool import LeanPool
from sgs_jax.verify.remote import RemoteVerifier
from sgs_jax.verify.rules import judge_statement
from fake_kimina import FakeKimina
from verify_test_support import D3K_HEADER

LEAN_CASES = [
    ("theorem c1 (x y : ℝ) (h₀ : 0 < x ∧ 0 < y) : 0 < x * y := by", Status.VERIFIED),
    ("theorem c2 (x : ℝ) (h₀ : bogus_pred x) : 0 < x := by", Status.LEAN_ERROR),  # unknown identifier
    ("theorem c3 (x : ℝ) (h₀ : 0 < x : 0 < x ^ 2 := by", Status.LEAN_ERROR),  # unbalanced binder
]


def test_lean_pool_statement_check(fake_repl):
    with LeanPool(repl_cmd=fake_repl.cmd(), workers=1, timeout_s=2.0, header_timeout_s=5.0, memory_limit_gib=1.0) as pool:
        results = [pool.check_statement(D3K_HEADER, s).result() for s, _ in LEAN_CASES]
        hung = pool.check_statement(D3K_HEADER, LEAN_CASES[0][0].replace(":= by", ":= by -- fake:hang")).result()
        bad_header = pool.check_statement("import Mathlib\nopen bogus_namespace\n", LEAN_CASES[0][0]).result()
        stats = pool.stats()
    assert [r.status for r in results] == [s for _, s in LEAN_CASES]
    assert "unknown identifier" in results[1].reason
    assert hung.status is Status.TIMEOUT
    assert bad_header.status is Status.LEAN_ERROR and "header" in bad_header.reason
    sent = [e["cmd"] for e in fake_repl.events("proof")]
    assert sent[0] == LEAN_CASES[0][0] + "\n  sorry"  # one command, the statement + sorry
    assert not any("#print axioms" in c for c in sent)
    assert stats["events"]["statement_check"] == len(LEAN_CASES) + 2
    assert stats["total"] == 0  # statement checks are not proof verdicts


def test_remote_statement_check():
    server = FakeKimina()
    try:
        with RemoteVerifier(server.url, timeout_s=30, concurrency=2) as verifier:
            results = [verifier.check_statement(D3K_HEADER, s).result() for s, _ in LEAN_CASES]
            hung = verifier.check_statement(D3K_HEADER, LEAN_CASES[0][0].replace(":= by", ":= by -- fake:hang")).result()
    finally:
        server.stop()
    assert [r.status for r in results] == [s for _, s in LEAN_CASES]
    assert hung.status is Status.TIMEOUT
    codes = [s["code"] for s in server.snippets_sent()]
    assert codes[0] == D3K_HEADER.rstrip("\n") + "\n\n" + LEAN_CASES[0][0] + "\n  sorry\n"
    assert not any("#print axioms" in c for c in codes)


@pytest.mark.parametrize("statement, status", [
    ("theorem c (p q : Prop) (h₀ : p) : p ∨ q := by", Status.VERIFIED),
    ("theorem c (p : Prop) (h₀ : p) : p ∨ q := by", Status.LEAN_ERROR),  # q is not bound
    ("theorem c (p q : Prop) (h₀ : p ∧) : q := by", Status.LEAN_ERROR),  # syntax
    ("lemma c (p : Prop) : p → p := by", Status.LEAN_ERROR),  # core Lean has no `lemma`
])
def test_prop_statement_check(statement, status):
    verifier = CachingVerifier(PropVerifier())  # the run wraps every backend in the cache
    result = verifier.check_statement("", statement).result()
    assert result.status is status
    assert result.verified is (status is Status.VERIFIED)
    if status is Status.LEAN_ERROR:
        assert result.reason.startswith("statement:")
    assert len(verifier.cache) == 0  # not cached: it is not a proof verdict


def test_prop_statement_check_needs_an_empty_header():
    result = PropVerifier().check_statement("import Mathlib\n", "theorem c (p : Prop) : p → p := by").result()
    assert result.status is Status.REJECTED


def test_statement_verdict_rule():
    ok = {"env": 3, "messages": [{"severity": "warning", "pos": {"line": 1, "column": 0}, "data": "declaration uses 'sorry'"}]}
    linted = {"env": 3, "messages": ok["messages"] + [{"severity": "warning", "data": "unused variable `h`"}]}
    assert judge_statement(ok).verified and judge_statement(linted).verified
    assert judge_statement({"env": 3}).status is Status.LEAN_ERROR  # nothing was declared
    assert judge_statement({"message": "unknown environment"}).status is Status.LEAN_ERROR
    error = {"env": 3, "messages": ok["messages"] + [{"severity": "error", "data": "unknown identifier 'x'"}]}
    assert judge_statement(error).status is Status.LEAN_ERROR
    assert judge_statement(["not", "a", "dict"]).status is Status.SYSTEM_ERROR
    assert VerifyRequest.statement_check("", "theorem c : True := by").body() == "theorem c : True := by\n  sorry"


def test_a_backend_without_a_statement_check_says_so():
    class NoCheck(Verifier):
        name = "nocheck"

        def submit(self, request):
            raise AssertionError("unused")

    with pytest.raises(NotImplementedError, match="nocheck"):
        NoCheck().check_statement("", "theorem c : True := by")


def test_remote_statement_check_retries_and_refusal():
    from sgs_jax.verify.interface import VerifierUnavailable

    flaky = FakeKimina(request_faults=[(503, "No available REPLs")])
    refusing = FakeKimina(api_key="right")
    try:
        with RemoteVerifier(flaky.url, timeout_s=30, backoff_s=0.01) as verifier:
            assert verifier.check_statement(D3K_HEADER, LEAN_CASES[0][0]).result().status is Status.VERIFIED
        with RemoteVerifier(refusing.url, api_key="wrong", timeout_s=30) as verifier:
            with pytest.raises(VerifierUnavailable, match="401"):
                verifier.check_statement(D3K_HEADER, LEAN_CASES[0][0]).result()
    finally:
        flaky.stop()
        refusing.stop()
    assert len(flaky.requests) == 2  # a 503, then the answer
