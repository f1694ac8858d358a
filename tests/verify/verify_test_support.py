"""Helpers shared by the verification tests: fake-REPL command lines, logs, liveness."""

from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Iterable

FAKE_REPL = pathlib.Path(__file__).with_name("fake_lean_repl.py")
D3K_HEADER = "import Mathlib\nimport Aesop\nset_option maxHeartbeats 0\nopen BigOperators Real Nat Topology Rat\n\n"


def read_log(path: pathlib.Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (state first), or None when no such process."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot: with the pid, names one process even
    after the pid is reused (pids wrap at 32768 on small hosts)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def pid_alive(pid: int, started: int | None = None) -> bool:
    """True if `pid` runs (zombies, which an init without reaping may keep, count as dead);
    with `started` (its `start_ticks`), a later process that reuses the pid counts as dead."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    return started is None or int(fields[19]) == started


def still_running(processes: Iterable[int | tuple[int, int | None]], grace_s: float = 0.0) -> list[int]:
    """The pids of `processes` (pids, or (pid, start ticks) pairs) still running after up to
    `grace_s` seconds: a process sent SIGKILL is gone only once the kernel has run its exit,
    which on a loaded host can lag the kill by more than a test's last few lines."""
    pairs = [p if isinstance(p, tuple) else (p, None) for p in processes]
    deadline = time.monotonic() + grace_s
    while True:
        alive = sorted(pid for pid, started in pairs if pid_alive(pid, started))
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


class FakeRepl:
    """Builds fake-REPL command lines that log to one file, and checks for leaks."""

    def __init__(self, tmp_path: pathlib.Path):
        self.log = tmp_path / "fake_repl_log.jsonl"

    def cmd(self, *flags: str) -> list[str]:
        return [sys.executable, str(FAKE_REPL), "--log", str(self.log), *flags]

    def events(self, kind: str | None = None) -> list[dict]:
        return [e for e in read_log(self.log) if kind is None or e["event"] == kind]

    def _processes(self) -> set[tuple[int, int | None]]:
        """(pid, start ticks) of every process the fake REPLs logged."""
        procs = {(e["pid"], e.get("started")) for e in self.events()}
        procs |= {(e["child_pid"], e.get("child_started")) for e in self.events("child")}
        return procs

    def alive(self, grace_s: float = 0.0) -> list[int]:
        """Logged processes still running after up to `grace_s` seconds (`still_running`)."""
        return still_running(self._processes(), grace_s)
