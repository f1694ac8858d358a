"""Fixtures for the verification tests: the fake REPL command and a process-leak guard."""

import os

import pytest

from verify_test_support import FakeRepl


@pytest.fixture
def fake_repl(tmp_path):
    """Fake REPL factory; fails the test if any process it started is still alive after."""
    fake = FakeRepl(tmp_path)
    yield fake
    leaked = fake.alive(grace_s=10.0)
    for pid in leaked:  # clean up before failing, so one leak does not spread
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    assert not leaked, f"fake REPL processes leaked: {leaked}"
