"""Start the processes of a local multi-process JAX job (CPU devices) and wait for them all."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(devices: int, extra: dict | None = None) -> dict:
    """The environment of one process: `devices` simulated CPU devices, this checkout first."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("SGS_FAULT_AT", None)
    env.update(extra or {})
    return env


def run_job(argv: list[str], processes: int, devices: int, logs: pathlib.Path, timeout: float = 600,
            env_of=lambda i: {}) -> list[int]:
    """Run `python *argv --coordinator ... --num-processes N --process-id I` as `processes`
    processes of `devices` CPU devices each; returns their exit codes. When one fails, the
    others are killed (as a cluster launcher does). Logs go to logs/process_I.log."""
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for i in range(processes):
        cmd = [sys.executable, *argv, "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes),
               "--process-id", str(i)]
        log = open(logs / f"process_{i}.log", "w")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=process_env(devices, env_of(i)),
                                      cwd=ROOT))
        log.close()
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
        time.sleep(0.2)
    return [p.returncode for p in procs]


def log_tail(logs: pathlib.Path, lines: int = 30) -> str:
    """The last lines of every process's log (for assertion messages)."""
    out = []
    for path in sorted(logs.glob("process_*.log")):
        text = [l for l in path.read_text(errors="replace").splitlines() if "Gloo" not in l]
        out.append(f"--- {path.name}\n" + "\n".join(text[-lines:]))
    return "\n".join(out)
