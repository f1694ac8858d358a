"""A role's weights at a saved iteration of a run, for evaluation (`sgs-eval`) and export (`sgs-export`).

    cfg = load_run_config(run_dir)                                  # the run's config.json
    model, iteration = load_role(run_dir, "solver", None, mesh)    # newest checkpoint

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

import json
import os

import jax
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from sgs_jax.checkpoint import RunCheckpointer
from sgs_jax.models import Llama, ModelConfig, abstract_model
from sgs_jax.models.hf_io import _resolve_checkpoint_dir
from sgs_jax.parallel import state_shardings
from sgs_jax.sgs import bootstrap
from sgs_jax.sgs.roles import CONJECTURER_FROZEN, CONJECTURER_NONE, CONJECTURER_SHARED, conjecturer_weights

ROLES = ("solver", "conjecturer", "guide")


class RunDirError(ValueError):
    """A run directory lacks what was asked (its config, a role, a saved iteration)."""


def load_run_config(run_dir: str | os.PathLike) -> ConfigDict:
    """The resolved config a run wrote to `run_dir/config.json`."""
    path = os.path.join(os.fspath(run_dir), "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return ConfigDict(json.load(f))
    except FileNotFoundError:
        raise RunDirError(f"{os.fspath(run_dir)!r} is not a run directory: it has no config.json") from None
    except (OSError, json.JSONDecodeError) as err:
        raise RunDirError(f"cannot read {path}: {err}") from err


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
