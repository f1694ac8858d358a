"""Small immutable types that cross module borders in the SGS loop.

Targets and conjectures become `Problem`s for the Solver; the sampler returns `Rollout`s;
extraction and verification turn them into `Attempt`s; rewards turn attempts into
`TrainingSample`s for the training step. Token sequences are tuples so that every type
stays hashable and comparable.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import NamedTuple

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


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One sampled completion.

    token_ids: the generated tokens only (prompt excluded), length L.
    logprobs: the sampler's log-probability (nats) of each generated token, length L.
    num_generated_tokens: L, the length the length penalty is applied to.
    finish_reason: "stop" (EOS) or "length" (hit the token limit).
    """

    problem_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    num_generated_tokens: int
    finish_reason: str

    def __post_init__(self):
        if not (len(self.token_ids) == len(self.logprobs) == self.num_generated_tokens):
            raise ValueError(
                f"rollout for {self.problem_id!r}: token_ids ({len(self.token_ids)}), logprobs "
                f"({len(self.logprobs)}) and num_generated_tokens ({self.num_generated_tokens}) disagree"
            )


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


@dataclasses.dataclass(frozen=True)
class StoredProofSample(TrainingSample):
    """An Expert Iteration sample: one stored, verified proof, kept for several iterations.

    proof: the extracted proof text (the de-duplication key: one sample per distinct proof
    of a problem). prompt_ids: the Solver prompt's token ids, kept with the rollout because
    the problem may not be sampled again (a target with a full proof store, an old
    conjecture), so the training sequence is prompt_ids + rollout.token_ids. weight is 1.
    """

    proof: str = ""
    prompt_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if not self.prompt_ids:
            raise ValueError(f"stored proof of {self.rollout.problem_id!r} needs its prompt token ids")

    def to_json(self) -> dict:
        """A JSON-able dict (checkpoint metadata); `from_json` inverts it exactly."""
        r = self.rollout
        return {
            "problem_id": r.problem_id, "token_ids": list(r.token_ids), "text": r.text, "logprobs": list(r.logprobs),
            "finish_reason": r.finish_reason, "weight": self.weight, "group": self.group, "proof": self.proof,
            "prompt_ids": list(self.prompt_ids),
        }

    @classmethod
    def from_json(cls, data: dict) -> "StoredProofSample":
        tokens = tuple(int(t) for t in data["token_ids"])
        rollout = Rollout(str(data["problem_id"]), tokens, str(data["text"]), tuple(float(x) for x in data["logprobs"]),
                          len(tokens), str(data["finish_reason"]))
        return cls(rollout, float(data["weight"]), int(data["group"]), str(data["proof"]),
                   tuple(int(t) for t in data["prompt_ids"]))


class GuideScores(NamedTuple):
    """The Guide's three rubric scores (method.md §6).

    A NamedTuple (immutable) so that it unpacks and compares like the plain triple
    (relevance, redundancy, complexity).
    """

    relevance: int  # 0..5
    redundancy: int  # 0 or 1
    complexity: int  # 0..4
