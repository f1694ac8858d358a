"""jax.distributed is initialised from the launch's environment: explicit, detected or single."""

import pytest

from sgs_jax.parallel import distributed
from sgs_jax.parallel.distributed import DistributedSetupError, launch_spec


def test_single_process_launches_are_left_alone(monkeypatch):
    called = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda *a, **k: called.append(a))
    assert distributed.initialize_from_environment(environ={}).mode == "single"
    # a one-task SLURM job, and an explicit one-process launch, are single-process
    assert distributed.initialize_from_environment(environ={"SLURM_NTASKS": "1"}).mode == "single"
    assert distributed.initialize_from_environment("127.0.0.1:1234", 1, 0, environ={}).num_processes == 1
    assert called == []


def test_multi_process_launches_initialise(monkeypatch):
    called = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda *a, **k: called.append(a))
    monkeypatch.setattr(distributed.jax.config, "update", lambda *a: called.append(("config", *a)))
    assert distributed.initialize_from_environment(environ={"SLURM_NTASKS": "4"}).mode == "detected"
    assert distributed.initialize_from_environment("127.0.0.1:1234", 2, 1, environ={}).mode == "explicit"
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:8476", "SGS_NUM_PROCESSES": "8", "SGS_PROCESS_ID": "3"}
    assert distributed.initialize_from_environment(environ=env).process_id == 3
    gloo = ("config", "jax_cpu_collectives_implementation", "gloo")
    assert called == [gloo, (), gloo, ("127.0.0.1:1234", 2, 1), gloo, ("10.0.0.1:8476", 8, 3)]


def test_tpu_pod_is_detected():
    assert launch_spec(environ={"TPU_WORKER_HOSTNAMES": "w0,w1"}).mode == "detected"
    assert launch_spec(environ={"MEGASCALE_COORDINATOR_ADDRESS": "w0:8080"}).mode == "detected"


def test_flags_override_the_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:8476", "SGS_NUM_PROCESSES": "8", "SGS_PROCESS_ID": "3"}
    spec = launch_spec("127.0.0.1:9", 2, 0, environ=env)
    assert (spec.coordinator_address, spec.num_processes, spec.process_id) == ("127.0.0.1:9", 2, 0)


@pytest.mark.parametrize("args, env, words", [
    (("127.0.0.1:1234", None, None), {}, ["no process count", "no process id"]),
    ((None, 2, None), {}, ["no coordinator address", "no process id"]),
    ((None, None, None), {"SGS_PROCESS_ID": "1"}, ["no coordinator address", "no process count"]),
    (("127.0.0.1:1234", 2, 2), {}, ["process id 2 is outside 0..1"]),
    (("127.0.0.1:1234", 0, 0), {}, ["process count must be >= 1"]),
    (("127.0.0.1", 2, 0), {}, ["needs a port"]),
    ((None, None, None), {"JAX_COORDINATOR_ADDRESS": "h:1", "SGS_NUM_PROCESSES": "two", "SGS_PROCESS_ID": "0"},
     ["SGS_NUM_PROCESSES='two' is not an integer"]),
])
def test_half_set_or_bad_values_are_refused(args, env, words):
    with pytest.raises(DistributedSetupError) as info:
        launch_spec(*args, environ=env)
    for word in words:
        assert word in str(info.value)


def test_cli_refuses_a_half_set_launch(capsys):
    from sgs_jax.cli.train import main
    from tests.sgs.run_support import CONFIGS

    assert main(["--config", f"{CONFIGS / 'sgs.py'}:testbed", "--coordinator", "127.0.0.1:1234"]) == 2
    assert "half-set" in capsys.readouterr().err
