"""The SGS loop end to end on the testbed: phases, bookkeeping, checkpoints and resume.

Random nano models (saved as HF checkpoints with the testbed tokenizer), 6 targets, k = 2:
this checks the plumbing and the accounting, not learning.
"""

import json
import os

import numpy as np
import pytest
from flax import nnx

from sgs_jax.config import load_config
from sgs_jax.sgs.run import SGSRun
from tests.sgs.run_support import small_run_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def make_config(random_checkpoints):
    def make(workdir, experiment="sgs", *flags):
        path = os.path.join(ROOT, f"configs/{experiment}.py:testbed")
        return load_config(path, small_run_overrides(random_checkpoints, workdir) + list(flags))

    return make


def _run(cfg, iterations):
    """SGSRun(cfg).run(iterations), always closing the run; returns (summary, resumed-from iteration)."""
    run = SGSRun(cfg)
    try:
        start = run.iteration
        return run.run(iterations=iterations), start
    finally:
        run.close()


def _metrics(workdir):
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    return [r for r in rows if "scalars" in r]


def test_iterations_checkpoint_and_resume(tmp_path, make_config):
    cfg = make_config(tmp_path / "run")
    summary, _ = _run(cfg, 1)
    assert summary["iterations"] == 1
    scalars = _metrics(tmp_path / "run")[-1]["scalars"]
    # Generation counter (SPEC 4.10): every Conjecturer sample + k x (targets + kept conjectures).
    kept = scalars["conjectures/generated"] - scalars["conjectures/malformed"] - scalars["conjectures/duplicates"]
    assert scalars["generations"] == scalars["conjectures/generated"] + 2 * (6 + kept)
    assert 0.0 <= scalars["cumulative_solve_rate"] <= 1.0
    attempts = sum(scalars[f"verify/{s}"] for s in ("verified", "rejected", "lean_error", "timeout", "system_error"))
    assert attempts + scalars["solver/extraction_failures"] == 2 * (6 + kept)
    for name in ("config.json", "targets_state.json", "examples.jsonl", "metrics.jsonl"):
        assert os.path.exists(tmp_path / "run" / name), name

    # A second process with the same config resumes after iteration 1.
    summary, start = _run(cfg, 2)
    assert start == 1 and summary["iterations"] == 2
    assert summary["generations"] > int(scalars["generations"])
    steps = [r["step"] for r in _metrics(tmp_path / "run")]
    assert steps[-1] == 2
    # targets_state.json numbers iterations as the metrics do (entry N after N iterations).
    with open(tmp_path / "run" / "targets_state.json") as f:
        assert [entry["iteration"] for entry in json.load(f)["iterations"]] == [1, 2]

    # Step 0's base-model measurement changes nothing the method does: without it,
    # iteration 1 logs the same numbers (the generation axis included).
    without, _ = _run(make_config(tmp_path / "no_base", "sgs", "--config.run.base_solve_rate=false"), 1)
    first, second = (_metrics(d)[:2] for d in (tmp_path / "run", tmp_path / "no_base"))
    assert "base_solve_rate" in first[0]["scalars"] and "base_solve_rate" not in second[0]["scalars"]
    timing = ("seconds", "per_second")
    same = [{k: v for k, v in r["scalars"].items() if not k.endswith(timing)} for r in (first[1], second[1])]
    assert same[0] == same[1]


def _hparams(run_dir):
    """(session start hparams, experiment metric tags) from the run folder's event files."""
    import glob

    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    from tensorboard.plugins.hparams import metadata

    sessions, metrics = [], []
    for path in glob.glob(os.path.join(run_dir, "events.out.tfevents.*")):
        for event in LegacyEventFileLoader(path).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name != metadata.PLUGIN_NAME:
                    continue
                content = value.metadata.plugin_data.content
                if value.tag == metadata.SESSION_START_INFO_TAG:
                    info = metadata.parse_session_start_info_plugin_data(content)
                    sessions.append({k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
                                     for k, v in info.hparams.items()})
                elif value.tag == metadata.EXPERIMENT_TAG:
                    metrics += [m.name.tag for m in metadata.parse_experiment_plugin_data(content).metric_infos]
    return sessions, metrics


def test_tensorboard_hparams_and_exports(tmp_path, make_config, monkeypatch):
    """The config as TensorBoard hparams (once, rewritten after a resume), and the Solver
    exported every run.export_every iterations, atomically: a kill mid-export leaves no
    half checkpoint, and the next start writes the export that is due."""
    import glob

    from sgs_jax.faults import ENV, InjectedFault
    from sgs_jax.models import load_hf

    workdir = tmp_path / "run"
    cfg = make_config(workdir, "sgs", "--config.run.export_every=1", "--config.run.iterations=1")
    monkeypatch.setenv(ENV, "export:raise")
    run = SGSRun(cfg)
    try:
        with pytest.raises(InjectedFault):
            run.run()
    finally:
        run.close()
    monkeypatch.delenv(ENV)
    export = workdir / "exports" / "solver_iteration_1"
    assert not export.exists() and len(glob.glob(f"{export}.partial-*")) == 1  # staged, never renamed
    run = SGSRun(cfg)  # the run is finished; its due export is written on start-up
    try:
        assert run.iteration == 1
        weights = {n: np.asarray(x) for n, x in nnx.to_flat_state(nnx.state(run.roles.solver.model))}
    finally:
        run.close()
    assert not glob.glob(f"{export}.partial-*")
    assert json.load(open(export / "sgs_export.json"))["iteration"] == 1
    exported = {n: np.asarray(x) for n, x in nnx.to_flat_state(nnx.state(load_hf(export)))}
    assert exported.keys() == weights.keys()
    for name, value in weights.items():
        np.testing.assert_array_equal(exported[name], value)

    sessions, metrics = _hparams(workdir)
    assert len(sessions) == 1, "one hparams record after the rebuild at start-up"
    assert sessions[0]["sgs.proofs_per_problem"] == 2 and sessions[0]["sgs.use_guide"] is True
    assert sessions[0]["run.export_every"] == 1 and "run.workdir" not in sessions[0]
    assert {"cumulative_solve_rate", "cumulative_solve_rate/hard", "base_solve_rate"} <= set(metrics)


@pytest.mark.parametrize("experiment", ["rl_baseline", "ei_solver_only", "cispo_sgs"])
def test_ablations_run_one_iteration(tmp_path, make_config, experiment):
    cfg = make_config(tmp_path / experiment, experiment)
    summary, _ = _run(cfg, 1)
    assert summary["iterations"] == 1
    scalars = _metrics(tmp_path / experiment)[-1]["scalars"]
    if not cfg.sgs.use_conjecturer:
        assert "conjectures/generated" not in scalars
        assert scalars["generations"] == 2 * 6


@pytest.mark.parametrize("n", [0, 1, 3])
def test_log_examples_caps_what_examples_jsonl_gets(tmp_path, n):
    """run.log_examples = kept conjectures and verified proofs (each) logged per iteration."""
    import types

    from sgs_jax import jsonl
    from ml_collections import ConfigDict

    from sgs_jax.metrics import MetricsWriter

    path = tmp_path / "examples.jsonl"
    run = types.SimpleNamespace(cfg=ConfigDict({"run": {"log_examples": n}}), iteration=3,
                                _examples=jsonl.Appender(path) if n else None, metrics=MetricsWriter(tmp_path))
    SGSRun._write_examples(run, {"conjectures": ["c1", "c2"], "conjecture_solve_rates": [0.5, 1.0],
                                 "guide_replies": ["<relevance>1</relevance>", None], "proofs": ["p1", "p2", "p3", "p4"]})
    run.metrics.close()
    records, _ = jsonl.read_records(path)
    texts = _text_summaries(tmp_path)
    if n == 0:
        assert records == [] and texts == {}
    else:
        assert records == [{"iteration": 3, "conjectures": ["c1", "c2"][:n], "conjecture_solve_rates": [0.5, 1.0][:n],
                            "guide_replies": ["<relevance>1</relevance>", None][:n], "proofs": ["p1", "p2", "p3", "p4"][:n]}]
        assert set(texts) == {("examples/conjectures", 3), ("examples/proofs", 3)}
        conjectures = texts[("examples/conjectures", 3)]
        assert "c1" in conjectures and "solve rate 0.50" in conjectures and "<relevance>1</relevance>" in conjectures
        assert ("c2" in conjectures) == (n > 1) and ("not scored by the Guide" in conjectures) == (n > 1)
        assert texts[("examples/proofs", 3)].count("**Proof") == min(n, 4)


def _text_summaries(run_dir):
    """(tag, step) -> text of every TensorBoard text summary in the run folder."""
    import glob

    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    out = {}
    for path in glob.glob(os.path.join(run_dir, "events.out.tfevents.*")):
        for event in LegacyEventFileLoader(path).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":
                    out[(value.tag, event.step)] = value.tensor.string_val[0].decode()
    return out
