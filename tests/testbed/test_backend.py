from sgs_jax.verify.interface import Status, VerifyRequest, make_backend

ST = "theorem t (p q : Prop) (h : p ∧ q) : q ∧ p := by"


def test_prop_backend_verdicts():
    with make_backend("prop") as backend:
        good, wrong, banned, header, bad_statement = backend.verify_batch([
            VerifyRequest("", ST, "  exact ⟨h.2, h.1⟩"),
            VerifyRequest("", ST, "  exact h"),
            VerifyRequest("", ST, "  sorry"),
            VerifyRequest("import Mathlib\n", ST, "  exact ⟨h.2, h.1⟩"),
            VerifyRequest("", "theorem t (p : Prop) : := by", "  trivial"),
        ])
        assert good.verified and good.status is Status.VERIFIED
        assert wrong.status is Status.LEAN_ERROR and "type mismatch" in wrong.reason
        assert banned.status is Status.LEAN_ERROR and "sorry" in banned.reason
        assert header.status is Status.REJECTED and "header" in header.reason
        assert bad_statement.status is Status.REJECTED
        stats = backend.stats()
        assert stats["total"] == 5 and stats["by_status"]["verified"] == 1


def test_proof_text_as_extracted_from_model_output():
    # The extracted proof may start on the `:= by` line (" exact ...") or after newlines.
    with make_backend("prop") as backend:
        r1, r2 = backend.verify_batch([
            VerifyRequest("", ST, "\n  exact ⟨h.2, h.1⟩\n"),
            VerifyRequest("", ST, " exact ⟨h.2, h.1⟩"),
        ])
        assert r1.verified and r2.verified
