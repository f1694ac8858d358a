"""jax.distributed is initialised only for multi-process launches."""

from sgs_jax.parallel import distributed


def test_single_process_is_left_alone(monkeypatch):
    for key in distributed._ENV_HINTS:
        monkeypatch.delenv(key, raising=False)
    called = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda *a, **k: called.append(a))
    assert distributed.maybe_initialize_distributed() is False
    monkeypatch.setenv("SLURM_NTASKS", "1")  # a one-task SLURM job is still single-process
    assert distributed.maybe_initialize_distributed() is False
    assert called == []


def test_multi_process_launches_initialise(monkeypatch):
    for key in distributed._ENV_HINTS:
        monkeypatch.delenv(key, raising=False)
    called = []
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda *a, **k: called.append(a))
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert distributed.maybe_initialize_distributed() is True
    assert distributed.maybe_initialize_distributed("127.0.0.1:1234", 2, 0) is True
    assert called == [(), ("127.0.0.1:1234", 2, 0)]
