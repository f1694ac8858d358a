"""Configs: every experiment file and preset loads and validates; bad values fail clearly;
a run directory's recorded config is compared, never silently overwritten."""

import glob
import json
import os

import pytest

from sgs_jax.config import (SAFE_ON_RESUME, ConfigError, _get, check_resume, config_diff, flag_args, load_config,
                            record_config, validate)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = os.path.join(ROOT, "configs/sgs.py:testbed")


def test_base_loads_and_overrides():
    cfg = load_config(TESTBED, ["--config.run.iterations=3", "--config.solver_train.lr=1", "--config.verify.options.workers=2"])
    assert cfg.run.iterations == 3 and cfg.solver_train.lr == 1.0 and cfg.verify.options.workers == 2
    # absl's spellings: a separate value, bool words and --no, a dict literal for a mapping.
    cfg = load_config(TESTBED, ["--config.run.iterations", "4", "--config.sgs.use_guide=false", "--noconfig.verify.cache",
                                "--config.verify.options={'workers': 3, 'timeout_s': 2.5}", "--config.run.workdir=/tmp/a b"])
    assert (cfg.run.iterations, cfg.sgs.use_guide, cfg.verify.cache) == (4, False, False)
    assert cfg.verify.options.to_dict() == {"workers": 3, "timeout_s": 2.5} and cfg.run.workdir == "/tmp/a b"
    # The last of repeated flags wins; an option's value is a literal when it parses as one.
    cfg = load_config(TESTBED, ["--config.run.seed=1", "--config.run.seed=2", "--config.verify.options.url=http://h:1"])
    assert cfg.run.seed == 2 and cfg.verify.options.url == "http://h:1"


def test_flag_args_round_trip():
    """What programs write (`flag_args`) is parsed back to the same values."""
    values = {"run.iterations": 7, "solver_train.lr": 1e-6, "sgs.use_guide": False, "run.workdir": "/x/it's here",
              "experiment": "a b", "verify.options": {"workers": 2}}
    cfg = load_config(TESTBED, flag_args(values))
    assert {name: _get(cfg, name) for name in values} == {**values, "verify.options": cfg.verify.options}
    assert cfg.verify.options.to_dict() == {"workers": 2}


# Every validation rule: (overrides, text the error must contain; the field's name first).
BAD = [
    (["--config.run.iterations=x"], "--config.run.iterations=x: invalid literal for int"),
    (["--config.run.iterations=1.5"], "--config.run.iterations"),
    (["--config.nope.x=1"], "unknown config field 'nope.x'"),
    (["--config.run.nope=1"], "unknown config field 'run.nope'"),
    (["--config.run.iteration=3"], "unknown config field 'run.iteration'.*did you mean run.iterations"),
    (["--config.run.iterations.x=1"], "unknown config field 'run.iterations.x'"),
    (["--config.sgs.use_guide=maybe"], "--config.sgs.use_guide"),
    (["--config.run.iterations=0"], "positive"),
    (["--config.sgs.solver_objective=ppo"], "one of"),
    (["--config.sampling.top_p=1.5"], "top_p"),
    (["--config.solver_train.micro_batch_size=5"], "multiple"),
    (["run.iterations=3"], "'run.iterations=3' is not a --config.FIELD=VALUE override"),
    (["--set", "run.iterations=3"], "--set is retired: write --config.run.iterations=3"),
    (["--set=model.checkpoint='/m'"], "--set is retired: write --config.model.checkpoint=/m"),
    (["--workdir", "/r"], "--workdir is retired: write --config.run.workdir=/r"),
    (["--iterations=5"], "--iterations is retired: write --config.run.iterations=5"),
    (["--config.sgs.keep_quantile=1.0"], "keep_quantile"),
    (["--config.sgs.keep_quantile=0.0"], "keep_quantile"),
    (["--config.run.workdir="], "run.workdir"),
    (["--config.run.workdir=  "], "run.workdir"),
    (["--config.run.keep_checkpoints=0"], "run.keep_checkpoints must be positive"),
    (["--config.run.keep_checkpoints=-1"], "run.keep_checkpoints must be positive"),
    (["--config.targets.limit=-1"], "targets.limit must be >= 0"),
    (["--config.run.log_examples=-2"], "run.log_examples must be >= 0"),
    (["--config.run.export_every=-1"], "run.export_every must be >= 0"),
    (["--config.sgs.ei_buffer_iterations=0"], "sgs.ei_buffer_iterations must be positive"),
    (["--config.model.checkpoint=/no/such/model"], "model.checkpoint: '/no/such/model' does not exist"),
    ([f"--config.model.checkpoint={os.path.join(ROOT, 'configs')}"], "model.checkpoint: .*not a Hugging Face checkpoint \\(no config.json\\)"),
    (["--config.model.checkpoint=configs/nope"], "model.checkpoint: 'configs/nope' does not exist"),  # a path, not a hub id
    (["--config.model.guide_checkpoint=/no/such/guide"], "model.guide_checkpoint: '/no/such/guide' does not exist"),
    (["--config.model.guide_checkpoint=", "--config.guide.sft_data=/no/such.jsonl"], "guide.sft_data: file '/no/such.jsonl'"),
    (["--config.model.guide_checkpoint="], "set model.guide_checkpoint or guide.sft_data"),
    (["--config.prompts.solver=/no/such/solver.txt"], "prompts.solver: file"),
    (["--config.prompts.guide=/no/such/guide.txt"], "prompts.guide: file"),
    (["--config.targets.source=file"], "targets.path is required"),
    (["--config.targets.source=file", "--config.targets.path=/no/such/targets.json"], "targets.path: file '/no/such/targets.json'"),
    (["--config.verify.backend=nope"], "verify.backend.*unknown verification backend 'nope'"),
    (["--config.verify.backend=lean", "--config.verify.options.bogus=1"], "verify.backend / verify.options: backend 'lean' takes no option bogus"),
    (["--config.verify.backend=remote"], "verify.options.*needs option url"),
    (["--config.solver_train.pack_length=-1"], "solver_train.pack_length must be >= 0"),
    (["--config.model.layer_loop=python"], "model.layer_loop"),
    (["--config.conjecturer_train.pack_length=512"], "conjecturer_train.pack_length \\(512\\) must be 0 \\(no packing\\) or at least the role's longest training sequence \\(640 tokens\\)"),
]


@pytest.mark.parametrize("overrides,match", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_values_fail_with_the_field_name(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(TESTBED, overrides)


@pytest.mark.parametrize("overrides", [
    ["--config.model.checkpoint=deepseek-ai/DeepSeek-Prover-V2-7B"],  # a hub id: checked when loaded
    ["--config.verify.backend=lean", "--config.verify.options.workers=2", "--config.verify.options.timeout_s=5.0"],
    ["--config.verify.backend=remote", "--config.verify.options.url=http://localhost:1"],
    ["--config.targets.limit=0", "--config.run.log_examples=0"],
    ["--config.model.layer_loop=scan"],
])
def test_good_values_pass(overrides):
    load_config(TESTBED, overrides)


@pytest.mark.parametrize("overrides,field", [
    (["--config.run.keep_checkpoints=0"], "run.keep_checkpoints"),
    (["--config.model.checkpoint=/no/such/model"], "model.checkpoint"),
    (["--config.verify.backend=nope"], "verify.backend"),
    (["--config.verify.options.bogus=1"], "verify.options"),  # `prop` takes **options: checked when built, still before any write
    (["--config.targets.limit=-1"], "targets.limit"),
    (["--config.run.iterations=three"], "--config.run.iterations"),  # a type error, from the flag parser
    (["--config.run.nope=1"], "unknown config field 'run.nope'"),  # an unknown field
    (["--config.solver_train.lr=fast"], "--config.solver_train.lr"),
    (["--set", "run.iterations=3"], "--set is retired: write --config.run.iterations=3"),
    (["--bogus=1"], "Unknown command line flag 'bogus'"),
    (["stray"], "unexpected argument 'stray'"),
])
def test_cli_bad_config_exits_2_and_creates_nothing(overrides, field, tmp_path, capsys):
    """sgs-train itself: the error is one line naming the field or flag, nothing is created."""
    from sgs_jax.cli import train

    workdir = tmp_path / "run"
    assert train.main(["--config", TESTBED, f"--config.run.workdir={workdir}", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sgs-train: ") and field in err[0], err
    assert not workdir.exists()


def test_cli_help_and_missing_config(capsys):
    from sgs_jax.cli import train

    assert train.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--config.run.iterations=3" in out and "--allow-config-change" in out and "--progress" in out
    assert train.main(["--config.run.iterations=3"]) == 2
    assert "--config FILE.py[:PRESET] is required" in capsys.readouterr().err


def test_missing_file_and_recorded_copy(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config("configs/nope.py")
    cfg = load_config(TESTBED)
    path = record_config(cfg, tmp_path)
    assert json.load(open(path))["run"]["iterations"] == 10


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))))
def test_every_experiment_config_and_preset_validates(path):
    if path.endswith(("__init__.py", "base.py", "presets.py")):
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("cfg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for preset in getattr(module, "PRESETS", ("",)):
        load_config(f"{path}:{preset}" if preset else path)


def test_cispo_learning_rate_is_a_third_in_every_preset():
    for preset, expected in (("paper", 1e-6), ("testbed", 1e-4)):
        cfg = load_config(os.path.join(ROOT, f"configs/cispo_sgs.py:{preset}"))
        assert abs(cfg.solver_train.lr - expected) < 1e-12 and cfg.solver_train.batch_size == 64


def test_base_without_a_checkpoint_is_rejected():
    with pytest.raises(ConfigError, match="model.checkpoint"):
        load_config(os.path.join(ROOT, "configs/base.py"))


# ---- the recorded config of a run directory ----------------------------------------------
def test_resume_with_the_same_config_a_moved_directory_and_another_cache(tmp_path):
    cfg = load_config(TESTBED, [f"--config.run.workdir={tmp_path / 'a'}"])
    assert check_resume(tmp_path, cfg) == []  # a new run: nothing recorded
    record_config(cfg, tmp_path)
    assert check_resume(tmp_path, cfg) == []
    moved = load_config(TESTBED, [f"--config.run.workdir={tmp_path / 'b'}"])
    assert check_resume(tmp_path, moved) == []  # the directory is not part of the run's identity
    cached = load_config(TESTBED, [f"--config.run.compile_cache_dir={tmp_path / 'shared'}"])
    assert check_resume(tmp_path, cached) == []  # nor where its compiled programs are cached


def test_every_differing_field_is_named_and_nothing_is_written(tmp_path):
    record_config(load_config(TESTBED), tmp_path)
    before = (tmp_path / "config.json").read_bytes()
    changed = load_config(TESTBED, ["--config.run.iterations=20", "--config.solver_train.lr=1e-3", "--config.verify.options.workers=3"])
    with pytest.raises(ConfigError) as err:
        check_resume(tmp_path, changed)
    message = str(err.value)
    for line in ("run.iterations: recorded 10, now 20", "solver_train.lr: recorded 0.0003, now 0.001",
                 "verify.options.workers: recorded '<absent>', now 3"):
        assert line in message
    assert "3 fields differ" in message and "new run directory" in message
    assert (tmp_path / "config.json").read_bytes() == before
    with pytest.raises(ConfigError, match="allow it with --allow-config-change run.iterations"):
        check_resume(tmp_path, load_config(TESTBED, ["--config.run.iterations=20"]))


def test_allowed_changes_are_recorded_not_silent(tmp_path):
    record_config(load_config(TESTBED), tmp_path)
    longer = load_config(TESTBED, ["--config.run.iterations=20", "--config.run.keep_checkpoints=3"])
    changes = check_resume(tmp_path, longer, allow=["run.iterations", "run.keep_checkpoints"])
    assert [str(c) for c in changes] == ["run.iterations: recorded 10, now 20", "run.keep_checkpoints: recorded 2, now 3"]
    record_config(longer, tmp_path, changes, from_iteration=7)
    assert json.load(open(tmp_path / "config.json"))["run"]["iterations"] == 20
    (record,) = [json.loads(line) for line in open(tmp_path / "config_changes.jsonl")]
    assert record["from_iteration"] == 7
    assert record["changes"]["run.iterations"] == {"recorded": 10, "new": 20}
    assert check_resume(tmp_path, longer) == []


def test_a_setting_added_since_the_run_began_resumes_only_at_its_default(tmp_path):
    record_config(load_config(TESTBED), tmp_path)
    recorded = json.load(open(tmp_path / "config.json"))
    del recorded["solver_train"]["pack_length"]  # as if recorded by code older than these settings
    del recorded["model"]["attention"]
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    assert check_resume(tmp_path, load_config(TESTBED)) == []  # both hold their defaults (0, "auto")
    with pytest.raises(ConfigError, match="solver_train.pack_length: recorded '<absent>', now 1024") as err:
        check_resume(tmp_path, load_config(TESTBED, ["--config.solver_train.pack_length=1024"]))
    assert "(1 field differs)" in str(err.value)


def test_only_safe_fields_may_be_allowed(tmp_path):
    record_config(load_config(TESTBED), tmp_path)
    with pytest.raises(ConfigError, match="solver_train.lr cannot change on resume"):
        check_resume(tmp_path, load_config(TESTBED, ["--config.solver_train.lr=1e-3"]), allow=["solver_train.lr"])
    assert "run.iterations" in SAFE_ON_RESUME


def test_unreadable_recorded_config_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text('{"run": {"iter', encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot be read"):
        check_resume(tmp_path, load_config(TESTBED))


def test_config_diff_sees_added_and_removed_fields():
    cfg = load_config(TESTBED, ["--config.run.log_examples=7"])
    recorded = cfg.to_dict()
    recorded["solver_train"]["epochs"] = 1  # a setting that no longer exists
    del recorded["run"]["log_examples"]  # one that did not exist yet, now away from its default (4)
    fields = {c.field: c for c in config_diff(recorded, cfg)}
    assert set(fields) == {"solver_train.epochs", "run.log_examples"}
    assert fields["solver_train.epochs"].new == "<absent>" and fields["run.log_examples"].recorded == "<absent>"
    validate(cfg)


def test_a_setting_removed_from_the_code_is_named_as_removed_on_resume(tmp_path):
    record_config(load_config(TESTBED), tmp_path)
    recorded = json.load(open(tmp_path / "config.json"))
    recorded["solver_train"]["epochs"] = 1  # as if recorded by code that had this setting
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    with pytest.raises(ConfigError) as err:
        check_resume(tmp_path, load_config(TESTBED))
    message = str(err.value)
    assert "solver_train.epochs: recorded 1, now '<absent>'" in message
    assert "solver_train.epochs: no longer a setting of this code; resume with the code that started the run" in message


def test_cispo_batch_must_hold_whole_groups():
    with pytest.raises(ConfigError, match="sgs.proofs_per_problem"):
        load_config(os.path.join(ROOT, "configs/cispo_sgs.py:testbed"), ["--config.solver_train.batch_size=36", "--config.solver_train.micro_batch_size=4"])


def test_cispo_takes_its_normalisation_from_the_cispo_section_only():
    cispo = os.path.join(ROOT, "configs/cispo_sgs.py:testbed")
    with pytest.raises(ConfigError, match="cispo.normalization"):
        load_config(cispo, ["--config.solver_train.normalization=sequence"])
    load_config(cispo, ["--config.cispo.normalization=group_tokens"])
    load_config(TESTBED, ["--config.solver_train.normalization=sequence"])  # REINFORCE½ takes it


def test_sgs_plan_takes_the_config_flags(capsys):
    """sgs-plan --aot reads overrides as sgs-train does; the config is checked before any compile."""
    from sgs_jax.cli import plan as plan_cli

    base = ["--aot", "cpu:8", "--config", os.path.join(ROOT, "configs/sgs.py:paper")]
    assert plan_cli.main(base + ["--config.solver_train.no_such_field=1"]) == 2
    assert "unknown config field 'solver_train.no_such_field'" in capsys.readouterr().err
    assert plan_cli.main(base + ["--config.run.iterations", "zero"]) == 2
    assert "run.iterations" in capsys.readouterr().err
    assert plan_cli.main(base + ["--set", "run.iterations=2"]) == 2
    assert "--set is retired: write --config.run.iterations=2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plan_cli.main(base + ["--bogus"])


def test_the_run_config_chooses_the_layer_loop():
    """`model.layer_loop` reaches the models a run loads and the plans it prints."""
    from sgs_jax.sgs.bootstrap import load_model
    from sgs_jax.sgs.plan import plan_model_config

    cfg = load_config(TESTBED, ["--config.model.layer_loop=scan"])
    assert load_model(cfg, cfg.model.checkpoint, None).config.layer_loop == "scan"
    assert plan_model_config(cfg)[0].layer_loop == "scan"
    assert load_model(load_config(TESTBED, []), cfg.model.checkpoint, None).config.layer_loop == "auto"


def test_the_model_settings_offer_the_model_configs_choices():
    """The run config lists `ModelConfig`'s choices without importing JAX; they must agree."""
    from sgs_jax.config import _CHOICES
    from sgs_jax.models.config import ATTENTION_IMPLEMENTATIONS, LAYER_LOOPS, REMAT_POLICIES

    assert _CHOICES["model.remat_policy"] == REMAT_POLICIES
    assert _CHOICES["model.attention"] == ATTENTION_IMPLEMENTATIONS
    assert _CHOICES["model.layer_loop"] == LAYER_LOOPS
