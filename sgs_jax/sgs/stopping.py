"""Graceful stop: SIGTERM (what SLURM and TPU preemption send) and SIGINT (Ctrl-C) end a
run cleanly, within a bounded time.

    with GracefulStop() as stop:
        ...                          # a signal here raises StopRequested at once
        with stop.deferred():
            ...                      # a signal here waits: StopRequested when the block ends

The first signal abandons the current phase (StopRequested is a BaseException, like
KeyboardInterrupt, so no `except Exception` swallows it) unless a deferred block (the
end-of-iteration commit: logs, checkpoint, side files) is running, which finishes first.
The caller then cleans up and exits with 128 + the signal number. If it has not exited
`grace_s` seconds after the signal, or a second signal comes, the process exits at once
(every checkpoint is atomic, so nothing is lost but the iteration in progress).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_GRACE_S = 60.0


class StopRequested(BaseException):
    """A stop signal arrived; `signum` says which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class GracefulStop:
    """Installs SIGTERM/SIGINT handlers for the `with` block (main thread only; elsewhere
    it does nothing). `where`: returns the line printed when the process is forced out."""

    def __init__(self, grace_s: float = STOP_GRACE_S, where: Callable[[], str] | None = None, prog: str = "sgs"):
        self.grace_s = grace_s
        self.where = where
        self.prog = prog
        self.signum: int | None = None
        self._depth = 0
        self._raised = False
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._timer is not None:
            self._timer.cancel()

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # a second signal: the user insists
            self._force_exit(f"second {signal.Signals(signum).name}: exiting at once", signum)
        self.signum = signum
        self._timer = threading.Timer(self.grace_s, self._force_exit,
                                      (f"not stopped {self.grace_s:g} s after {signal.Signals(signum).name}: exiting at once", signum))
        self._timer.daemon = True
        self._timer.start()
        if self._depth == 0:
            self._raised = True
            raise StopRequested(signum)

    def _force_exit(self, reason: str, signum: int) -> None:
        where = ""
        if self.where is not None:
            try:
                where = f"; {self.where()}"
            except Exception:  # the run object may be half built
                pass
        sys.stderr.write(f"{self.prog}: {reason}{where}\n")
        sys.stderr.flush()
        os._exit(128 + signum)

    @contextlib.contextmanager
    def deferred(self):
        """A block a stop signal does not interrupt; the stop is raised when it ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self.signum is not None and not self._raised:
            self._raised = True
            raise StopRequested(self.signum)
