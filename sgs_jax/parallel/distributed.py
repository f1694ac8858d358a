"""Multi-host set-up on JAX's own runtime: `jax.distributed.initialize`, who writes, barriers,
agreement checks, and a key-value exchange of small byte strings between processes.

Every process of a job runs the same program. `initialize_from_environment` starts JAX's
distributed runtime when the launch spans several processes:

  explicit   coordinator address, process count and process id, all three, from sgs-train's
             flags (--coordinator, --num-processes, --process-id) or the environment
             (JAX_COORDINATOR_ADDRESS, SGS_NUM_PROCESSES, SGS_PROCESS_ID; flags win). Half of
             them set is refused naming what is missing.
  detected   a Cloud TPU VM pod slice (TPU_WORKER_HOSTNAMES / MEGASCALE_COORDINATOR_ADDRESS)
             or a SLURM job with more than one task: JAX's own cluster detection fills in all
             three (jax._src.clusters).
  single     anything else: nothing is initialised.

These are facts of one launch, not settings of a run: they never enter the run's config
(process ids differ between processes, and a run may resume on another topology).

On CPU devices (tests, the local N-process launcher) the processes' collectives go over
Gloo (`jax_cpu_collectives_implementation`), set before the runtime starts.

`KeyValueExchange` wraps the distributed runtime's key-value store (the coordination service
JAX already runs for every multi-process job): the verifier shares verdicts through it
(`sgs_jax.verify.shared`) without device collectives, so it can be used from worker threads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from typing import Any, Mapping

import jax

log = logging.getLogger(__name__)

# Explicit settings in the environment (the flags' names in parentheses).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"  # (--coordinator) host:port of process 0's coordinator service
ENV_NUM_PROCESSES = "SGS_NUM_PROCESSES"  # (--num-processes)
ENV_PROCESS_ID = "SGS_PROCESS_ID"  # (--process-id)
# Launch environments whose cluster JAX detects by itself.
_TPU_HINTS = ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


class DistributedSetupError(ValueError):
    """The launch's distributed settings are incomplete or inconsistent (message names them)."""


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """How this process joins the job. mode: "explicit" | "detected" | "single"; the three
    values are set only in explicit mode."""

    mode: str
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


def _int(value: str | int | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedSetupError(f"{name}={value!r} is not an integer") from None


def launch_spec(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> LaunchSpec:
    """The launch this process is part of, from explicit values (flags) over `environ`
    (default os.environ). Raises DistributedSetupError for half-set or out-of-range values."""
    env = os.environ if environ is None else environ
    address = coordinator_address or env.get(ENV_COORDINATOR) or None
    count = num_processes if num_processes is not None else _int(env.get(ENV_NUM_PROCESSES), ENV_NUM_PROCESSES)
    index = process_id if process_id is not None else _int(env.get(ENV_PROCESS_ID), ENV_PROCESS_ID)
    given = {"coordinator address (--coordinator / JAX_COORDINATOR_ADDRESS)": address,
             "process count (--num-processes / SGS_NUM_PROCESSES)": count,
             "process id (--process-id / SGS_PROCESS_ID)": index}
    if any(v is not None for v in given.values()):
        missing = [name for name, v in given.items() if v is None]
        if missing:
            have = ", ".join(f"{name}={v}" for name, v in given.items() if v is not None)
            raise DistributedSetupError(
                f"multi-process launch half-set: {have} given but no {' and no '.join(missing)}; set all three, "
                f"or none of them on a TPU VM pod or under SLURM (JAX detects those)")
        if count < 1:
            raise DistributedSetupError(f"process count must be >= 1, got {count}")
        if not 0 <= index < count:
            raise DistributedSetupError(f"process id {index} is outside 0..{count - 1} (process count {count})")
        if ":" not in address:
            raise DistributedSetupError(f"coordinator address {address!r} needs a port (host:port)")
        return LaunchSpec("explicit", address, count, index)
    slurm_tasks = _int(env.get("SLURM_NTASKS"), "SLURM_NTASKS")
    if any(env.get(k) for k in _TPU_HINTS) or (slurm_tasks is not None and slurm_tasks > 1):
        return LaunchSpec("detected")
    return LaunchSpec("single")


def initialize_from_environment(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> LaunchSpec:
    """Start JAX's distributed runtime as `launch_spec` says (before any other JAX call);
    returns the spec. A single-process launch is left alone; an explicit one-process launch
    (num_processes 1) is too."""
    spec = launch_spec(coordinator_address, num_processes, process_id, environ)
    if spec.mode == "single" or spec.num_processes == 1:
        return spec
    # Gloo carries CPU devices' cross-process collectives (the default has none); it does not
    # touch TPU or GPU collectives.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if spec.mode == "explicit":
        jax.distributed.initialize(spec.coordinator_address, spec.num_processes, spec.process_id)
    else:
        jax.distributed.initialize()
    log.info("jax.distributed: process %d of %d (%s launch), %d local of %d devices",
             jax.process_index(), jax.process_count(), spec.mode, jax.local_device_count(), jax.device_count())
    return spec


def is_writer() -> bool:
    """Whether this process writes the run's files (metrics, side files, caches): process 0."""
    return jax.process_index() == 0


def sync(name: str) -> None:
    """Barrier of every process (a no-op alone); `name` must be the same on all."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def fingerprint(value: Any) -> str:
    """SHA-256 of `value`'s canonical JSON."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def check_agreement(value: Any, what: str) -> None:
    """Raise RuntimeError unless every process holds the same `value` (JSON-able), compared
    by fingerprint; a no-op alone. Every process must call it at the same point."""
    if jax.process_count() == 1:
        return
    import numpy as np
    from jax.experimental import multihost_utils

    digest = np.frombuffer(bytes.fromhex(fingerprint(value)), dtype=np.uint32)
    every = np.asarray(multihost_utils.process_allgather(digest))
    disagree = [p for p in range(every.shape[0]) if not np.array_equal(every[p], every[0])]
    if disagree:
        raise RuntimeError(f"processes disagree on {what}: processes {disagree} differ from process 0 "
                           f"(the run's host-side decisions must be identical on every process)")


class KeyValueExchange:
    """Byte strings shared between the processes of one job through JAX's coordination
    service. Thread-safe; keys are written once. `client`: the distributed runtime's client
    (default: the running job's)."""

    def __init__(self, client=None):
        if client is None:
            from jax._src import distributed as _distributed

            client = _distributed.global_state.client
            if client is None:
                raise RuntimeError("jax.distributed is not initialised: no key-value store to exchange through")
        self._client = client

    def put(self, key: str, value: bytes) -> None:
        self._client.key_value_set_bytes(key, value)

    def get(self, key: str, timeout_s: float) -> bytes | None:
        """The value of `key` once some process has put it; None after `timeout_s`."""
        try:
            return self._client.blocking_key_value_get_bytes(key, int(timeout_s * 1000))
        except Exception as err:  # the client raises XlaRuntimeError(DEADLINE_EXCEEDED) on timeout
            if "DEADLINE_EXCEEDED" in str(err) or "timed out" in str(err).lower():
                return None
            raise

    def delete(self, key: str) -> None:
        self._client.key_value_delete(key)

    def barrier(self, name: str, timeout_s: float = 3600.0) -> None:
        """Wait until every process reaches barrier `name` (each name used once)."""
        self._client.wait_at_barrier(name, int(timeout_s * 1000))
