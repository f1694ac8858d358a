"""Helpers shared by the verification tests: fake-REPL command lines, logs, liveness."""

from __future__ import annotations

import json
import pathlib
import sys

FAKE_REPL = pathlib.Path(__file__).with_name("fake_lean_repl.py")
D3K_HEADER = "import Mathlib\nimport Aesop\nset_option maxHeartbeats 0\nopen BigOperators Real Nat Topology Rat\n\n"


def read_log(path: pathlib.Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pid_alive(pid: int) -> bool:
    """True if `pid` runs (zombies, which an init without reaping may keep, count as dead)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class FakeRepl:
    """Builds fake-REPL command lines that log to one file, and checks for leaks."""

    def __init__(self, tmp_path: pathlib.Path):
        self.log = tmp_path / "fake_repl_log.jsonl"

    def cmd(self, *flags: str) -> list[str]:
        return [sys.executable, str(FAKE_REPL), "--log", str(self.log), *flags]

    def events(self, kind: str | None = None) -> list[dict]:
        return [e for e in read_log(self.log) if kind is None or e["event"] == kind]

    def pids(self) -> set[int]:
        pids = {e["pid"] for e in self.events()}
        pids |= {e["child_pid"] for e in self.events("child")}
        return pids

    def alive(self) -> list[int]:
        return [pid for pid in self.pids() if pid_alive(pid)]
