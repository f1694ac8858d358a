"""Verification of proofs: one interface (`interface.py`) and its backends.

Backends (`make_backend(name, **options)`): `lean` (local REPL pool, `lean_pool.py`),
`remote` (Kimina Lean Server, `remote.py`), `prop` (the testbed). Verdict rules and the
Solver reward's `try` detector are pure functions in `rules.py`. See docs/verify.md.
"""

from sgs_jax.verify.cache import CachingVerifier, ResultCache
from sgs_jax.verify.interface import (
    Status,
    Verifier,
    VerifierUnavailable,
    VerifyRequest,
    VerifyResult,
    available_backends,
    make_backend,
    register_backend,
)
from sgs_jax.verify.rules import contains_try

__all__ = [
    "CachingVerifier",
    "ResultCache",
    "Status",
    "Verifier",
    "VerifierUnavailable",
    "VerifyRequest",
    "VerifyResult",
    "available_backends",
    "contains_try",
    "make_backend",
    "register_backend",
]
