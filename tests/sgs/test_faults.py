"""Fault injection: every fault a run can meet ends exactly like the uninterrupted run.

One uninterrupted reference run (2 iterations of the testbed with the packaged models, so
the Solver really trains) is shared by every case, with a snapshot of its directory after
iteration 1. Each case copies a snapshot, injects one fault in iteration 2 (at a named
point, `sgs_jax.faults`), then runs the same config again and compares with the
reference: every metric value (timings excepted), each step recorded exactly once in
metrics.jsonl, examples.jsonl and TensorBoard, the target state, the verdict cache and
every weight (bit for bit). The messages a user sees are checked too.

In-process cases stand in for a kill with `InjectedFault` (a BaseException nothing
catches, raised at the point) and resume in the same process (compiled programs are
shared, so a case costs about one iteration). Real signals go through the CLI, in process
(SIGTERM, SIGINT, sent by the process to itself at the point) and in a subprocess
(SIGKILL, SIGTERM to see the whole stderr, and a file-size limit that makes the OS refuse
a checkpoint write inside TensorStore).
"""

import collections
import errno
import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

from sgs_jax import jsonl
from sgs_jax.cli import train as train_cli
from sgs_jax.config import load_config
from sgs_jax.faults import ENV, InjectedFault
from sgs_jax.sgs.run import SGSRun
from sgs_jax.sgs.testbed_pretrain import MODELS_DIR
from tests.sgs.run_support import small_run_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs/sgs.py:testbed")
ITERATIONS = 2
TIMING = ("seconds", "per_second")

pytestmark = pytest.mark.skipif(not (MODELS_DIR / "base" / "config.json").exists(), reason="packaged testbed models not built")


def _overrides(workdir):
    return small_run_overrides(MODELS_DIR, workdir) + [f"--config.run.iterations={ITERATIONS}"]


def _cfg(workdir):
    return load_config(CONFIG, _overrides(workdir))


def _cli_args(workdir):
    return ["--config", CONFIG, *_overrides(workdir)]


def _weights(run):
    return {name: [np.asarray(x) for x in jax.tree_util.tree_leaves(t.params)] for name, t in run.roles.trainable().items()}


def _run(workdir, iterations=None):
    """SGSRun(config).run(), closed; returns the final weights."""
    run = SGSRun(_cfg(workdir))
    try:
        run.run(iterations)
        return _weights(run)
    finally:
        run.close()


def _tensorboard_steps(workdir):
    """(tag, step) -> how many events record it, over every event file."""
    counts = collections.Counter()
    for path in glob.glob(os.path.join(workdir, "events.out.tfevents.*")):
        for event in LegacyEventFileLoader(path).Load():
            for value in event.summary.value:
                counts[(value.tag, event.step)] += 1
    return counts


def _outcome(workdir, weights):
    """Everything a finished run leaves that must not depend on how it got there."""
    metrics, bad = jsonl.read_records(os.path.join(workdir, "metrics.jsonl"))
    assert bad == 0, "metrics.jsonl has unreadable lines"
    for record in metrics:
        record.pop("time")
        if "scalars" in record:
            record["scalars"] = {k: v for k, v in record["scalars"].items() if not k.endswith(TIMING)}
    examples, bad_examples = jsonl.read_records(os.path.join(workdir, "examples.jsonl"))
    cache, bad_cache = jsonl.read_records(os.path.join(workdir, "verify_cache.jsonl"))
    keys = [tuple(r["key"]) for r in cache]
    assert bad_examples == bad_cache == 0
    assert len(keys) == len(set(keys)), "a verdict is cached twice"
    tensorboard = _tensorboard_steps(workdir)
    assert set(tensorboard.values()) == {1}, "TensorBoard records a step twice"
    with open(os.path.join(workdir, "targets_state.json"), encoding="utf-8") as f:
        state = json.load(f)
    return {"metrics": metrics, "examples": examples, "cache_keys": set(keys), "tensorboard": set(tensorboard),
            "state": state, "weights": weights}


def assert_same(outcome, reference):
    assert [(r["step"], r.get("histogram")) for r in outcome["metrics"]] == [
        (r["step"], r.get("histogram")) for r in reference["metrics"]], "each step once, in order"
    assert outcome["metrics"] == reference["metrics"]
    for key in ("examples", "cache_keys", "tensorboard", "state"):
        assert outcome[key] == reference[key], key
    assert outcome["weights"].keys() == reference["weights"].keys()
    for name, leaves in reference["weights"].items():
        for ours, theirs in zip(outcome["weights"][name], leaves, strict=True):
            np.testing.assert_array_equal(ours, theirs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, plus snapshots of its directory after iteration 1 ('base')
    and at the end ('done')."""
    root = tmp_path_factory.mktemp("faults")
    workdir = root / "reference"
    run = SGSRun(_cfg(workdir))
    try:
        run.run(1)
        shutil.copytree(workdir, root / "base")
        run.run()
        weights = _weights(run)
    finally:
        run.close()
    shutil.copytree(workdir, root / "done")
    outcome = _outcome(workdir, weights)
    step2 = [r["scalars"] for r in outcome["metrics"] if r["step"] == 2 and "scalars" in r][0]
    # The faults below hit iteration 2 only if it samples conjectures, verifies new proofs and trains.
    assert step2["conjectures/generated"] > 0 and step2["solver/train_sequences"] > 0
    base_cache, _ = jsonl.read_records(root / "base" / "verify_cache.jsonl")
    assert len(outcome["cache_keys"]) > len(base_cache)
    return {"root": root, "outcome": outcome}


def _copy(reference, name, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(reference["root"] / name, workdir)
    return workdir


def _finish_and_compare(workdir, reference):
    assert_same(_outcome(workdir, _run(workdir)), reference["outcome"])


# ---- kills at every named point of iteration 2 -----------------------------------------
@pytest.mark.parametrize("point", ["sampling", "verification", "training", "logs", "checkpoint", "side_files"])
def test_killed_at_a_point_resumes_exactly(point, reference, tmp_path, monkeypatch):
    workdir = _copy(reference, "base", tmp_path)
    monkeypatch.setenv(ENV, f"{point}:raise")
    with pytest.raises(InjectedFault):
        _run(workdir)
    monkeypatch.delenv(ENV)
    if point == "checkpoint":  # killed mid-checkpoint: orbax's temporary directory is left
        assert glob.glob(str(workdir / "checkpoints" / "*tmp*"))
    if point == "side_files":  # the checkpoint committed, targets_state.json is stale
        assert os.path.isdir(workdir / "checkpoints" / "2")
        with open(workdir / "targets_state.json") as f:
            assert len(json.load(f)["iterations"]) == 1
    _finish_and_compare(workdir, reference)
    assert not glob.glob(str(workdir / "checkpoints" / "*tmp*"))


# ---- a damaged newest checkpoint ---------------------------------------------------------
def _largest_array_file(step_dir):
    files = [p for p in glob.glob(os.path.join(step_dir, "solver", "**", "d", "*"), recursive=True) if os.path.isfile(p)]
    return max(files, key=os.path.getsize)


def _flip(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(path, "wb").write(bytes(data))


def _edit_meta(step_dir):
    path = os.path.join(step_dir, "meta", "metadata")
    text = open(path, encoding="utf-8").read()
    open(path, "w", encoding="utf-8").write(text.replace('"generations": ', '"generations": 1', 1))


DAMAGE = {
    "flip_bytes": lambda step: _flip(_largest_array_file(step)),
    "truncate": lambda step: os.truncate(_largest_array_file(step), os.path.getsize(_largest_array_file(step)) // 2),
    "delete_file": lambda step: os.remove(_largest_array_file(step)),
    "edit_meta": _edit_meta,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_and_redoes(damage, reference, tmp_path, caplog):
    workdir = _copy(reference, "done", tmp_path)
    DAMAGE[damage](str(workdir / "checkpoints" / "2"))
    with caplog.at_level("WARNING"):
        weights = _run(workdir)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert "checkpoint step 2 is unreadable" in warnings[0] and "corrupt-2" in warnings[0] and len(warnings[0]) < 400
    assert os.path.isdir(workdir / "checkpoints" / "corrupt-2") and os.path.isdir(workdir / "checkpoints" / "2")
    assert_same(_outcome(workdir, weights), reference["outcome"])


def test_every_checkpoint_damaged_is_one_clear_error(reference, tmp_path, capsys):
    workdir = _copy(reference, "done", tmp_path)
    for step in ("1", "2"):
        _flip(_largest_array_file(str(workdir / "checkpoints" / step)))
    code = train_cli.main(_cli_args(workdir))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "no checkpoint" in err[0] and "can be restored" in err[0]
    assert sorted(os.listdir(workdir / "checkpoints")) == ["1", "2"]  # nothing moved: the next try says the same


# ---- torn logs ---------------------------------------------------------------------------
def _tear(path, fragment: bytes):
    with open(path, "ab") as f:
        f.write(fragment)


def test_torn_logs_are_cut_and_each_step_logged_once(reference, tmp_path):
    """A kill inside iteration 2's writes: each log ends in a fragment (the cache's cut
    inside a multi-byte character)."""
    workdir = _copy(reference, "base", tmp_path)
    _tear(workdir / "metrics.jsonl", b'{"step": 2, "time": 1.0, "scalars": {"generat')
    _tear(workdir / "examples.jsonl", b'{"iteration": 2, "conjectures": ["theorem x')
    _tear(workdir / "verify_cache.jsonl", '{"key": ["", "theorem t : p ∧ q'.encode()[:-1])
    _finish_and_compare(workdir, reference)


def test_records_past_the_checkpoint_are_dropped(reference, tmp_path):
    """Logs written for iteration 2 whose checkpoint never committed: dropped, redone once."""
    workdir = _copy(reference, "base", tmp_path)
    done = reference["root"] / "done"
    for name in ("metrics.jsonl", "examples.jsonl"):
        shutil.copy(done / name, workdir / name)
    _finish_and_compare(workdir, reference)


# ---- disk full, read-only ----------------------------------------------------------------
@pytest.mark.parametrize("point,action", [("logs", "enospc"), ("checkpoint", "enospc"), ("side_files", "erofs")])
def test_storage_failure_is_one_line_then_resumes_exactly(point, action, reference, tmp_path, monkeypatch, capsys):
    workdir = _copy(reference, "base", tmp_path)
    monkeypatch.setenv(ENV, f"{point}:{action}")
    code = train_cli.main(_cli_args(workdir))
    monkeypatch.delenv(ENV)
    err = capsys.readouterr().err.strip().splitlines()
    reason = os.strerror(errno.ENOSPC if action == "enospc" else errno.EROFS)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"sgs-train: cannot write {workdir}") and reason in err[0]
    resumes_from = 2 if point == "side_files" else 1
    assert err[0].endswith(f"rerun the same command to resume from iteration {resumes_from}")
    _finish_and_compare(workdir, reference)


# ---- graceful stop: SIGTERM and Ctrl-C ---------------------------------------------------
@pytest.mark.parametrize("point,action,code,where,resume", [
    ("training", "term", 143, "in iteration 2 of 2", 1),
    ("sampling", "int", 130, "in iteration 2 of 2", 1),
    ("checkpoint", "term", 143, "after iteration 2 of 2", 2),  # the commit finishes first
])
def test_stop_signal_ends_cleanly_and_resumes(point, action, code, where, resume, reference, tmp_path, monkeypatch, capsys):
    workdir = _copy(reference, "base", tmp_path)
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    monkeypatch.setenv(ENV, f"{point}:{action}")
    assert train_cli.main(_cli_args(workdir)) == code
    monkeypatch.delenv(ENV)
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == handlers
    captured = capsys.readouterr()
    name = "SIGTERM" if action == "term" else "SIGINT"
    assert captured.err.strip().splitlines() == [
        f"sgs-train: stopped by {name} {where}; rerun the same command to resume from iteration {resume}"]
    assert "resumed from iteration 1 of 2" in captured.out
    _finish_and_compare(workdir, reference)


def _subprocess(workdir, fault=None, timeout=300, prefix=()):
    # The same devices as this process (tests/conftest.py): the numbers must match bit for bit.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    if fault:
        env[ENV] = fault
    return subprocess.run([*prefix, sys.executable, "-m", "sgs_jax.cli.train", *_cli_args(workdir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


# Writes past 195 KiB fail with EFBIG (Python ignores SIGXFSZ): a real refused write inside
# TensorStore, as a full disk gives (root ignores read-only permissions, and this machine
# has no small file system to fill). Every checkpoint holds a data file over the limit (the
# nano embedding alone is ~240 kB compressed; how TensorStore groups the other arrays into
# files varies with timing), and every other file the iteration writes stays under it
# (compiled programs up to ~170 kB, logs a few kB).
LIMIT_FILE_SIZE = ("bash", "-c", 'ulimit -f 195 && exec "$@"', "limit")


def test_a_write_the_os_refuses_inside_the_checkpoint_is_one_line(reference, tmp_path):
    workdir = _copy(reference, "base", tmp_path)
    done = _subprocess(workdir, prefix=LIMIT_FILE_SIZE)
    assert done.returncode == 1
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        f"sgs-train: cannot write {workdir}/checkpoints: File too large; free space (or make it writable) "
        "and rerun the same command to resume from iteration 1"], done.stderr[-3000:]
    assert glob.glob(str(workdir / "checkpoints" / "*tmp*"))
    _finish_and_compare(workdir, reference)


def test_sigkill_between_checkpoint_and_side_files(reference, tmp_path):
    """A real SIGKILL after the last checkpoint committed: the restart finds a finished run
    whose targets_state.json is one iteration stale, and rewrites it from the checkpoint."""
    workdir = _copy(reference, "base", tmp_path)
    done = _subprocess(workdir, "side_files:kill")
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    with open(workdir / "targets_state.json") as f:
        assert len(json.load(f)["iterations"]) == 1
    _finish_and_compare(workdir, reference)


@pytest.mark.slow  # a second subprocess; the in-process SIGTERM cases above run in CI
def test_sigterm_in_a_subprocess_prints_one_line_and_no_traceback(reference, tmp_path):
    workdir = _copy(reference, "base", tmp_path)
    done = _subprocess(workdir, "verification:term")
    assert done.returncode == 143
    ours = [line for line in done.stderr.splitlines() if line.startswith("sgs-train:")]
    assert ours == ["sgs-train: stopped by SIGTERM in iteration 2 of 2; rerun the same command to resume from iteration 1"]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    _finish_and_compare(workdir, reference)


# ---- a changed config --------------------------------------------------------------------
def test_resuming_with_another_config_is_refused(reference, tmp_path, capsys):
    workdir = _copy(reference, "done", tmp_path)
    recorded = (workdir / "config.json").read_bytes()
    code = train_cli.main(_cli_args(workdir) + ["--config.run.iterations=3", "--config.sgs.proofs_per_problem=3"])
    err = capsys.readouterr().err
    assert code == 2
    assert "run.iterations: recorded 2, now 3" in err and "sgs.proofs_per_problem: recorded 2, now 3" in err
    assert (workdir / "config.json").read_bytes() == recorded
    code = train_cli.main(_cli_args(workdir) + ["--config.run.iterations=3", "--allow-config-change", "sgs.proofs_per_problem"])
    assert code == 2 and "cannot change on resume" in capsys.readouterr().err
    assert (workdir / "config.json").read_bytes() == recorded
    # Allowed: the same command with the field named extends the run, and says so on disk.
    code = train_cli.main(_cli_args(workdir) + ["--config.run.iterations=3", "--allow-config-change=run.iterations"])
    assert code == 0, capsys.readouterr().err
    assert "resumed from iteration 2 of 3" in capsys.readouterr().out
    assert json.loads((workdir / "config.json").read_text())["run"]["iterations"] == 3
    (change,) = [json.loads(line) for line in open(workdir / "config_changes.jsonl")]
    assert change["from_iteration"] == 2 and change["changes"] == {"run.iterations": {"recorded": 2, "new": 3}}
    assert [r["step"] for r in jsonl.read_records(workdir / "metrics.jsonl")[0] if "scalars" in r][-1] == 3
