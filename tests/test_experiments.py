"""The experiment runner: definitions, the plan, the sgs-train command, finish records, failures."""

import pathlib
import shlex

import pytest

from sgs_jax import experiments as ex
from sgs_jax.cli import experiments as cli
from sgs_jax.config import parse_config_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
FINDINGS = ROOT / "configs" / "experiments" / "findings.py"


def _experiment(**changes):
    fields = dict(name="exp", entries=(ex.Entry("sgs", "../sgs.py:testbed"),), seeds=(1,))
    fields.update(changes)
    return ex.Experiment(**fields)


@pytest.mark.parametrize("changes,message", [
    ({"name": "a b"}, "folder name"),
    ({"entries": (ex.Entry("x", "a.py"), ex.Entry("x", "b.py"))}, "distinct labels"),
    ({"entries": ()}, "distinct labels"),
    ({"seeds": ()}, "seeds"),
    ({"seeds": (1, 1)}, "seeds"),
    ({"seeds": (-1,)}, "seeds"),
    ({"overrides": {"run.seed": 3}}, "run.seed is set by the runner"),
    ({"entries": (ex.Entry("x", "a.py", {"run.workdir": "/tmp"}),)}, "x: run.workdir is set by the runner"),
])
def test_invalid_experiments_name_the_problem(changes, message):
    with pytest.raises(ValueError, match=message):
        _experiment(**changes)


def test_findings_plan_paths_order_and_subsets(tmp_path):
    experiment = ex.load_experiment(FINDINGS)
    runs = ex.plan_runs(experiment, FINDINGS.parent, tmp_path)
    assert [r.name for r in runs] == [f"{label}_seed{s}" for s in (1, 2, 3)
                                      for label in ("sgs", "rl_baseline", "no_guide", "cispo_sgs")]
    assert all(r.workdir == tmp_path / "findings" / r.name for r in runs)
    assert runs[0].config == f"{ROOT / 'configs' / 'sgs.py'}:testbed"
    assert all(r.iterations == 30 for r in runs)  # the experiment's override of the presets' 10
    subset = ex.plan_runs(experiment, FINDINGS.parent, tmp_path, only=["no_guide"], seeds=[7],
                          extra=["--config.run.iterations=2"])
    assert [(r.name, r.iterations) for r in subset] == [("no_guide_seed7", 2)]
    with pytest.raises(ValueError, match="unknown entries"):
        ex.plan_runs(experiment, FINDINGS.parent, tmp_path, only=["nope"])
    with pytest.raises(ValueError, match="sgs seed 1: unknown config field 'run.nope'"):
        ex.plan_runs(experiment, FINDINGS.parent, tmp_path, extra=["--config.run.nope=1"])
    with pytest.raises(ValueError, match="sgs seed 1: flag --config.run.iterations=x: invalid literal"):
        ex.plan_runs(experiment, FINDINGS.parent, tmp_path, extra=["--config.run.iterations=x"])
    with pytest.raises(ValueError, match="experiment is set by the runner"):
        ex.plan_runs(experiment, FINDINGS.parent, tmp_path, extra=["--config.experiment=x"])
    with pytest.raises(ValueError, match="'run.iterations=2' is not a --config.FIELD=VALUE flag"):
        ex.plan_runs(experiment, FINDINGS.parent, tmp_path, extra=["run.iterations=2"])


def test_the_command_gives_sgs_train_exactly_the_planned_config(tmp_path):
    """The override plumbing: what the runner writes is what sgs-train parses and applies."""
    experiment = _experiment(overrides={"sampling.temperature": 0.5})
    prompt = tmp_path / "it's a path.txt"  # quoting; the file must exist (sgs_jax.config.validate)
    prompt.write_text("{statement}", encoding="utf-8")
    extra = ["--config.run.iterations=4", f"--config.prompts.solver={prompt}", "--config.sgs.use_guide=false"]
    (run,) = ex.plan_runs(experiment, FINDINGS.parent, tmp_path, extra=extra)
    command = ex.train_command(run)
    assert command[1:3] == ["-m", "sgs_jax.cli.train"]
    cfg, positional = parse_config_flags(["sgs-train", *command[3:]])  # what sgs-train parses
    assert positional == []
    assert (cfg.run.workdir, cfg.run.seed, cfg.experiment) == (str(tmp_path / "exp" / "sgs_seed1"), 1, "sgs")
    assert (cfg.run.iterations, cfg.sampling.temperature, cfg.sgs.use_guide) == (4, 0.5, False)
    assert cfg.prompts.solver == str(prompt)
    assert cfg.run.compile_cache_dir == str(tmp_path / "exp" / "compile_cache")  # shared by the experiment's runs
    (own,) = ex.plan_runs(experiment, FINDINGS.parent, tmp_path, extra=["--config.run.compile_cache_dir=off"])
    assert parse_config_flags(["sgs-train", *ex.train_command(own)[3:]])[0].run.compile_cache_dir == "off"


def test_finish_record_and_completed_iterations(tmp_path):
    (run,) = ex.plan_runs(_experiment(), FINDINGS.parent, tmp_path)
    assert not ex.is_finished(run) and ex.completed_iterations(run.workdir) == 0
    run.workdir.mkdir(parents=True)
    ex._write_record(run, 1.0)
    assert ex.is_finished(run)
    (changed,) = ex.plan_runs(_experiment(), FINDINGS.parent, tmp_path, extra=["--config.run.iterations=99"])
    assert not ex.is_finished(changed)  # another command: started again (sgs-train resumes it)
    with open(run.workdir / "metrics.jsonl", "w") as f:
        f.write('{"step": 0, "scalars": {}}\n{"step": 3, "histogram": "h", "values": []}\n{"step": 4, "sca')
    assert ex.completed_iterations(run.workdir) == 3  # a torn last line is not a completed iteration


def test_cli_dry_run_and_bad_input(tmp_path, capsys):
    assert cli.main([str(FINDINGS), "--root", str(tmp_path), "--dry-run", "--only", "sgs", "--seeds", "4"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert shlex.split(line)[1:5] == ["-m", "sgs_jax.cli.train", "--config", f"{ROOT}/configs/sgs.py:testbed"]
    assert f"--config.run.workdir={tmp_path}/findings/sgs_seed4" in shlex.split(line)
    for bad, message in ((["--config.run.iterations=x"], "--config.run.iterations=x: invalid literal"),
                         (["--set", "run.iterations=2"], "--set is retired: write --config.run.iterations=2"),
                         (["--config.run.iterations", "2"], "write --config.run.iterations=VALUE (with =)"),
                         (["--jobs", "0"], "--jobs"), (["--only", "nope"], "unknown entries")):
        assert cli.main([str(FINDINGS), "--root", str(tmp_path)] + bad) == 2
        assert message in capsys.readouterr().err
    assert cli.main([str(tmp_path / "none.py")]) == 2 and "not found" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing was created


def test_a_failed_run_is_reported_and_retried(tmp_path, capsys):
    empty = tmp_path / "empty_checkpoint"
    empty.mkdir()
    (empty / "config.json").write_text("{}", encoding="utf-8")  # passes the config check, fails to load
    definition = tmp_path / "broken.py"
    definition.write_text(
        "from sgs_jax.experiments import Entry, Experiment\n"
        "def get_experiment():\n"
        f"    return Experiment('broken', (Entry('rl', {str(ROOT / 'configs' / 'rl_baseline.py') + ':testbed'!r},"
        f" {{'model.checkpoint': {str(empty)!r}}}),), seeds=(1,))\n", encoding="utf-8")
    assert cli.main([str(definition), "--root", str(tmp_path / "runs")]) == 1
    out = capsys.readouterr().out
    assert "FAILED rl_seed1 (exit" in out and f"end of {tmp_path / 'runs' / 'broken' / 'rl_seed1' / 'train.log'}" in out
    assert "1 failed: rl_seed1; rerun the same command to retry them" in out
    run_dir = tmp_path / "runs" / "broken" / "rl_seed1"
    assert not (run_dir / ex.RECORD_NAME).exists()  # not finished: the next invocation retries it
    log = (run_dir / "train.log").read_text(encoding="utf-8")
    assert log.startswith("=== ") and "sgs_jax.cli.train" in log.splitlines()[0]
