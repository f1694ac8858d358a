"""Loading, overriding, validating and recording experiment configs.

A config is named `FILE.py[:PRESET]` (e.g. `configs/sgs.py:testbed`); the file's
`get_config(preset)` returns an `ml_collections.ConfigDict`. Overrides are `a.b=value`
strings typed like the default they replace. Bad values fail here, before any work starts:
`validate` checks every choice, range and path and names the field.

A run records its config as `config.json` in its directory. Resuming with a different
config is refused (`check_resume` names every differing field) unless each change is
explicitly allowed and in `SAFE_ON_RESUME`, the fields that change no number the run has
produced or will produce; an allowed change rewrites `config.json` and is appended to
`config_changes.jsonl`. These functions take a ConfigDict, whatever parsed the overrides.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import re
import time
from typing import Any, Callable, Mapping, Sequence

from ml_collections import ConfigDict

from sgs_jax import jsonl

_CHOICES = {
    "targets.source": ("testbed", "file", "hub"),
    "model.dtype": ("float32", "bfloat16"),
    "model.param_dtype": ("float32", "bfloat16"),
    "model.remat_policy": ("none", "full", "dots"),
    "model.attention": ("auto", "xla", "cudnn", "splash"),
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
    "solver_train.micro_batch_size", "conjecturer_train.lr", "conjecturer_train.batch_size",
    "conjecturer_train.micro_batch_size", "run.keep_checkpoints", "sgs.ei_buffer_iterations",
)
_NON_NEGATIVE = ("targets.limit", "run.log_examples")
# Fields a resumed run may change with --allow-config-change: they change how long the run
# goes, how often it saves, what it keeps, how many workers verify and how the sampler
# pages its KV cache (tokens do not depend on pool or page size), never a result.
SAFE_ON_RESUME = ("run.iterations", "run.checkpoint_every", "run.keep_checkpoints", "run.log_examples",
                  "verify.options.workers", "sampling.kv_pool_tokens", "sampling.page_size")
# Not part of a run's identity: a run directory may be moved.
_NOT_COMPARED = ("run.workdir",)
CONFIG_NAME = "config.json"
CHANGES_NAME = "config_changes.jsonl"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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


def load_config(spec: str, overrides: Sequence[str] = ()) -> ConfigDict:
    """Load `FILE.py[:PRESET]`, apply `key=value` overrides, validate."""
    path, _, preset = spec.partition(":")
    get_config = definition_function(path, "get_config", "config file")
    try:
        cfg = get_config(preset) if preset else get_config()
    except (KeyError, ValueError) as err:
        raise ConfigError(f"{spec}: {err}") from err
    for item in overrides:
        apply_override(cfg, item)
    validate(cfg)
    return cfg


def apply_override(cfg: ConfigDict, item: str) -> None:
    """Set `a.b.c=value`; the value is parsed as a Python literal and must fit the default's type."""
    key, sep, raw = item.partition("=")
    if not sep:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    *parents, leaf = key.strip().split(".")
    node = cfg
    for part in parents:
        if part not in node:
            raise ConfigError(f"unknown config field {key!r}")
        node = node[part]
    if not isinstance(node, ConfigDict) or (leaf not in node and parents[-1:] != ["options"]):
        raise ConfigError(f"unknown config field {key!r}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw  # bare strings
    try:
        node[leaf] = value  # ConfigDict type-checks against the default (int -> float allowed)
    except TypeError as err:
        raise ConfigError(f"{key}: {err}") from None


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
    if cfg.sgs.use_guide:
        if cfg.model.guide_checkpoint:
            _check_checkpoint("model.guide_checkpoint", cfg.model.guide_checkpoint)
        elif cfg.guide.sft_data:
            _check_file("guide.sft_data", cfg.guide.sft_data)
        else:
            raise ConfigError("with sgs.use_guide, set model.guide_checkpoint or guide.sft_data")
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
    for role in ("solver_train", "conjecturer_train"):
        if cfg[role].batch_size % cfg[role].micro_batch_size:
            raise ConfigError(f"{role}.batch_size must be a multiple of {role}.micro_batch_size")
    if cfg.sgs.solver_objective == "cispo" and cfg.solver_train.batch_size % cfg.sgs.proofs_per_problem:
        # CISPO batches are whole groups of k rollouts (SPEC Section 5).
        raise ConfigError(
            f"solver_train.batch_size ({cfg.solver_train.batch_size}) must be a multiple of "
            f"sgs.proofs_per_problem ({cfg.sgs.proofs_per_problem}) for the cispo objective"
        )


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


def config_diff(recorded: Mapping, cfg: ConfigDict | Mapping) -> list[FieldChange]:
    """Every field whose value differs between a recorded config and `cfg` (sorted;
    `run.workdir` is not compared)."""
    old, new = flatten(_plain(recorded)), flatten(_plain(cfg))
    changes = []
    for name in sorted(set(old) | set(new)):
        if name in _NOT_COMPARED:
            continue
        a, b = old.get(name, _ABSENT), new.get(name, _ABSENT)
        if a != b:
            changes.append(FieldChange(name, a, b))
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
        raise ConfigError(f"{directory} holds a run with a different config ({len(refused)} fields differ):\n{lines}\n{hint}")
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
