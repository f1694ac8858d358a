"""Loading, overriding, validating and recording experiment configs.

A config is named `FILE.py[:PRESET]` (e.g. `configs/sgs.py:testbed`); the file's
`get_config(preset)` returns an `ml_collections.ConfigDict`. Overrides are `a.b=value`
strings typed like the default they replace. Bad values fail here, before any work starts.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from typing import Any, Callable, Sequence

from ml_collections import ConfigDict

_CHOICES = {
    "targets.source": ("testbed", "file", "hub"),
    "model.dtype": ("float32", "bfloat16"),
    "model.param_dtype": ("float32", "bfloat16"),
    "model.remat_policy": ("none", "full", "dots"),
    "sgs.solver_objective": ("reinforce_half", "cispo", "expert_iteration"),
    "solver_train.normalization": ("batch_tokens", "sequence"),
    "conjecturer_train.normalization": ("batch_tokens", "sequence"),
    "cispo.normalization": ("batch_tokens", "group_tokens"),
}
_POSITIVE = (
    "run.iterations", "run.checkpoint_every", "targets.max_proofs", "sampling.solver_max_total_len",
    "sampling.conjecturer_max_new_tokens", "sampling.guide_max_new_tokens", "sampling.max_batch",
    "sgs.conjectures_per_target", "sgs.proofs_per_problem", "solver_train.lr", "solver_train.batch_size",
    "solver_train.micro_batch_size", "conjecturer_train.lr", "conjecturer_train.batch_size",
    "conjecturer_train.micro_batch_size",
)


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


def validate(cfg: ConfigDict) -> None:
    """Raise ConfigError naming the first bad field."""
    for key, choices in _CHOICES.items():
        value = _get(cfg, key)
        if value not in choices:
            raise ConfigError(f"{key} must be one of {choices}, got {value!r}")
    for key in _POSITIVE:
        if not _get(cfg, key) > 0:
            raise ConfigError(f"{key} must be positive, got {_get(cfg, key)!r}")
    if not 0.0 < cfg.sampling.top_p <= 1.0:
        raise ConfigError(f"sampling.top_p must be in (0, 1], got {cfg.sampling.top_p}")
    if cfg.sampling.temperature < 0 or cfg.sampling.top_k < 0:
        raise ConfigError("sampling.temperature and sampling.top_k must be >= 0")
    if not 0.0 < cfg.sgs.keep_quantile < 1.0:
        raise ConfigError(f"sgs.keep_quantile must be in (0, 1), got {cfg.sgs.keep_quantile}")
    if not cfg.model.checkpoint:
        raise ConfigError("model.checkpoint must name the base prover checkpoint (the testbed preset names the packaged one)")
    if (cfg.sgs.use_guide or cfg.guide.shadow_score) and not (cfg.model.guide_checkpoint or cfg.guide.sft_data):
        raise ConfigError("with sgs.use_guide or guide.shadow_score, set model.guide_checkpoint or guide.sft_data")
    if cfg.targets.source == "file" and not cfg.targets.path:
        raise ConfigError("targets.path is required when targets.source='file'")
    for role in ("solver_train", "conjecturer_train"):
        if cfg[role].batch_size % cfg[role].micro_batch_size:
            raise ConfigError(f"{role}.batch_size must be a multiple of {role}.micro_batch_size")
    if cfg.sgs.solver_objective == "cispo" and cfg.solver_train.batch_size % cfg.sgs.proofs_per_problem:
        # CISPO batches are whole groups of k rollouts (SPEC Section 5).
        raise ConfigError(
            f"solver_train.batch_size ({cfg.solver_train.batch_size}) must be a multiple of "
            f"sgs.proofs_per_problem ({cfg.sgs.proofs_per_problem}) for the cispo objective"
        )


def save_resolved(cfg: ConfigDict, directory: str | os.PathLike) -> str:
    """Write the resolved config as JSON next to the run's logs; returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg.to_dict(), f, indent=2, sort_keys=True)
    return path
