"""The fixed target set D and its state: which targets are solved, and their stored proofs.

Files use the D3k format (docs/method.md, Section 3):
`{"iterations": [...], "target_statements": {ID: {"id", "header", "theorem", "tag",
"source", "proofs": [...]}}}`. A run saves its state in the same format, with every
target's verified proofs filled in, so a state file is also a valid target file. Any other
field of a target entry (the testbed's `difficulty`, `band`, `hard`, ...) is kept in
`TargetSet.records` and written back, so the state file keeps each target's difficulty
and split; `groups` turns the `hard` and `band` fields into named target groups.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

from sgs_jax.sgs.extraction import blank_lean_comments
from sgs_jax.sgs.types import Target

DEFAULT_HUB_ID = "LukeBailey181Pub/D_3k"
DEFAULT_HUB_FILE = "D_3k_prover_dataset.json"
CORE_FIELDS = ("id", "header", "theorem", "proofs")  # the fields `Target` and the proofs hold


class TargetFileError(ValueError):
    """A target file is unreadable or not in the D3k format."""


def repair_statement(statement: str) -> str:
    """Move a `:= by` that a trailing line comment swallowed onto its own line.

    Some D3k statements end like `... = 3  -- median formula := by`: Lean never sees that
    `:= by`, so the target could not be proved as stored. The comment is kept.
    """
    statement = statement.rstrip()
    if blank_lean_comments(statement).rstrip().endswith(":= by"):
        return statement
    return statement[: -len(":= by")].rstrip() + "\n:= by"


def parse_target_file(data: Any, source: str = "<data>") -> tuple[list[Target], dict[str, list[str]]]:
    """Targets (file order) and their stored proofs from a D3k-format dict."""
    if not isinstance(data, dict) or not isinstance(data.get("target_statements"), dict):
        raise TargetFileError(f"{source}: expected a dict with a 'target_statements' mapping (D3k format)")
    targets, proofs = [], {}
    for key, entry in data["target_statements"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("theorem"), str):
            raise TargetFileError(f"{source}: target {key!r} has no 'theorem' string")
        statement = entry["theorem"].rstrip()
        if not statement.endswith(":= by"):
            raise TargetFileError(f"{source}: target {key!r} statement does not end in ':= by'")
        statement = repair_statement(statement)
        target_id = str(entry.get("id", key))
        targets.append(Target(id=target_id, header=str(entry.get("header", "")), statement=statement))
        proofs[target_id] = [str(p) for p in entry.get("proofs", []) or []]
    if not targets:
        raise TargetFileError(f"{source}: no targets")
    ids = [t.id for t in targets]
    if len(set(ids)) != len(ids):
        raise TargetFileError(f"{source}: duplicate target ids")
    return targets, proofs


def read_target_json(path: str | os.PathLike) -> dict[str, Any]:
    """The raw dict of a D3k-format JSON file, with a clear error when unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TargetFileError(f"cannot read target file {os.fspath(path)!r}: {err}") from err


def download_from_hub(hub_id: str = DEFAULT_HUB_ID, filename: str = DEFAULT_HUB_FILE) -> str:
    """Local path of the target file of a Hugging Face dataset: from the local hub cache
    when it holds the file, else downloaded (needs the hub reachable). When neither works
    (offline, no network, unknown dataset) a TargetFileError says how to use a local file."""
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo_id=hub_id, filename=filename, repo_type="dataset")
    except Exception as err:  # offline mode, connection errors, missing repo or file: many types
        raise TargetFileError(
            f"cannot get {filename} of the dataset {hub_id!r} from the Hugging Face hub "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no detail'}). "
            f"Where the hub is reachable: `hf download --repo-type dataset {hub_id} {filename} --local-dir DIR`, "
            f"then run with --config.targets.source=file --config.targets.path=DIR/{filename}"
        ) from err


def target_records(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Target id -> the entry's fields beyond CORE_FIELDS (tag, source, difficulty, ...),
    from an already validated D3k-format dict."""
    return {str(entry.get("id", key)): {f: v for f, v in entry.items() if f not in CORE_FIELDS}
            for key, entry in data["target_statements"].items()}


class TargetSet:
    """Targets plus their verified proofs (at most `max_proofs` kept per target).

    records: target id -> the other fields of its entry, kept verbatim (may be empty)."""

    def __init__(self, targets: Iterable[Target], proofs: dict[str, list[str]] | None = None, max_proofs: int = 16,
                 records: dict[str, dict[str, Any]] | None = None):
        self.targets = tuple(targets)
        self.by_id = {t.id: t for t in self.targets}
        self.max_proofs = max_proofs
        self.proofs: dict[str, list[str]] = {t.id: list((proofs or {}).get(t.id, []))[:max_proofs] for t in self.targets}
        self.records: dict[str, dict[str, Any]] = {t.id: dict((records or {}).get(t.id, {})) for t in self.targets}
        self.iterations: list[dict[str, Any]] = []

    def first(self, count: int) -> "TargetSet":
        """The first `count` targets, with their proofs and records."""
        return TargetSet(self.targets[:count], self.proofs, self.max_proofs, self.records)

    def __len__(self) -> int:
        return len(self.targets)

    def is_solved(self, target_id: str) -> bool:
        return bool(self.proofs[target_id])

    def unsolved(self) -> list[Target]:
        """Targets with no verified proof yet, in file order."""
        return [t for t in self.targets if not self.proofs[t.id]]

    def num_solved(self) -> int:
        return sum(1 for t in self.targets if self.proofs[t.id])

    def solved_fraction(self, ids: Iterable[str] | None = None) -> float:
        """Cumulative solve rate: solved targets / |D| (or over the targets `ids`; 0 for none)."""
        if ids is None:
            return self.num_solved() / len(self.targets)
        ids = list(ids)
        return sum(1 for i in ids if self.proofs[i]) / len(ids) if ids else 0.0

    def groups(self) -> dict[str, tuple[str, ...]]:
        """Named groups of target ids from the records: "hard" (records with `hard` true,
        when any record has the field) and "band/<name>" per `band` value, in file order."""
        out: dict[str, list[str]] = {}
        if any("hard" in r for r in self.records.values()):
            out["hard"] = [t.id for t in self.targets if self.records[t.id].get("hard")]
        for t in self.targets:
            band = self.records[t.id].get("band")
            if band is not None:
                out.setdefault(f"band/{band}", []).append(t.id)
        return {name: tuple(ids) for name, ids in out.items()}

    def record_proof(self, target_id: str, proof: str) -> bool:
        """Store a verified proof (dedup, capped); returns True if the target was unsolved."""
        stored = self.proofs[target_id]
        newly_solved = not stored
        if proof not in stored and len(stored) < self.max_proofs:
            stored.append(proof)
        return newly_solved

    # ---- persistence (D3k format) -------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "iterations": self.iterations,
            "target_statements": {
                t.id: {"id": t.id, "header": t.header, "theorem": t.statement, **self.records[t.id],
                       "proofs": list(self.proofs[t.id])}
                for t in self.targets
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], max_proofs: int = 16, source: str = "<data>") -> "TargetSet":
        targets, proofs = parse_target_file(data, source)
        target_set = cls(targets, proofs, max_proofs, target_records(data))
        target_set.iterations = list(data.get("iterations", []))
        return target_set

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (a preempted write never leaves a half file)."""
        tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"  # per process: several may write the same file
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike, max_proofs: int = 16) -> "TargetSet":
        """Read a D3k-format file (a dataset or a saved run state)."""
        return cls.from_json(read_target_json(path), max_proofs, os.fspath(path))
