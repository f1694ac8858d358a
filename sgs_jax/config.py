"""Loading, overriding, validating and recording experiment configs.

A config is named `FILE.py[:PRESET]` (e.g. `configs/sgs.py:testbed`); the file's
`get_config(preset)` returns an `ml_collections.ConfigDict`. Command lines set fields the
way `ml_collections.config_flags` does (absl flags): `--config configs/sgs.py:testbed
--config.run.iterations=3 --config.solver_train.lr=1e-6`, each value parsed by its field's
type; programs write such flags with `flag_args`. Bad values fail here, before any work
starts: an unknown field or a mistyped value names the flag, and `validate` checks every
choice, range and path and names the field.

A run records its config as `config.json` in its directory. Resuming with a different
config is refused (`check_resume` names every differing field) unless each change is
explicitly allowed and in `SAFE_ON_RESUME`, the fields that change no number the run has
produced or will produce; an allowed change rewrites `config.json` and is appended to
`config_changes.jsonl`. These functions take a ConfigDict, whatever parsed the overrides.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import os
import re
import time
from typing import Any, Callable, Mapping, Sequence

from absl import flags
from ml_collections import ConfigDict, config_dict, config_flags

from configs.base import get_config as base_config
from sgs_jax import jsonl

_CHOICES = {
    "targets.source": ("testbed", "file", "hub"),
    "model.dtype": ("float32", "bfloat16"),
    "model.param_dtype": ("float32", "bfloat16"),
    "model.remat_policy": ("none", "full", "dots", "offload"),
    "model.attention": ("auto", "native", "blockwise", "xla", "cudnn", "splash"),
    "model.layer_loop": ("auto", "scan", "unrolled"),
    "sampling.weights_dtype": ("float32", "bfloat16"),
    "sampling.weights_layout": ("inference", "training"),
    "sampling.paged_attention": ("auto", "native", "gather", "pallas_tpu", "pallas_gpu"),
    "roles.placement": ("shared", "split"),
    "sgs.solver_objective": ("reinforce_half", "cispo", "expert_iteration"),
    "solver_train.normalization": ("batch_tokens", "sequence"),
    "conjecturer_train.normalization": ("batch_tokens", "sequence"),
    "cispo.normalization": ("batch_tokens", "group_tokens"),
}
_POSITIVE = (
    "run.iterations", "run.checkpoint_every", "targets.max_proofs", "sampling.solver_max_total_len",
    "sampling.conjecturer_max_new_tokens", "sampling.guide_max_new_tokens", "sampling.max_batch",
    "sampling.kv_pool_tokens", "sampling.page_size",
    "sgs.conjectures_per_target", "sgs.proofs_per_problem", "solver_train.lr", "solver_train.batch_size",
    "solver_train.micro_batch_size", "solver_train.min_bucket", "conjecturer_train.lr", "conjecturer_train.batch_size",
    "conjecturer_train.micro_batch_size", "conjecturer_train.min_bucket", "run.keep_checkpoints", "sgs.ei_buffer_iterations",
)
_NON_NEGATIVE = ("targets.limit", "run.log_examples", "run.export_every", "roles.guide_devices",
                 "roles.conjecturer_devices", "solver_train.pack_length", "conjecturer_train.pack_length")
# Fields a resumed run may change with --allow-config-change: they change how long the run
# goes, how often it saves or exports, what it keeps, how many workers verify and how the
# sampler pages its KV cache (tokens do not depend on pool or page size), never a result
# (the step-0 measurement is made only when a run starts).
SAFE_ON_RESUME = ("run.iterations", "run.checkpoint_every", "run.keep_checkpoints", "run.log_examples",
                  "run.export_every", "run.base_solve_rate", "verify.options.workers",
                  "sampling.kv_pool_tokens", "sampling.page_size")
# Not part of a run's identity: a run directory may be moved, and its compiled programs
# cached anywhere (the cache key covers the program, so a hit computes the same).
_NOT_COMPARED = ("run.workdir", "run.compile_cache_dir")
CONFIG_NAME = "config.json"
CHANGES_NAME = "config_changes.jsonl"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
CONFIG_FLAG = "config"  # --config FILE.py[:PRESET], then --config.FIELD=VALUE overrides
_OVERRIDE = re.compile(rf"^--?(?:no)?{CONFIG_FLAG}\.([^=\s]+)")
# Free-form mappings: an override may add an entry (backend keyword options, which
# `validate` checks against the backend's constructor).
_FREE_FORM = ("verify.options",)
# Retired flags -> the field their value sets (--set names its own).
_RETIRED = {"--set": "", "--workdir": "run.workdir", "--iterations": "run.iterations"}


class ConfigError(ValueError):
    """A config file, preset, override or value is invalid."""


def _get(cfg: ConfigDict, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def definition_function(path: str, name: str, kind: str) -> Callable[..., Any]:
    """Function `name` of the Python file at `path` (a config or experiment file), the file
    run as a module of its own. Raises ConfigError naming the `kind` of file when the file
    or the function is missing."""
    if not os.path.isfile(path):
        raise ConfigError(f"{kind} {path!r} not found")
    module_spec = importlib.util.spec_from_file_location(f"sgs_definition_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not callable(getattr(module, name, None)):
        raise ConfigError(f"{path} defines no {name}()")
    return getattr(module, name)


def _config_from_file(spec: str) -> ConfigDict:
    """`get_config(PRESET)` (or `get_config()`) of the config file in `FILE.py[:PRESET]`, locked:
    no field can be added, so an override can only set a field that exists."""
    path, _, preset = spec.partition(":")
    get_config = definition_function(path, "get_config", "config file")
    try:
        cfg = get_config(preset) if preset else get_config()
    except (KeyError, ValueError) as err:
        raise ConfigError(f"{spec}: {err}") from err
    if not isinstance(cfg, ConfigDict):
        raise ConfigError(f"{path}: get_config() returned {type(cfg).__name__}, not an ml_collections ConfigDict")
    cfg.lock()
    return cfg


def override_names(args: Sequence[str]) -> list[str]:
    """The fields that `--config.FIELD[=VALUE]` flags in `args` set, in order (the rule
    `ml_collections.config_flags` uses: `--config.a.b=1`, `--config.a.b 1`, `--noconfig.flag`)."""
    return [m.group(1) for m in map(_OVERRIDE.match, args) if m]


def flag_args(overrides: Sequence[tuple[str, Any]] | Mapping[str, Any]) -> list[str]:
    """The `--config.FIELD=VALUE` flags that set each field to a Python value: the one
    way a program writes overrides (str as is, bool as true/false, others by repr, which
    config_flags parses back: numbers, and tuples and dicts as literals)."""
    items = overrides.items() if isinstance(overrides, Mapping) else overrides
    out = []
    for key, value in items:
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = value
        else:
            text = repr(value)
        out.append(f"--{CONFIG_FLAG}.{key}={text}")
    return out


def retired_flag_error(args: Sequence[str]) -> ConfigError | None:
    """The error for the first retired flag in `args` (the `--set KEY=VALUE` parser and the
    `--workdir` / `--iterations` shortcuts), naming the flag that replaces it; None if none."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name not in _RETIRED:
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if name == "--set":
            key, _, value = value.partition("=")
        else:
            key = _RETIRED[name]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]  # --set took Python literals; the new flags take plain values
        return ConfigError(f"{name} is retired: write --{CONFIG_FLAG}.{key or 'FIELD'}={value or 'VALUE'} "
                           "(ml_collections config flags; docs/runs.md)")
    return None


def _open_fields(cfg: ConfigDict, names: Sequence[str]) -> None:
    """Check that every overridden field exists (ConfigError naming it otherwise), and add
    the entries of free-form mappings (`verify.options`) that an override names."""
    fields = sorted(flatten(_plain(cfg)))
    for name in names:
        parent, _, leaf = name.rpartition(".")
        if parent in _FREE_FORM and leaf not in _get(cfg, parent):
            node = _get(cfg, parent)
            node.unlock()
            node[leaf] = config_dict.placeholder(object)  # any value (a literal, else a string); the backend checks it
            node.lock()
            continue
        try:
            _get(cfg, name)
        except (KeyError, AttributeError, TypeError):
            close = difflib.get_close_matches(name, fields, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"unknown config field {name!r} (flag --{CONFIG_FLAG}.{name}){hint}") from None


def parse_config_flags(argv: Sequence[str], flag_values: flags.FlagValues | None = None) -> tuple[ConfigDict, list[str]]:
    """Parse a command line: `--config FILE.py[:PRESET]`, its `--config.FIELD=VALUE`
    overrides (through `ml_collections.config_flags`, each typed by its field: absl's int,
    float, bool and string parsers) and the program's own absl flags, defined in
    `flag_values` beforehand. argv[0] is the program name.

    Returns (the validated config, the positional arguments left). Raises ConfigError,
    naming the field or flag, for a retired flag, a missing or broken config file, an
    unknown field, a value of the wrong type and anything `validate` rejects.
    """
    argv = list(argv)
    retired = retired_flag_error(argv[1:])
    if retired is not None:
        raise retired
    probe = flags.FlagValues()  # the config file first: its fields decide which overrides exist
    flags.DEFINE_string(CONFIG_FLAG, None, "FILE.py[:PRESET]", flag_values=probe)
    try:
        rest = probe(argv, known_only=True)
    except flags.Error as err:
        raise ConfigError(str(err)) from None
    spec = probe[CONFIG_FLAG].value
    if not spec:
        raise ConfigError(f"--{CONFIG_FLAG} FILE.py[:PRESET] is required, e.g. --{CONFIG_FLAG} configs/sgs.py:testbed")
    cfg = _config_from_file(spec)
    _open_fields(cfg, override_names(rest))
    flag_values = flags.FlagValues() if flag_values is None else flag_values
    config_flags.DEFINE_config_dict(CONFIG_FLAG, cfg, flag_values=flag_values, sys_argv=rest, lock_config=True)
    try:
        positional = flag_values(rest)
    except flags.Error as err:
        raise ConfigError(str(err)) from None
    validate(cfg)
    return cfg, positional[1:]


def load_config(spec: str, overrides: Sequence[str] = ()) -> ConfigDict:
    """The validated config `FILE.py[:PRESET]` with `--config.FIELD=VALUE` overrides:
    exactly what sgs-train parses from the same flags."""
    cfg, positional = parse_config_flags(["load_config", f"--{CONFIG_FLAG}={spec}", *overrides])
    if positional:
        raise ConfigError(f"{positional[0]!r} is not a --{CONFIG_FLAG}.FIELD=VALUE override")
    return cfg


def _check_checkpoint(key: str, value: str) -> None:
    """A local HF checkpoint directory (with config.json) or a hub id `org/name`."""
    if os.path.isdir(value):
        if not os.path.isfile(os.path.join(value, "config.json")):
            raise ConfigError(f"{key}: {value!r} is not a Hugging Face checkpoint (no config.json)")
        return
    first = value.split("/")[0]
    if _HUB_ID.match(value) and not os.path.exists(first):
        return  # a hub id, resolved (or reported) when loaded
    raise ConfigError(f"{key}: {value!r} does not exist")


def _check_file(key: str, value: str) -> None:
    if not os.path.isfile(value):
        raise ConfigError(f"{key}: file {value!r} does not exist")


def validate(cfg: ConfigDict) -> None:
    """Raise ConfigError naming the first bad field (choices, ranges, paths, backend)."""
    from sgs_jax.verify.interface import check_backend_options

    if not str(cfg.run.workdir).strip():
        raise ConfigError("run.workdir must name the run directory, got an empty string")
    for key, choices in _CHOICES.items():
        value = _get(cfg, key)
        if value not in choices:
            raise ConfigError(f"{key} must be one of {choices}, got {value!r}")
    for key in _POSITIVE:
        if not _get(cfg, key) > 0:
            raise ConfigError(f"{key} must be positive, got {_get(cfg, key)!r}")
    for key in _NON_NEGATIVE:
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {_get(cfg, key)!r}")
    if not 0.0 < cfg.sampling.top_p <= 1.0:
        raise ConfigError(f"sampling.top_p must be in (0, 1], got {cfg.sampling.top_p}")
    if cfg.sampling.temperature < 0 or cfg.sampling.top_k < 0:
        raise ConfigError("sampling.temperature and sampling.top_k must be >= 0")
    if cfg.sampling.kv_pool_tokens < cfg.sampling.solver_max_total_len + cfg.sampling.page_size:
        raise ConfigError(f"sampling.kv_pool_tokens ({cfg.sampling.kv_pool_tokens}) cannot hold one Solver row of "
                          f"sampling.solver_max_total_len ({cfg.sampling.solver_max_total_len}) tokens")
    if not 0.0 < cfg.sgs.keep_quantile < 1.0:
        raise ConfigError(f"sgs.keep_quantile must be in (0, 1), got {cfg.sgs.keep_quantile}")
    if not cfg.model.checkpoint:
        raise ConfigError("model.checkpoint must name the base prover checkpoint (the testbed preset names the packaged one)")
    _check_checkpoint("model.checkpoint", cfg.model.checkpoint)
    if cfg.sgs.use_guide or cfg.guide.shadow_score:
        if cfg.model.guide_checkpoint:
            _check_checkpoint("model.guide_checkpoint", cfg.model.guide_checkpoint)
        elif cfg.guide.sft_data:
            _check_file("guide.sft_data", cfg.guide.sft_data)
        else:
            raise ConfigError("with sgs.use_guide or guide.shadow_score, set model.guide_checkpoint or guide.sft_data")
    if cfg.targets.source == "file":
        if not cfg.targets.path:
            raise ConfigError("targets.path is required when targets.source='file'")
        _check_file("targets.path", cfg.targets.path)
    for role, path in cfg.prompts.items():
        if path:
            _check_file(f"prompts.{role}", path)
    try:
        check_backend_options(cfg.verify.backend, cfg.verify.options.to_dict())
    except ValueError as err:
        raise ConfigError(f"verify.backend / verify.options: {err}") from None
    _check_placement(cfg)
    from sgs_jax.sgs.roles import training_lengths  # here: roles imports this module

    for role, longest in zip(("solver_train", "conjecturer_train"), training_lengths(cfg)):
        if cfg[role].batch_size % cfg[role].micro_batch_size:
            raise ConfigError(f"{role}.batch_size must be a multiple of {role}.micro_batch_size")
        if 0 < cfg[role].pack_length < longest:
            raise ConfigError(f"{role}.pack_length ({cfg[role].pack_length}) must be 0 (no packing) or at least "
                              f"the role's longest training sequence ({longest} tokens)")
    if cfg.sgs.solver_objective == "cispo" and cfg.solver_train.batch_size % cfg.sgs.proofs_per_problem:
        # CISPO batches are whole groups of k rollouts (SPEC Section 5).
        raise ConfigError(
            f"solver_train.batch_size ({cfg.solver_train.batch_size}) must be a multiple of "
            f"sgs.proofs_per_problem ({cfg.sgs.proofs_per_problem}) for the cispo objective"
        )
    if cfg.sgs.solver_objective == "cispo" and cfg.solver_train.normalization != "batch_tokens":
        # CISPO has two normalisations (SPEC Section 5), both chosen by cispo.normalization.
        raise ConfigError(
            f"solver_train.normalization={cfg.solver_train.normalization!r} does not apply to the cispo objective; "
            "choose CISPO's normalisation with cispo.normalization (batch_tokens | group_tokens)"
        )


def _check_placement(cfg: ConfigDict) -> None:
    """`roles.placement` / `roles.guide_devices` / `roles.conjecturer_devices`, as far as they
    can be checked without the devices (`sgs.roles.role_meshes` checks the rest: device and
    process counts, batch splits)."""
    r = cfg.roles
    own = {"guide_devices": r.guide_devices, "conjecturer_devices": r.conjecturer_devices}
    if r.placement == "shared":
        for field, count in own.items():
            if count:
                raise ConfigError(f"roles.{field}={count} needs roles.placement='split' (shared: every role uses every "
                                  "device); set it to 0 or set roles.placement=split")
        return
    if not any(own.values()):
        raise ConfigError("roles.placement='split' needs roles.guide_devices or roles.conjecturer_devices positive (the "
                          "devices of the Guide's or the Conjecturer's own sub-mesh)")
    if r.guide_devices and not (cfg.sgs.use_guide or cfg.guide.shadow_score):
        raise ConfigError(f"roles.guide_devices={r.guide_devices} gives the Guide its own devices, but this experiment samples "
                          "no Guide (sgs.use_guide and guide.shadow_score are off); set roles.guide_devices=0")
    if r.conjecturer_devices:
        s = cfg.sgs
        if not s.use_conjecturer:
            raise ConfigError(f"roles.conjecturer_devices={r.conjecturer_devices} gives the Conjecturer its own devices, but "
                              "this experiment has no Conjecturer (sgs.use_conjecturer=False); set roles.conjecturer_devices=0")
        if s.train_conjecturer and cfg.model.parameter_sharing:
            raise ConfigError(f"roles.conjecturer_devices={r.conjecturer_devices}: with model.parameter_sharing the Conjecturer "
                              "is the Solver's own weights, so it cannot live on other devices; set roles.conjecturer_devices=0")
    if cfg.mesh.tensor <= 0:
        raise ConfigError(f"mesh.tensor={cfg.mesh.tensor}: roles.placement='split' needs an explicit tensor size (the "
                          "sub-meshes use it too)")
    for field, count in own.items():
        if count % cfg.mesh.tensor:
            raise ConfigError(f"roles.{field}={count} must be a multiple of mesh.tensor={cfg.mesh.tensor} (a sub-mesh is "
                              "mesh.tensor devices wide)")


def _plain(cfg: ConfigDict | Mapping) -> dict:
    """The config as JSON would give it back (tuples become lists)."""
    data = cfg.to_dict() if isinstance(cfg, ConfigDict) else dict(cfg)
    return json.loads(json.dumps(data, sort_keys=True))


def flatten(data: Mapping, prefix: str = "") -> dict[str, Any]:
    """{dotted field: value} of a nested mapping (an empty mapping has no fields)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def config_hparams(cfg) -> dict[str, bool | int | float | str]:
    """The config as TensorBoard hparams: every field (dotted names; `run.workdir` left
    out, it is no setting), values TensorBoard cannot hold (lists) as JSON text."""
    out = {}
    for name, value in flatten(_plain(cfg)).items():
        if name in _NOT_COMPARED:
            continue
        out[name] = value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
    return out


_ABSENT = "<absent>"


@dataclasses.dataclass(frozen=True)
class FieldChange:
    """One differing field: its value in the recorded config and in the new one
    (`_ABSENT` when a side lacks it)."""

    field: str
    recorded: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.field}: recorded {self.recorded!r}, now {self.new!r}"


def with_defaults(recorded: Mapping) -> dict:
    """A recorded config with every setting it lacks (one added to the code since the run
    began) at its default from `configs/base.py`, so code that reads the new setting gets
    the behaviour the run had. Fields the code no longer has are kept as recorded."""
    return _fill(_plain(recorded), _plain(base_config()))


def _fill(recorded: dict, defaults: dict) -> dict:
    """`recorded` with the keys only `defaults` has added, nested mappings filled alike."""
    out = dict(recorded)
    for key, default in defaults.items():
        if key not in out:
            out[key] = default
        elif isinstance(out[key], dict) and isinstance(default, dict):
            out[key] = _fill(out[key], default)
    return out


def config_diff(recorded: Mapping, cfg: ConfigDict | Mapping) -> list[FieldChange]:
    """Every field whose value differs between a recorded config and `cfg` (sorted;
    `run.workdir` is not compared).

    A field the recorded config lacks (one added to the code since the run began) counts
    as unchanged when `cfg` holds its default (`with_defaults`): a new setting's default
    keeps the behaviour the code had before it (the rule for adding one,
    configs/base.py), so the run is the same run. At any other value it is a change.
    """
    old, new, as_run = flatten(_plain(recorded)), flatten(_plain(cfg)), flatten(with_defaults(recorded))
    changes = []
    for name in sorted(set(old) | set(new)):
        if name in _NOT_COMPARED or as_run.get(name, _ABSENT) == new.get(name, _ABSENT):
            continue
        changes.append(FieldChange(name, old.get(name, _ABSENT), new.get(name, _ABSENT)))
    return changes


def check_resume(directory: str | os.PathLike, cfg: ConfigDict, allow: Sequence[str] = ()) -> list[FieldChange]:
    """The changes from the config recorded in `directory` to `cfg` (empty for a new run).

    Raises ConfigError listing every differing field unless each is named in `allow`;
    `allow` may name only SAFE_ON_RESUME fields. Reads only; writes nothing.
    """
    unsafe = [name for name in allow if name not in SAFE_ON_RESUME]
    if unsafe:
        raise ConfigError(f"--allow-config-change: {', '.join(unsafe)} cannot change on resume (it changes results); "
                          f"fields that can: {', '.join(SAFE_ON_RESUME)}")
    path = os.path.join(directory, CONFIG_NAME)
    if not os.path.exists(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path} cannot be read ({err}); it records this run's config") from None
    changes = config_diff(recorded, cfg)
    refused = [c for c in changes if c.field not in allow]
    if refused:
        lines = "\n".join(f"  {c}" for c in refused)
        hint = (f"allow it with --allow-config-change {','.join(c.field for c in refused)}"
                if all(c.field in SAFE_ON_RESUME for c in refused)
                else "use a new run directory to run a different config")
        removed = [c.field for c in refused if c.new == _ABSENT]
        if removed:  # the code cannot honour a recorded value it has no setting for
            hint = (f"{', '.join(removed)}: no longer a setting of this code; resume with the code that "
                    f"started the run, or {hint}")
        count = f"{len(refused)} fields differ" if len(refused) > 1 else "1 field differs"
        raise ConfigError(f"{directory} holds a run with a different config ({count}):\n{lines}\n{hint}")
    return changes


def _write_json(path: str, data: Any) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # per process: several may write the same file
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def record_config(cfg: ConfigDict, directory: str | os.PathLike, changes: Sequence[FieldChange] = (),
                  **context: Any) -> str:
    """Record the run's config in `directory`: write config.json when there is none, or
    rewrite it for allowed `changes` and append them (with `context`, e.g. the iteration
    they apply from) to config_changes.jsonl. Returns the config path."""
    path = os.path.join(directory, CONFIG_NAME)
    if not os.path.exists(path) or changes:
        _write_json(path, _plain(cfg))
    if changes:
        log = jsonl.Appender(os.path.join(directory, CHANGES_NAME))
        try:
            log.append({"time": time.time(), **context,
                        "changes": {c.field: {"recorded": c.recorded, "new": c.new} for c in changes}})
        finally:
            log.close()
    return path
