"""sgs-eval: the pass@k estimator, and best-of-n evaluation of the packaged base model and
of a trained run's Solver (same prompt, extraction and verifier as training)."""

import json
import math
from fractions import Fraction

import jax
import numpy as np
import pytest
from flax import nnx

from sgs_jax.cli import eval as eval_cli
from sgs_jax.parallel import make_mesh
from sgs_jax.sgs.evaluation import Evaluation, TargetResult, markdown_table, pass_at_k, table_ks
from sgs_jax.sgs.saved_roles import RunDirError, load_role
from sgs_jax.testbed.backend import PropVerifier
from sgs_jax.verify import VerifyRequest


def _exact(n, c, k):
    """1 - C(n-c, k) / C(n, k) in exact rational arithmetic."""
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_pass_at_k_hand_computed():
    # n = 5 samples, c = 2 verified: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10;
    # pass@3 = 1 - C(3,3)/C(5,3) = 1 - 1/10; pass@4: any 4 of 5 include a verified one.
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=1e-12)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9, abs=1e-12)
    assert pass_at_k(5, 2, 4) == 1.0 and pass_at_k(5, 2, 5) == 1.0
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 8, 1) == 1.0
    # Large n: the product form matches the exact ratio of binomials.
    for n, c, k in ((200, 3, 100), (1024, 17, 32), (64, 1, 1)):
        assert pass_at_k(n, c, k) == pytest.approx(float(_exact(n, c, k)), rel=1e-12, abs=1e-15)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_set_pass_at_k_is_the_mean_over_targets_skipped_count_unsolved():
    results = (
        TargetResult("a", "theorem a : True := by", n=4, extracted=4, c=1, proofs=("trivial",)),
        TargetResult("b", "theorem b : True := by", n=4, extracted=2, c=4, proofs=("trivial",)),
        TargetResult("c", "theorem c : True := by", n=0, extracted=0, c=0, proofs=()),  # prompt too long
    )
    evaluation = Evaluation(4, results, {"verified": 5}, tokens=10)
    rates = evaluation.pass_at_k()
    # a: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1/2; b: 1; c: 0.
    assert rates[1] == pytest.approx((0.25 + 1 + 0) / 3)
    assert rates[2] == pytest.approx((0.5 + 1 + 0) / 3)
    assert rates[4] == pytest.approx(2 / 3)
    assert (evaluation.solved, evaluation.skipped, evaluation.extraction_failures) == (2, 1, 2)
    table = markdown_table(evaluation, "t")
    assert "| 2 | 50.0% | 1.5 |" in table and "1 prompts too long" in table
    assert table_ks(8) == [1, 2, 4, 8] and table_ks(6) == [1, 2, 4, 6] and table_ks(1) == [1]
    record = results[2].to_json(4)
    assert record["skipped"] and record["pass_at_k"] == {"1": 0.0, "2": 0.0, "3": 0.0, "4": 0.0}


def _read(out):
    rows = [json.loads(line) for line in open(out / "per_target.jsonl", encoding="utf-8")]
    return rows, json.load(open(out / "summary.json", encoding="utf-8"))


def _check_consistent(rows, summary, n):
    """Every record's counts, pass@k and proofs agree with each other and with the checker."""
    checker = PropVerifier()
    from sgs_jax.testbed.generator import DEFAULT_PATH
    from sgs_jax.sgs.target_set import TargetSet

    targets = TargetSet.load(DEFAULT_PATH).by_id
    for row in rows:
        assert row["n"] == n and 0 <= row["c"] <= row["extracted"] <= n
        assert len(row["pass_at_k"]) == n
        for k in range(1, n + 1):
            assert row["pass_at_k"][str(k)] == pytest.approx(pass_at_k(n, row["c"], k))
        assert bool(row["proofs"]) == (row["c"] > 0) and len(row["proofs"]) <= row["c"]
        target = targets[row["id"]]
        for proof in row["proofs"]:  # re-checked independently of the evaluation's verifier
            assert checker.submit(VerifyRequest(target.header, target.statement, proof)).result().verified
    for k in range(1, n + 1):
        assert summary["pass_at_k"][str(k)] == pytest.approx(np.mean([r["pass_at_k"][str(k)] for r in rows]))
    assert summary["solved"] == sum(r["c"] > 0 for r in rows)
    assert summary["verify"]["verified"] == sum(r["c"] for r in rows)
    checker.close()


def test_eval_packaged_base_model(tmp_path, capsys):
    """The packaged testbed base (the README's starting Solver) on 8 targets, n = 4."""
    args = ["--checkpoint", str(eval_cli_base()), "--n", "4", "--limit", "8", "--max-batch", "32", "--mesh", "one"]
    assert eval_cli.main(args + ["--out", str(tmp_path / "a")]) == 0
    table = capsys.readouterr().out
    assert "| 4 |" in table and "8 targets, n = 4" in table
    rows, summary = _read(tmp_path / "a")
    assert [r["id"] for r in rows] == [f"prop_{i:04d}" for i in range(8)]
    _check_consistent(rows, summary, 4)
    # The packaged base proves some of the first targets (README: 11 of 96 at pass@8), not all.
    assert 0 < summary["solved"] < 8
    # Same seed, same samples: the evaluation is reproducible.
    assert eval_cli.main(args + ["--out", str(tmp_path / "b")]) == 0
    assert _read(tmp_path / "b")[0] == rows


def eval_cli_base():
    from sgs_jax.sgs.testbed_pretrain import MODELS_DIR

    return MODELS_DIR / "base"


def test_eval_trained_run_solver(trained_run, tmp_path):
    workdir, _ = trained_run
    common = ["--n", "2", "--max-batch", "16", "--mesh", "one"]
    assert eval_cli.main(["--run", str(workdir), "--out", str(tmp_path / "it1")] + common) == 0
    rows, summary = _read(tmp_path / "it1")
    assert summary["iteration"] == 1 and summary["targets"] == 6  # the run's targets.limit
    _check_consistent(rows, summary, 2)
    # Iteration 0 of the run is its base checkpoint: the same samples as evaluating that
    # checkpoint directly under the run's settings (one prompt/sampling/seed path).
    assert eval_cli.main(["--run", str(workdir), "--iteration", "0", "--out", str(tmp_path / "it0")] + common) == 0
    base_rows, _ = _read(tmp_path / "it0")
    config_file = tmp_path / "run_config.py"
    config_file.write_text(
        "import json\nfrom ml_collections import ConfigDict\n"
        f"def get_config():\n    return ConfigDict(json.load(open({str(workdir / 'config.json')!r})))\n"
    )
    direct = ["--checkpoint", str(eval_cli_base()), "--config", str(config_file)]
    assert eval_cli.main(direct + ["--out", str(tmp_path / "direct")] + common) == 0
    assert _read(tmp_path / "direct")[0] == base_rows


def test_step_0_base_solve_rate_is_sgs_eval_of_the_base_model(trained_run, tmp_path):
    """Step 0 logs the base Solver's pass@k on the targets (before any training: the
    cumulative solve rate is still 0): the number sgs-eval gives for iteration 0 with n = k."""
    workdir, _ = trained_run
    (step0,) = [r["scalars"] for r in map(json.loads, open(workdir / "metrics.jsonl")) if r["step"] == 0 and "scalars" in r]
    assert step0["cumulative_solve_rate"] == 0.0 and step0["generations"] == 0.0
    assert eval_cli.main(["--run", str(workdir), "--iteration", "0", "--n", "4", "--out", str(tmp_path / "base")]) == 0
    _, summary = _read(tmp_path / "base")
    assert summary["solved"] > 0, "the packaged base model solves some of the 6 targets: the comparison means something"
    assert step0["base_solve_rate"] == summary["pass_at_k"]["4"] == summary["solved"] / summary["targets"]


def test_eval_errors_are_clear(trained_run, tmp_path, capsys):
    workdir, _ = trained_run
    assert eval_cli.main(["--run", str(workdir), "--iteration", "7", "--out", str(tmp_path / "x")]) == 2
    assert "iteration 7 is not saved" in capsys.readouterr().err
    assert eval_cli.main(["--run", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert eval_cli.main(["--run", str(workdir), "--backend", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown verification backend" in capsys.readouterr().err


def test_load_role_restores_the_runs_weights(trained_run):
    workdir, weights = trained_run
    mesh = make_mesh(1, -1, 1)
    for role in ("solver", "conjecturer"):
        model, iteration = load_role(workdir, role, None, mesh)
        assert iteration == 1
        restored = jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.asarray, nnx.state(model)))
        expected = jax.tree_util.tree_leaves(weights[role])
        assert len(restored) == len(expected)
        for a, b in zip(restored, expected):
            np.testing.assert_array_equal(a, b)
    # Iteration 0 is the base checkpoint, which the trained Solver has moved away from.
    base, _ = load_role(workdir, "solver", 0, mesh)
    trained = jax.tree_util.tree_leaves(weights["solver"])
    assert any(not np.array_equal(np.asarray(a), b) for a, b in zip(jax.tree_util.tree_leaves(nnx.state(base)), trained))
    with pytest.raises(RunDirError, match="saved iterations: \\[1\\]"):
        load_role(workdir, "solver", 3, mesh)


@pytest.mark.parametrize("experiment, item", [
    ("sgs", "conjecturer"), ("frozen_conjecturer", None), ("no_guide", "conjecturer"), ("rl_baseline", RunDirError),
])
def test_checkpoint_item_of_each_experiment(experiment, item):
    from sgs_jax.config import load_config
    from sgs_jax.sgs.saved_roles import checkpoint_item
    from tests.sgs.run_support import CONFIGS

    cfg = load_config(str(CONFIGS / f"{experiment}.py:testbed"))
    assert checkpoint_item(cfg, "solver") == "solver"
    if item is RunDirError:
        with pytest.raises(RunDirError, match="no Conjecturer"):
            checkpoint_item(cfg, "conjecturer")
    else:
        assert checkpoint_item(cfg, "conjecturer") == item
    cfg.model.parameter_sharing = True
    if item == "conjecturer":
        assert checkpoint_item(cfg, "conjecturer") == "solver"


def test_run_config_of_an_older_run_gets_the_settings_added_since_at_their_defaults(tmp_path):
    from sgs_jax.config import load_config, record_config
    from sgs_jax.sgs.saved_roles import load_run_config
    from tests.sgs.run_support import CONFIGS

    record_config(load_config(str(CONFIGS / "sgs.py:testbed"), ["--config.sgs.proofs_per_problem=4"]), tmp_path)
    recorded = json.loads((tmp_path / "config.json").read_text())
    del recorded["model"]["attention"]  # as written by code older than the setting
    recorded["solver_train"]["epochs"] = 2  # a setting the code no longer has
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    cfg = load_run_config(tmp_path)
    assert cfg.model.attention == "auto"  # the default: the behaviour the run had
    assert cfg.sgs.proofs_per_problem == 4 and cfg.solver_train.epochs == 2  # recorded values kept
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(RunDirError, match="not a run's config"):
        load_run_config(tmp_path)
