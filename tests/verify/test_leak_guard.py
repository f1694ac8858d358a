"""The leak guard of the verification tests (`FakeRepl.alive`) itself: it must report a
fake REPL that is still running, wait out one that was killed, and not mistake a later
process that reuses a logged pid for the one logged."""

import json
import os
import signal
import subprocess
import time

from verify_test_support import FakeRepl, start_ticks


def test_a_running_fake_and_its_child_are_reported_until_killed(tmp_path):
    fake = FakeRepl(tmp_path)
    proc = subprocess.Popen(fake.cmd(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        proc.stdin.write(b'{"cmd": "theorem t : True := by\\n  simp -- fake:hang"}\n\n')
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while not fake.events("child") and time.monotonic() < deadline:
            time.sleep(0.05)
        child = fake.events("child")[0]["child_pid"]
        assert fake.alive() == sorted([proc.pid, child])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert fake.alive(grace_s=10.0) == []


def test_a_reused_pid_is_not_the_logged_process(tmp_path):
    fake = FakeRepl(tmp_path)
    me, started = os.getpid(), start_ticks(os.getpid())
    with open(fake.log, "w", encoding="utf-8") as f:  # this process, logged with another start time
        f.write(json.dumps({"event": "start", "pid": me, "started": started + 1}) + "\n")
    assert fake.alive() == []
    with open(fake.log, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": "start", "pid": me, "started": started}) + "\n")
    assert fake.alive() == [me]
