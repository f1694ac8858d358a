"""Small immutable types that cross module borders in the SGS loop.

Targets and conjectures become `Problem`s for the Solver; each row of the sampler's
columnar `Completions` becomes a `Rollout` (read-only NumPy views of that row, no
per-token Python objects); extraction and verification turn them into `Attempt`s; rewards
turn attempts into `TrainingSample`s for the training step. Types holding token arrays
compare by identity.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import NamedTuple, Sequence

import numpy as np

TARGET = "target"
CONJECTURE = "conjecture"


@dataclasses.dataclass(frozen=True)
class Target:
    """One fixed formal problem of the target set (a D3k entry).

    id: the dataset's id. header: trusted Lean preamble (imports, options, opens).
    statement: the theorem statement, ending in `:= by`.
    """

    id: str
    header: str
    statement: str


@dataclasses.dataclass(frozen=True)
class Conjecture:
    """A synthetic problem the Conjecturer wrote for a target.

    statement: the extracted statement, ending in `:= by` (no header, no proof).
    target_id: the target it was conditioned on (its header is reused to check it).
    """

    id: str
    target_id: str
    statement: str

    @classmethod
    def create(cls, target_id: str, statement: str) -> "Conjecture":
        """A conjecture whose id is derived from its text, so equal texts get equal ids."""
        digest = hashlib.sha1(statement.encode("utf-8")).hexdigest()[:12]
        return cls(id=f"{target_id}:conj:{digest}", target_id=target_id, statement=statement)


@dataclasses.dataclass(frozen=True)
class Problem:
    """Anything the Solver is asked to prove: a target or a conjecture.

    origin: TARGET or CONJECTURE. target_id: the target itself, or the conjecture's seed.
    """

    id: str
    header: str
    statement: str
    origin: str
    target_id: str

    def __post_init__(self):
        if self.origin not in (TARGET, CONJECTURE):
            raise ValueError(f"origin must be {TARGET!r} or {CONJECTURE!r}, got {self.origin!r}")

    @classmethod
    def from_target(cls, target: Target) -> "Problem":
        return cls(target.id, target.header, target.statement, TARGET, target.id)

    @classmethod
    def from_conjecture(cls, conjecture: Conjecture, header: str) -> "Problem":
        """`header` is the trusted header of the conjecture's seed target."""
        return cls(conjecture.id, header, conjecture.statement, CONJECTURE, conjecture.target_id)


@dataclasses.dataclass(frozen=True)
class ChatMessage:
    """One chat turn, as fed to a tokenizer's chat template."""

    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        """The Hugging Face `apply_chat_template` form."""
        return {"role": self.role, "content": self.content}


def token_array(values, dtype=np.int32) -> np.ndarray:
    """`values` as a read-only 1-D NumPy array of `dtype` (no copy when it already is one)."""
    array = np.asarray(values, dtype)
    if array.ndim != 1:
        raise ValueError(f"expected a 1-D sequence, got shape {array.shape}")
    if array.flags.writeable:
        array = array.copy() if array is values else array  # never freeze the caller's own array
        array.flags.writeable = False
    return array


@dataclasses.dataclass(frozen=True, eq=False)
class Rollout:
    """One sampled completion (usually a view of one row of the sampler's `Completions`).

    token_ids [L] int32: the generated tokens only (prompt excluded).
    logprobs [L] float32: the sampler's log-probability (nats) of each generated token.
    finish_reason: "stop" (EOS) or "length" (hit the token limit).
    Sequences given as lists or tuples are turned into read-only arrays.
    """

    problem_id: str
    token_ids: np.ndarray
    text: str
    logprobs: np.ndarray
    finish_reason: str

    def __post_init__(self):
        object.__setattr__(self, "token_ids", token_array(self.token_ids))
        object.__setattr__(self, "logprobs", token_array(self.logprobs, np.float32))
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"rollout for {self.problem_id!r}: token_ids ({len(self.token_ids)}) and logprobs ({len(self.logprobs)}) disagree"
            )

    @property
    def num_generated_tokens(self) -> int:
        """L, the length the length penalty is applied to."""
        return len(self.token_ids)

    @classmethod
    def from_row(cls, problem_id: str, completions, row: int) -> "Rollout":
        """Row `row` of a `sampling.Completions` (views, no copy)."""
        return cls(problem_id, completions.tokens(row), completions.text(row) or "", completions.row_logprobs(row),
                   completions.finish_reasons[row])


@dataclasses.dataclass(frozen=True)
class Attempt:
    """A Solver rollout after extraction and verification.

    proof: the extracted proof body (text after `:= by`), or None when extraction failed.
    verified: the verdict v(y); False whenever proof is None.
    """

    rollout: Rollout
    proof: str | None
    verified: bool

    def __post_init__(self):
        if self.verified and self.proof is None:
            raise ValueError("an attempt without an extracted proof cannot be verified")


@dataclasses.dataclass(frozen=True)
class TrainingSample:
    """One sequence for a training step.

    weight: the per-sequence weight (REINFORCE½, Expert Iteration, Conjecturer) or the
    advantage (CISPO). group: index of the problem the sample came from (CISPO groups).
    """

    rollout: Rollout
    weight: float
    group: int


@dataclasses.dataclass(frozen=True, eq=False)
class StoredProofSample(TrainingSample):
    """An Expert Iteration sample: one stored, verified proof, kept for several iterations.

    proof: the extracted proof text (the de-duplication key: one sample per distinct proof
    of a problem). prompt_ids: the Solver prompt's token ids, kept with the rollout because
    the problem may not be sampled again (a target with a full proof store, an old
    conjecture), so the training sequence is prompt_ids + rollout.token_ids. weight is 1.
    """

    proof: str = ""
    prompt_ids: np.ndarray | Sequence[int] = ()

    def __post_init__(self):
        object.__setattr__(self, "prompt_ids", token_array(self.prompt_ids))
        if not len(self.prompt_ids):
            raise ValueError(f"stored proof of {self.rollout.problem_id!r} needs its prompt token ids")

    def to_json(self) -> dict:
        """A JSON-able dict (checkpoint metadata); `from_json` inverts it exactly."""
        r = self.rollout
        return {
            "problem_id": r.problem_id, "token_ids": r.token_ids.tolist(), "text": r.text, "logprobs": r.logprobs.tolist(),
            "finish_reason": r.finish_reason, "weight": self.weight, "group": self.group, "proof": self.proof,
            "prompt_ids": self.prompt_ids.tolist(),
        }

    @classmethod
    def from_json(cls, data: dict) -> "StoredProofSample":
        rollout = Rollout(str(data["problem_id"]), data["token_ids"], str(data["text"]), data["logprobs"], str(data["finish_reason"]))
        return cls(rollout, float(data["weight"]), int(data["group"]), str(data["proof"]), data["prompt_ids"])


class GuideScores(NamedTuple):
    """The Guide's three rubric scores (method.md §6).

    A NamedTuple (immutable) so that it unpacks and compares like the plain triple
    (relevance, redundancy, complexity).
    """

    relevance: int  # 0..5
    redundancy: int  # 0 or 1
    complexity: int  # 0..4
