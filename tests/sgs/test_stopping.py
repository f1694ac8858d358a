"""GracefulStop: a stop signal abandons the work at once, waits for a deferred block, and
never lets the process outlive its grace period or a second signal."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sgs_jax.sgs.stopping import GracefulStop, StopRequested

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_raises_at_once_outside_a_deferred_block(sig, code):
    before = signal.getsignal(sig)
    with pytest.raises(StopRequested) as err:
        with GracefulStop():
            os.kill(os.getpid(), sig)
            time.sleep(5)  # interrupted: the handler raises
    assert err.value.signum == sig and err.value.exit_code == code
    assert signal.getsignal(sig) is before


def test_a_deferred_block_finishes_before_the_stop():
    done = []
    with pytest.raises(StopRequested):
        with GracefulStop() as stop:
            with stop.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                done.append("commit")
            done.append("never")
    assert done == ["commit"]


def test_an_exception_in_a_deferred_block_is_not_replaced():
    with pytest.raises(OSError):
        with GracefulStop() as stop:
            with stop.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                raise OSError("disk full")


def _script(body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent("""
        import os, signal, time
        from sgs_jax.sgs.stopping import GracefulStop
        stop = GracefulStop(grace_s=0.5, where=lambda: "resume from iteration 4", prog="t")
        with stop:
            with stop.deferred():
    """) + textwrap.indent(textwrap.dedent(body), " " * 8)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=30)


def test_a_stop_that_hangs_is_forced_out_after_the_grace_period():
    start = time.monotonic()
    done = _script("""
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(20)  # a commit that never ends
    """)
    assert done.returncode == 143 and time.monotonic() - start < 15
    assert done.stderr == "t: not stopped 0.5 s after SIGTERM: exiting at once; resume from iteration 4\n"


def test_a_second_signal_exits_at_once():
    done = _script("""
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(20)
    """)
    assert done.returncode == 130
    assert done.stderr == "t: second SIGINT: exiting at once; resume from iteration 4\n"
