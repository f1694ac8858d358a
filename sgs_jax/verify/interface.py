"""The one verification interface that every backend implements.

A backend takes (header, statement, proof) items and returns one `VerifyResult` per
item. Submission is asynchronous (`submit` returns a `concurrent.futures.Future`), so the
training loop keeps generating while proofs are checked; `verify_batch` collects results
in input order. Backends register themselves by name with `register_backend`, and the
`sgs-verify` CLI and the training loop build them with `make_backend(name, **options)`.

The checked file is always rebuilt from the *trusted* header and statement plus the
proof body (the text after `:= by`), never from a model's own header or statement.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import enum
import inspect
from typing import Any, Callable, Mapping, Sequence


class VerifierUnavailable(RuntimeError):
    """The backend cannot check anything (e.g. the server refuses the API key).

    Raised by `submit`, and by futures in place of a result, so a run stops with the
    cause instead of recording every proof as a system error."""


class Status(str, enum.Enum):
    """Outcome of one verification. Only VERIFIED counts as success."""

    VERIFIED = "verified"  # passed every rule of method.md §7
    REJECTED = "rejected"  # failed a pre-check or verdict rule (banned text, axioms, sorry, ...)
    LEAN_ERROR = "lean_error"  # the checker reported an error in the proof
    TIMEOUT = "timeout"  # wall-clock limit hit; the worker was killed
    SYSTEM_ERROR = "system_error"  # crash, lost process, unparsable reply: never success


@dataclasses.dataclass(frozen=True)
class VerifyRequest:
    """One proof to check.

    header: trusted Lean preamble (imports, options, opens); may be empty.
    statement: trusted theorem statement, ending in `:= by`.
    proof: the proof body the model wrote (text after `:= by`).
    """

    header: str
    statement: str
    proof: str

    def body(self) -> str:
        """Trusted statement + proof: the command checked in the header's environment."""
        return self.statement.rstrip() + "\n" + self.proof.strip("\n")

    def lean_source(self) -> str:
        """The file text that is checked: trusted header + trusted statement + proof."""
        head = self.header.rstrip("\n")
        return (head + "\n\n" + self.body()) if head else self.body()

    def key(self) -> tuple[str, str, str]:
        """Cache key: the same (header, statement, proof) is never checked twice."""
        return (self.header, self.statement, self.proof)

    @classmethod
    def statement_check(cls, header: str, statement: str) -> "VerifyRequest":
        """The request a statement check elaborates: the statement with `sorry` as its proof."""
        return cls(header, statement, "  sorry")


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    """Verdict for one `VerifyRequest`.

    verified: True iff status is VERIFIED.
    status: see `Status`.
    reason: short human-readable explanation ("" when verified).
    messages: the checker's messages (Lean REPL message dicts: severity, pos, endPos, data).
    time_s: wall-clock seconds spent on this item (0 for cache hits).
    """

    verified: bool
    status: Status
    reason: str = ""
    messages: tuple[dict[str, Any], ...] = ()
    time_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "verified": self.verified,
            "status": self.status.value,
            "reason": self.reason,
            "messages": list(self.messages),
            "time_s": self.time_s,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "VerifyResult":
        return cls(
            verified=bool(data["verified"]),
            status=Status(data["status"]),
            reason=str(data.get("reason", "")),
            messages=tuple(data.get("messages", ())),
            time_s=float(data.get("time_s", 0.0)),
        )

    @classmethod
    def failure(cls, status: Status, reason: str, messages=(), time_s: float = 0.0) -> "VerifyResult":
        assert status is not Status.VERIFIED
        return cls(False, status, reason, tuple(messages), time_s)


class Verifier(abc.ABC):
    """Base class of every verification backend.

    Subclasses implement `submit`; `verify_batch` and the context-manager protocol come
    for free. `close` must release every worker process the backend started.
    """

    name: str = "abstract"

    @abc.abstractmethod
    def submit(self, request: VerifyRequest) -> "concurrent.futures.Future[VerifyResult]":
        """Queue one item; the future resolves to its `VerifyResult`. Neither raises,
        except `VerifierUnavailable` when the backend cannot check anything at all."""

    def check_statement(self, header: str, statement: str) -> "concurrent.futures.Future[VerifyResult]":
        """Elaborate a (model-written) `statement`, ending in `:= by`, under the trusted
        `header` with `sorry` as its proof, before any proof is spent on it. The result
        is VERIFIED when the statement is well-formed, LEAN_ERROR (or REJECTED) when it is
        not, TIMEOUT / SYSTEM_ERROR as for proofs. Every backend implements it; the base
        class only says that a backend does not."""
        raise NotImplementedError(f"the {self.name!r} verifier has no statement check")

    def verify_batch(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        """Check all items; results in input order."""
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def stats(self) -> dict[str, Any]:
        """Counters for metrics (counts by status, times, restarts); backends extend it."""
        return {}

    def close(self) -> None:
        """Release workers. Idempotent."""

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_BACKENDS: dict[str, Callable[..., Verifier]] = {}


def register_backend(name: str, factory: Callable[..., Verifier]) -> None:
    """Make a backend constructible by name (`make_backend(name, **options)`)."""
    _BACKENDS[name] = factory


def make_backend(name: str, **options: Any) -> Verifier:
    """Build the backend registered as `name` with keyword options from config or CLI."""
    _import_builtin_backends()
    if name not in _BACKENDS:
        raise ValueError(f"unknown verification backend {name!r}; known: {sorted(_BACKENDS)}")
    return _BACKENDS[name](**options)


def available_backends() -> list[str]:
    _import_builtin_backends()
    return sorted(_BACKENDS)


def check_backend_options(name: str, options: Mapping[str, Any]) -> None:
    """Raise ValueError naming an unknown backend, an option its constructor does not take
    or a required one that is missing (read from the constructor's signature; a
    constructor that takes **options checks unknown ones itself when built)."""
    _import_builtin_backends()
    if name not in _BACKENDS:
        raise ValueError(f"unknown verification backend {name!r}; known: {sorted(_BACKENDS)}")
    params = inspect.signature(_BACKENDS[name]).parameters.values()
    named = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    missing = [p.name for p in named if p.default is inspect.Parameter.empty and p.name not in options]
    if missing:
        raise ValueError(f"backend {name!r} needs option {', '.join(missing)}")
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = {p.name for p in named}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(f"backend {name!r} takes no option {', '.join(unknown)}; it takes {sorted(accepted)}")


def _import_builtin_backends() -> None:
    """Import the modules that register the built-in backends (lazily: no cycles)."""
    import importlib

    for module in ("sgs_jax.verify.lean_pool", "sgs_jax.verify.remote", "sgs_jax.testbed.backend"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:  # a backend module not written yet
            if err.name != module:
                raise

