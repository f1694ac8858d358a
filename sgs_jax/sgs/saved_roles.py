"""A role's weights at a saved iteration of a run, for evaluation (`sgs-eval`) and export
(`sgs-export`, and a run's own exports every `run.export_every` iterations).

    cfg = load_run_config(run_dir)                                  # the run's config.json
    model, iteration = load_role(run_dir, "solver", None, mesh)    # newest checkpoint
    write_export(model, tokenizer, out, export_record(cfg, run_dir, "solver", iteration, model.config.param_dtype))

Iteration N is the checkpoint written after N completed iterations (the numbering of
`metrics.jsonl`); iteration 0 is where the run started, the base checkpoint, for Solver and
Conjecturer alike. The Guide is frozen, so it is the run's Guide checkpoint at every
iteration.

A checkpoint is restored into the abstract state of the base checkpoint's architecture in
the run's dtypes, sharded by the same logical-axis rules as the run's trainers: the same
pytree the run saved. Only the asked role's item is read (no optimizer state, no other
role), so exporting a 7B Solver needs the memory of one model.
"""

from __future__ import annotations

import glob
import json
import os
import shutil

import jax
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from sgs_jax.checkpoint import RunCheckpointer
from sgs_jax.config import with_defaults
from sgs_jax.faults import fault_point
from sgs_jax.models import Llama, ModelConfig, abstract_model
from sgs_jax.models.hf_io import _resolve_checkpoint_dir
from sgs_jax.parallel import state_shardings
from sgs_jax.sgs import bootstrap
from sgs_jax.sgs.roles import CONJECTURER_FROZEN, CONJECTURER_NONE, CONJECTURER_SHARED, conjecturer_weights

ROLES = ("solver", "conjecturer", "guide")
EXPORT_INFO = "sgs_export.json"  # what was exported, written next to the weights
# An export is written to OUT + _STAGING + pid, then renamed to OUT; an earlier export it
# replaces is moved to OUT + _REPLACED + pid first and deleted after.
_STAGING = ".partial-"
_REPLACED = ".replaced-"


class RunDirError(ValueError):
    """A run directory lacks what was asked (its config, a role, a saved iteration)."""


def load_run_config(run_dir: str | os.PathLike) -> ConfigDict:
    """The resolved config a run wrote to `run_dir/config.json`, with the settings added to
    the code since then at their defaults (`config.with_defaults`)."""
    path = os.path.join(os.fspath(run_dir), "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)
    except FileNotFoundError:
        raise RunDirError(f"{os.fspath(run_dir)!r} is not a run directory: it has no config.json") from None
    except (OSError, json.JSONDecodeError) as err:
        raise RunDirError(f"cannot read {path}: {err}") from err
    if not isinstance(recorded, dict):
        raise RunDirError(f"{path} holds a JSON {type(recorded).__name__}, not a run's config")
    return ConfigDict(with_defaults(recorded))


def saved_iterations(run_dir: str | os.PathLike) -> list[int]:
    """Iterations with a checkpoint in the run directory, oldest first."""
    directory = os.path.join(os.fspath(run_dir), "checkpoints")
    if not os.path.isdir(directory):
        return []
    checkpointer = RunCheckpointer(directory)
    try:
        return checkpointer.steps()
    finally:
        checkpointer.close()


def checkpoint_item(cfg, role: str) -> str | None:
    """The run-checkpoint item holding `role`'s weights; None when the role never trains
    (a frozen Conjecturer keeps the base weights). Raises RunDirError for a role the
    experiment does not have."""
    if role == "solver":
        return "solver"
    if role != "conjecturer":
        raise ValueError(f"role {role!r} has no weights in the run checkpoints (trained roles: solver, conjecturer)")
    kind = conjecturer_weights(cfg)
    if kind == CONJECTURER_NONE:
        raise RunDirError(f"experiment {cfg.experiment!r} has no Conjecturer (sgs.use_conjecturer is False)")
    if kind == CONJECTURER_FROZEN:
        return None
    return "solver" if kind == CONJECTURER_SHARED else "conjecturer"


def abstract_role_state(cfg, mesh: Mesh) -> tuple[nnx.GraphDef, nnx.State]:
    """Graph definition and shape-and-sharding structs of one trained role's parameters,
    as the run's trainers hold them (no memory is allocated)."""
    config = ModelConfig.from_hf_file(
        _resolve_checkpoint_dir(cfg.model.checkpoint),
        dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype, remat_policy=cfg.model.remat_policy,
    )
    graphdef, abstract = abstract_model(config)
    shardings = state_shardings(abstract, mesh)
    abstract = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    return graphdef, abstract


def load_role(run_dir: str | os.PathLike, role: str, iteration: int | None, mesh: Mesh) -> tuple[Llama, int]:
    """(model, iteration) of `role` after `iteration` completed iterations of the run in
    `run_dir` (None: the newest checkpoint; 0: the starting weights)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
    run_dir = os.fspath(run_dir)
    cfg = load_run_config(run_dir)
    steps = saved_iterations(run_dir)
    if iteration is None:
        if not steps:
            raise RunDirError(f"{run_dir} has no checkpoint yet (iteration 0, the starting weights, needs no checkpoint)")
        iteration = steps[-1]
    if iteration != 0 and iteration not in steps:
        raise RunDirError(f"iteration {iteration} is not saved in {run_dir}; saved iterations: {steps} (0 = the starting weights)")
    if role == "guide":
        return _load_guide(cfg, run_dir, mesh), iteration
    item = checkpoint_item(cfg, role)
    if iteration == 0 or item is None:
        return bootstrap.load_model(cfg, cfg.model.checkpoint, mesh), iteration
    graphdef, abstract = abstract_role_state(cfg, mesh)
    checkpointer = RunCheckpointer(os.path.join(run_dir, "checkpoints"), keep=cfg.run.keep_checkpoints)
    try:
        trees, _ = checkpointer.restore(iteration, {item: abstract})
    finally:
        checkpointer.close()
    return nnx.merge(graphdef, trees[item]), iteration


def _load_guide(cfg, run_dir: str, mesh: Mesh) -> Llama:
    if not cfg.sgs.use_guide:
        raise RunDirError(f"experiment {cfg.experiment!r} has no Guide (sgs.use_guide is False)")
    path = bootstrap.guide_path(cfg, run_dir)
    if not cfg.model.guide_checkpoint and not os.path.exists(os.path.join(path, "config.json")):
        raise RunDirError(f"the Guide stage of {run_dir} has not finished: no Guide checkpoint in {path}")
    return bootstrap.load_model(cfg, path, mesh)


# ---- exports ------------------------------------------------------------------------------
def export_record(cfg, run_dir: str | os.PathLike, role: str, iteration: int, dtype: str) -> dict:
    """What an export holds (its sgs_export.json): the run, experiment, role, iteration,
    stored dtype and the base checkpoint the run started from."""
    return {
        "run": os.path.abspath(os.fspath(run_dir)),
        "experiment": cfg.experiment,
        "role": role,
        "iteration": int(iteration),
        "dtype": dtype,
        "base_checkpoint": cfg.model.checkpoint,
    }


def check_export_dir(out: str | os.PathLike, overwrite: bool) -> None:
    """Raise ValueError unless `out` is absent, empty, or (with `overwrite`) an earlier export."""
    out = os.fspath(out)
    if not os.path.isdir(out) or not os.listdir(out):
        if os.path.exists(out) and not os.path.isdir(out):
            raise ValueError(f"{out} exists and is not a directory")
        return
    if not overwrite:
        raise ValueError(f"{out} is not empty; pass --overwrite to replace what is there")
    if not os.path.exists(os.path.join(out, EXPORT_INFO)):
        raise ValueError(f"{out} holds no earlier export (no {EXPORT_INFO}); refusing to replace it")


def write_export(model: Llama, tokenizer, out: str | os.PathLike, record: dict, max_shard_bytes: int = 4 << 30,
                 overwrite: bool = False) -> str:
    """Write `model` (+ `tokenizer` and its chat template) as a Hugging Face checkpoint in
    `out`, with `record` as sgs_export.json; returns the absolute path.

    Atomic for a reader of `out`: the files go to a staging directory beside it, renamed to
    `out` once complete, so a process killed mid-export leaves `out` absent (or holding
    the previous complete export), never half written; stale staging directories of `out`
    are removed by the next export to it. `overwrite` replaces an earlier export
    (`check_export_dir`). Every process calls this on multi-host runs; process 0 writes.
    """
    from sgs_jax.models import save_hf

    out = os.path.abspath(os.fspath(out))
    check_export_dir(out, overwrite)
    writer = jax.process_index() == 0
    staging = f"{out}{_STAGING}{os.getpid()}"
    if writer:
        for stale in glob.glob(glob.escape(out + _STAGING) + "*") + glob.glob(glob.escape(out + _REPLACED) + "*"):
            shutil.rmtree(stale, ignore_errors=True)
    save_hf(model, staging, max_shard_bytes=max_shard_bytes, tokenizer=tokenizer)
    if not writer:
        return out
    with open(os.path.join(staging, EXPORT_INFO), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
    fault_point("export", out)
    replaced = None
    if os.path.isdir(out):
        if os.listdir(out):
            replaced = f"{out}{_REPLACED}{os.getpid()}"
            os.rename(out, replaced)
        else:
            os.rmdir(out)
    os.rename(staging, out)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    return out
