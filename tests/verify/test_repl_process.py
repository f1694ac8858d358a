"""One REPL process: protocol framing, env numbering, and every way it can fail."""

import os
import subprocess
import sys
import time

import pytest

from verify_test_support import D3K_HEADER, still_running
from sgs_jax.verify.repl import GIB, LeanRepl, ReplConfig, ReplCrashed, ReplProtocolError, ReplTimeout, limited_argv

STATEMENT = "theorem t (x : ℝ) (h : 0 < x) : 0 < x ^ 2 := by"


def _repl(fake, *flags, limit=GIB):
    return LeanRepl(ReplConfig(tuple(fake.cmd(*flags)), address_space_bytes=limit))


def test_protocol_env_numbering_and_multiline_replies(fake_repl):
    repl = _repl(fake_repl)
    try:
        assert repl.send({"cmd": D3K_HEADER}, 5) == {"env": 0}
        reply = repl.send({"cmd": STATEMENT + "\n  sorry", "env": 0}, 5)
        # Long reply: pretty-printed over several lines, still one framed reply.
        assert reply["env"] == 1
        assert reply["sorries"][0]["pos"] == {"line": 2, "column": 2}
        assert reply["messages"][0]["severity"] == "warning"
        axioms = repl.send({"cmd": "#print axioms t", "env": 1}, 5)
        assert axioms["env"] == 2
        assert axioms["messages"][0]["data"] == "'t' depends on axioms: [sorryAx]"
        assert repl.send({"cmd": "#print axioms t", "env": 99}, 5) == {"message": "Unknown environment 99."}
        assert repl.alive
    finally:
        repl.kill()
    assert not repl.alive


def test_timeout_kills_the_whole_process_group(fake_repl):
    repl = _repl(fake_repl)
    start = time.monotonic()
    with pytest.raises(ReplTimeout):
        repl.send({"cmd": STATEMENT + "\n  simp -- fake:hang"}, 0.7)
    assert time.monotonic() - start < 5
    assert not repl.alive
    children = [e["child_pid"] for e in fake_repl.events("child")]
    assert len(children) == 1
    assert not still_running(children, grace_s=5), "the REPL's child survived the group kill"
    with pytest.raises(ReplCrashed):
        repl.send({"cmd": "#print axioms t"}, 1)  # never reused


def test_crash_reports_exit_code_and_stderr(fake_repl):
    repl = _repl(fake_repl)
    with pytest.raises(ReplCrashed, match="INTERNAL PANIC"):
        repl.send({"cmd": STATEMENT + "\n  simp -- fake:crash"}, 5)
    assert not repl.alive


def test_garbage_reply_is_a_protocol_error(fake_repl):
    repl = _repl(fake_repl)
    with pytest.raises(ReplProtocolError, match="unparsable"):
        repl.send({"cmd": STATEMENT + "\n  simp -- fake:garbage"}, 5)
    assert not repl.alive


def test_address_space_limit_ends_a_leaking_repl(fake_repl):
    repl = _repl(fake_repl, limit=512 << 20)
    with pytest.raises(ReplCrashed):
        repl.send({"cmd": STATEMENT + "\n  simp -- fake:leak"}, 10)


def _address_space_limits(pid):
    with open(f"/proc/{pid}/limits") as f:
        line = next(x for x in f if x.startswith("Max address space"))
    return line.split()[3:5]  # soft, hard (bytes)


@pytest.mark.skipif(not os.path.exists("/proc/self/limits"), reason="needs Linux /proc")
def test_address_space_limit_is_on_the_repl_process_itself(fake_repl):
    repl = _repl(fake_repl, limit=3 * GIB)
    try:
        assert repl.send({"cmd": D3K_HEADER}, 5) == {"env": 0}
        assert _address_space_limits(repl.pid) == [str(3 * GIB)] * 2
        with open(f"/proc/{repl.pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        assert any(b"fake_lean_repl" in a for a in argv) and b"-c" not in argv  # the shim exec'd into the REPL
    finally:
        repl.kill()
    unlimited = _repl(fake_repl, limit=None)
    try:
        assert unlimited.send({"cmd": D3K_HEADER}, 5) == {"env": 0}
        assert _address_space_limits(unlimited.pid) == ["unlimited"] * 2
    finally:
        unlimited.kill()


def test_children_of_the_repl_inherit_the_limit():
    grandchild = "import resource; print(resource.getrlimit(resource.RLIMIT_AS))"
    child = f"import subprocess, sys; print(subprocess.run([sys.executable, '-c', {grandchild!r}], capture_output=True, text=True).stdout)"
    out = subprocess.run(limited_argv([sys.executable, "-c", child], 2 * GIB), capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == str((2 * GIB, 2 * GIB))


def test_missing_executable_is_a_clear_error(tmp_path):
    with pytest.raises(ReplCrashed, match="cannot start REPL"):
        LeanRepl(ReplConfig((str(tmp_path / "no-such-repl"),)))
    with pytest.raises(ReplCrashed, match="cannot start REPL"):
        LeanRepl(ReplConfig(("no-such-repl-on-path",)))
