"""One Lean REPL process (leanprover-community/repl JSON protocol).

Protocol: each command is one JSON object followed by a blank line on stdin; each reply
is one JSON object (possibly pretty-printed over several lines) followed by a blank line
on stdout. JSON escapes newlines inside strings, so a blank line always ends a reply.

The process runs in its own session (so its own process group, with every child it
starts, e.g. `lake env` -> `repl`) under an address-space limit. Any fault (timeout,
exit, unparsable reply) kills the whole group, and the object is never used again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import select
import shlex
import signal
import subprocess
import tempfile
import time
import weakref
from typing import Any, Sequence

GIB = 1 << 30


class ReplError(Exception):
    """The REPL process failed; it has been killed and must not be reused."""


class ReplTimeout(ReplError):
    """No reply within the wall-clock limit."""


class ReplCrashed(ReplError):
    """The process exited (or could not start)."""


class ReplProtocolError(ReplError):
    """The reply was not a JSON object."""


@dataclasses.dataclass(frozen=True)
class ReplConfig:
    """How to start one REPL.

    cmd: argv of a REPL-compatible executable (e.g. ("lake", "exe", "repl")).
    cwd: the Lean project directory it runs in (None: current directory).
    address_space_bytes: RLIMIT_AS for the process and its children (None: no limit).
    env: extra environment variables.
    """

    cmd: tuple[str, ...]
    cwd: str | None = None
    address_space_bytes: int | None = 12 * GIB
    env: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def parse_cmd(cmd: str | Sequence[str]) -> tuple[str, ...]:
        """A command line as argv (a string is split like a shell would)."""
        argv = tuple(shlex.split(cmd)) if isinstance(cmd, str) else tuple(cmd)
        if not argv:
            raise ValueError("empty REPL command")
        return argv


def _limit_address_space(limit: int | None):
    """preexec_fn for the child: only async-signal-safe work (one setrlimit call)."""
    if limit is None:
        return None
    setrlimit, rlimit_as = resource.setrlimit, resource.RLIMIT_AS  # bound before fork

    def apply() -> None:
        setrlimit(rlimit_as, (limit, limit))

    return apply


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group led by `proc` and reap `proc`."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
        pass
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream:
                stream.close()
        except OSError:
            pass


class LeanRepl:
    """A live REPL process. `send` one command, get its reply dict.

    After any `ReplError` the process group is dead and `alive` is False.
    """

    def __init__(self, config: ReplConfig):
        self.config = config
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ, **dict(config.env))
        try:
            self._proc = subprocess.Popen(
                list(config.cmd),
                cwd=config.cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                start_new_session=True,  # own process group: killed whole, never half
                preexec_fn=_limit_address_space(config.address_space_bytes),
                close_fds=True,
            )
        except OSError as err:
            self._stderr.close()
            raise ReplCrashed(f"cannot start REPL {shlex.join(config.cmd)!r}: {err}") from err
        self._finalizer = weakref.finalize(self, _kill_group, self._proc)
        self._buffer = b""
        self.alive = True
        os.set_blocking(self._proc.stdin.fileno(), False)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def send(self, command: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one command and wait at most `timeout_s` wall seconds for its reply.

        Raises ReplTimeout / ReplCrashed / ReplProtocolError, after killing the group.
        """
        if not self.alive:
            raise ReplCrashed("REPL already closed")
        deadline = time.monotonic() + timeout_s
        try:
            self._write((json.dumps(command, ensure_ascii=False) + "\n\n").encode("utf-8"), deadline)
            raw = self._read_reply(deadline)
        except ReplError:
            self.kill()
            raise
        try:
            reply = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            self.kill()
            raise ReplProtocolError(f"unparsable reply: {raw[:200]!r}") from err
        if not isinstance(reply, dict):
            self.kill()
            raise ReplProtocolError(f"reply is not a JSON object: {raw[:200]!r}")
        return reply

    def _write(self, data: bytes, deadline: float) -> None:
        fd = self._proc.stdin.fileno()
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReplTimeout("timed out writing the command")
            _, writable, _ = select.select([], [fd], [], remaining)
            if not writable:
                continue
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError) as err:
                raise ReplCrashed(self._exit_reason(f"stdin closed ({err})")) from err

    def _read_reply(self, deadline: float) -> bytes:
        fd = self._proc.stdout.fileno()
        while True:
            head, sep, rest = self._buffer.lstrip(b"\n").partition(b"\n\n")
            if sep:
                self._buffer = rest
                return head
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReplTimeout("no reply within the time limit")
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise ReplCrashed(self._exit_reason("REPL closed its output"))
            self._buffer += chunk

    def _exit_reason(self, what: str) -> str:
        try:
            code = self._proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            code = None
        return f"{what}; exit code {code}; stderr: {self.stderr_tail()!r}"

    def stderr_tail(self, limit: int = 300) -> str:
        """Last characters the process wrote to stderr (for crash reasons)."""
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - limit))
            return self._stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        """Kill the whole process group. Idempotent."""
        if self.alive:
            self.alive = False
            self._finalizer()
            self._stderr.close()

    close = kill
