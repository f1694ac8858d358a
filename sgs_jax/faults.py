"""Named fault points of an SGS iteration: a test hook that fails a run at an exact place.

Tests kill runs here instead of after a timer, so every fault case is deterministic. The
points, in the order one iteration reaches them:

  sampling      the Conjecturer has sampled; proving (sampling + verification) is next
  verification  a verdict of this iteration has just been appended to the verdict cache
  training      the Solver has trained: its new weights exist only in memory
  logs          the iteration's metrics and examples are about to be appended
  checkpoint    the checkpoint's files are written into orbax's temporary directory, which
                is not yet renamed into place (a kill here is a kill mid-checkpoint)
  side_files    the checkpoint has committed; targets_state.json is about to be written
  export        a Hugging Face export (run.export_every, sgs-export) is written to its
                staging directory, not yet renamed into place (a kill mid-export)

`SGS_FAULT_AT=<point>[:<action>]` makes the process fail each time it reaches `point`:

  kill (default)  SIGKILL itself: a preempted machine
  term, int       send itself SIGTERM or SIGINT: a scheduler's stop, Ctrl-C
  raise           raise InjectedFault, a BaseException that no handler catches: the
                  in-process stand-in for a kill (tests then resume in the same process)
  enospc, erofs   raise OSError ENOSPC / EROFS naming the file the point was about to
                  write: a full disk, a read-only file system

The variable is read at each point (one dict lookup), so the hook costs nothing unset.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "SGS_FAULT_AT"
POINTS = ("sampling", "verification", "training", "logs", "checkpoint", "side_files", "export")
ACTIONS = ("kill", "term", "int", "raise", "enospc", "erofs")


class InjectedFault(BaseException):
    """Raised at a fault point with action `raise` (not an Exception: nothing catches it)."""


def parse(spec: str) -> tuple[str, str]:
    """(point, action) of an SGS_FAULT_AT value; ValueError when unknown."""
    point, _, action = spec.partition(":")
    action = action or "kill"
    if point not in POINTS or action not in ACTIONS:
        raise ValueError(f"{ENV}={spec!r}: expected <point>[:<action>] with point in {POINTS}, action in {ACTIONS}")
    return point, action


def fault_point(name: str, path: str | os.PathLike | None = None) -> None:
    """Fail here when SGS_FAULT_AT names this point. `path`: the file about to be written
    (named by the injected OSError)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, action = parse(spec)
    if point != name:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action in ("term", "int"):
        os.kill(os.getpid(), signal.SIGTERM if action == "term" else signal.SIGINT)
    elif action == "raise":
        raise InjectedFault(f"injected fault at {name}")
    else:
        code = errno.ENOSPC if action == "enospc" else errno.EROFS
        raise OSError(code, os.strerror(code), os.fspath(path) if path is not None else None)
