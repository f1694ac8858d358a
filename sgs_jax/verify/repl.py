"""One Lean REPL process (leanprover-community/repl JSON protocol).

Protocol: each command is one JSON object followed by a blank line on stdin; each reply
is one JSON object (possibly pretty-printed over several lines) followed by a blank line
on stdout. JSON escapes newlines inside strings, so a blank line always ends a reply.

The process runs in its own session (so its own process group, with every child it
starts, e.g. `lake env` -> `repl`) under an address-space limit. The limit is set by a
tiny exec shim (`python -c`: setrlimit, then exec the REPL command in the same process),
not by a `preexec_fn`, which the Python docs warn can deadlock when threads are running
(the pool starts REPLs from worker threads); it is in place before the command's first
instruction, so every child inherits it. Any fault (timeout, exit, unparsable reply)
kills the whole group, and the object is never used again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
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


# Runs as `python -c SHIM LIMIT CMD...`: limit the address space, then become CMD (same
# pid, so the process group and /proc/<pid>/limits are CMD's). Exit 127 like a shell when
# CMD cannot be executed.
_LIMIT_SHIM = (
    "import os, resource, sys\n"
    "try:\n"
    "    limit = int(sys.argv[1])\n"
    "    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except (OSError, ValueError) as err:\n"
    "    sys.stderr.write(f'cannot start {sys.argv[2]!r} under RLIMIT_AS={sys.argv[1]}: {err}\\n')\n"
    "    os._exit(127)\n"
)


def limited_argv(cmd: Sequence[str], address_space_bytes: int | None) -> list[str]:
    """argv that runs `cmd` under RLIMIT_AS = address_space_bytes (None: `cmd` as is)."""
    if address_space_bytes is None:
        return list(cmd)
    return [sys.executable, "-I", "-S", "-c", _LIMIT_SHIM, str(int(address_space_bytes)), *cmd]


def _executable(cmd: Sequence[str], cwd: str | None, env: dict[str, str]) -> str | None:
    """The path `cmd[0]` would run as (relative to `cwd`), or None when nothing would run."""
    program = cmd[0]
    if os.sep in program:
        path = program if os.path.isabs(program) else os.path.join(cwd or os.getcwd(), program)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(program, path=env.get("PATH", os.defpath))


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
        env = dict(os.environ, **dict(config.env))
        if _executable(config.cmd, config.cwd, env) is None:  # the shim would start regardless
            raise ReplCrashed(f"cannot start REPL {shlex.join(config.cmd)!r}: {config.cmd[0]!r} is not an executable")
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(
                limited_argv(config.cmd, config.address_space_bytes),
                cwd=config.cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                start_new_session=True,  # own process group: killed whole, never half
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
