"""Multi-host set-up: initialise `jax.distributed` when the job spans several processes."""

from __future__ import annotations

import os

import jax

_ENV_HINTS = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "SLURM_NTASKS", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


def maybe_initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Call `jax.distributed.initialize` when running multi-host; returns True if it did.

    With explicit arguments it always initialises. Otherwise it initialises only when the
    environment shows a multi-process launch (TPU pod, SLURM with >1 task, or a coordinator
    address), letting JAX auto-detect the rest. Single-process runs are left alone.
    """
    if coordinator_address or num_processes:
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
        return True
    multi = any(os.environ.get(k) for k in _ENV_HINTS)
    if os.environ.get("SLURM_NTASKS") and int(os.environ["SLURM_NTASKS"]) <= 1:
        multi = any(os.environ.get(k) for k in _ENV_HINTS if k != "SLURM_NTASKS")
    if not multi:
        return False
    jax.distributed.initialize()
    return True
