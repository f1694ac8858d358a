"""The SGS loop end to end on the testbed: phases, bookkeeping, checkpoints and resume.

Random nano models (saved as HF checkpoints with the testbed tokenizer), 6 targets, k = 2:
this checks the plumbing and the accounting, not learning.
"""

import json
import os

import pytest

from sgs_jax.config import load_config
from sgs_jax.models import ModelConfig, create_model, save_hf
from sgs_jax.sgs.run import SGSRun
from sgs_jax.testbed.model_configs import llama_config
from sgs_jax.testbed.tokenizer import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Random nano base and Guide checkpoints in HF format."""
    root = tmp_path_factory.mktemp("models")
    config = ModelConfig.from_hf_dict(llama_config("nano", 1024))
    for seed, name in ((0, "base"), (1, "guide")):
        save_hf(create_model(config, seed=seed), root / name, tokenizer=load_tokenizer())
    return root


@pytest.fixture
def make_config(checkpoints):
    def make(workdir, experiment="sgs", *extra):
        return _config(checkpoints, workdir, experiment, *extra)

    return make


def _config(models, workdir, experiment, *extra):
    overrides = [
        f"run.workdir={str(workdir)!r}",
        f"model.checkpoint={str(models / 'base')!r}",
        f"model.guide_checkpoint={str(models / 'guide')!r}",
        "targets.limit=6",
        "sgs.proofs_per_problem=2",
        "sampling.solver_max_total_len=192",
        "sampling.conjecturer_max_new_tokens=48",
        "sampling.guide_max_new_tokens=48",
        "sampling.max_batch=16",
        "solver_train.batch_size=16",
        "solver_train.micro_batch_size=16",
        "conjecturer_train.batch_size=16",
        "conjecturer_train.micro_batch_size=16",
        *extra,
    ]
    return load_config(os.path.join(ROOT, f"configs/{experiment}.py:testbed"), overrides)


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


@pytest.mark.parametrize("experiment", ["rl_baseline", "ei_solver_only", "cispo_sgs"])
def test_ablations_run_one_iteration(tmp_path, make_config, experiment):
    cfg = make_config(tmp_path / experiment, experiment)
    summary, _ = _run(cfg, 1)
    assert summary["iterations"] == 1
    scalars = _metrics(tmp_path / experiment)[-1]["scalars"]
    if not cfg.sgs.use_conjecturer:
        assert "conjectures/generated" not in scalars
        assert scalars["generations"] == 2 * 6
