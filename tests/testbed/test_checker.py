import pytest

from sgs_jax.testbed.checker import check_proof

S = "theorem t (p q r : Prop) (hp : p) (hq : q) (hpq : p → q) (hor : p ∨ q) (hand : p ∧ q) (hiff : p ↔ q) (hn : ¬r) : "


def ok(concl, proof):
    return check_proof(S + concl + " := by", proof)


ACCEPT = [
    ("p → p", "  intro h\n  exact h"),
    ("p → q → p", "  intro a b\n  exact a"),
    ("p → q → p", "  intros\n  assumption"),
    ("¬¬p", "  intro h\n  exact h hp"),                       # intro unfolds ¬
    ("q", "  apply hpq\n  exact hp"),
    ("q", "  exact hpq hp"),
    ("p ∧ q", "  constructor\n  · exact hp\n  · exact hq"),
    ("p ∧ q", "  exact ⟨hp, hq⟩"),
    ("p ∧ q", "  exact And.intro hp hq"),
    ("p ∧ q ∧ p", "  exact ⟨hp, hq, hp⟩"),                   # anonymous constructor flattening
    ("p ↔ p", "  constructor\n  · intro h; exact h\n  · intro h; exact h"),
    ("p ↔ p", "  exact Iff.intro (fun h => h) (fun h => h)"),
    ("p ∨ r", "  left\n  exact hp"),
    ("r ∨ q", "  right\n  exact hq"),
    ("q ∨ p", "  exact Or.inr hp"),
    ("q ∨ p", "  cases hor with\n  | inl a => exact Or.inr a\n  | inr b => exact Or.inl b"),
    ("q ∨ p", "  rcases hor with a | b\n  · right; exact a\n  · left; exact b"),
    ("q ∨ p", "  exact hor.elim (fun a => Or.inr a) (fun b => Or.inl b)"),
    ("q ∨ p", "  exact Or.elim hor Or.inr Or.inl"),
    ("q", "  obtain ⟨a, b⟩ := hand\n  exact b"),
    ("q", "  exact hand.2"),
    ("p", "  exact hand.left"),
    ("q", "  exact hiff.mp hp"),
    ("p", "  exact hiff.2 hq"),
    ("q", "  exact hiff.1 hp"),
    ("r → False", "  intro h\n  exact hn h"),
    ("r → p ∧ q ∧ r", "  intro h\n  exfalso\n  exact hn h"),
    ("r → q ∨ p", "  intro h\n  contradiction"),
    ("r → q", "  intro h\n  exact absurd h hn"),
    ("r → q", "  intro h\n  exact False.elim (hn h)"),
    ("r → q", "  intro h\n  exact (hn h).elim"),
    ("True", "  trivial"),
    ("p ∧ True", "  trivial"),
    ("q", "  have h : q := hpq hp\n  exact h"),
    ("q", "  have : q := by\n    apply hpq\n    exact hp\n  exact this"),
    ("q", "  have h := hpq hp\n  exact h"),
    ("¬r", "  show r → False\n  exact hn"),
    ("p", "  exact id hp"),
    ("p", "  exact (hp : p)"),
    ("q", "  exact show q from hpq hp"),
    ("p → q", "  exact fun (h : p) => hpq h"),
    ("p → q", "  intro h; exact hpq h  -- a comment"),
    ("p ∧ q", "  /- block\n  comment -/\n  constructor\n  . exact hp\n  . exact hq"),
    ("True", "  exact True.intro"),
    ("q", "  rcases hand with ⟨_, b⟩\n  exact b"),
    ("p", "  cases hand\n  assumption"),                    # inaccessible names still usable
]


@pytest.mark.parametrize("concl, proof", ACCEPT)
def test_accepts(concl, proof):
    result = ok(concl, proof)
    assert result.ok, result.reason


REJECT = [
    ("q", "  exact hp", "type mismatch"),
    ("r", "  assumption", "no hypothesis"),
    ("p ∧ q", "  constructor\n  · exact hp", "unsolved goals"),
    ("p ∧ q", "  constructor\n  · exact hp\n    exact hq", "no goals"),
    ("p ∧ q", "  /- c -/ constructor\n  · exact hp\n  · exact hq", "unexpected"),  # block column is 9
    ("p ∨ q", "  constructor", "not ∧"),
    ("p ∨ q", "  sorry", "not in the supported subset"),
    ("p", "  exact?", "not in the supported subset"),
    ("p", "  simp", "not in the supported subset"),
    ("p", "  decide", "not in the supported subset"),
    ("p", "  exact h", "unknown identifier"),
    ("p → q", "  intro h\n  exact h", "type mismatch"),
    ("r", "  contradiction", "no contradiction"),
    ("p", "  intro h", "no implication"),
    ("p ∧ q", "  exact ⟨hp⟩", "anonymous constructor"),
    ("q", "  cases hor with\n  | inl a => exact hpq a", "do not match"),
    ("q", "  cases hn", "cannot do cases"),
    ("q", "  have h := Or.inl hp\n  exact hq", "implicit argument"),
    ("p", "  exact hand.3", "invalid field"),
    ("p", "  show q\n  exact hq", "is not the goal"),
    ("p → p", "  intro p\n  exact p", "shadow"),
    ("p", "exact hp", "indented"),
    ("p", "  exact hp\n   hq", "too many arguments"),
    ("p", "  intro h\n    exact h", "unexpected 'exact'"),
    ("p", "  \texact hp", "tabs"),
    ("p", "  exact hp <;> rfl", "unexpected"),
    ("p", "  admit", "not in the supported subset"),
    ("p", "  exact (hp", "expected ')'"),
]


@pytest.mark.parametrize("concl, proof, fragment", REJECT)
def test_rejects_with_reason(concl, proof, fragment):
    result = ok(concl, proof)
    assert not result.ok
    assert fragment in result.reason, result.reason


def test_intros_does_not_unfold_not():
    # `intros` introduces syntactic arrows only; the goal ¬r remains.
    assert ok("p → ¬r", "  intros\n  exact hn").ok
    assert ok("p → ¬r", "  intros\n  intro h\n  exact hn h").ok


def test_apply_arity_follows_lean():
    # apply h : p → ¬q on goal ¬q uses one argument (Lean tries n - target arity first).
    s = "theorem t (p q : Prop) (hp : p) (h : p → ¬q) : ¬q := by"
    assert check_proof(s, "  apply h\n  exact hp").ok


def test_bad_statement_is_reported_not_raised():
    result = check_proof("theorem t (p : Prop) : p ∧ := by", "  exact hp")
    assert not result.ok and result.stage == "statement"
