"""Run checkpoints with orbax: role parameters (and optimizer state) plus loop metadata.

A checkpoint at step N holds everything needed to resume after iteration N: one pytree
per trainable role and a JSON `meta` item (iteration, generation counter, RNG seed state,
anything small). The target set and the verification cache are saved by their owners next
to it (they are JSON files, written atomically). Restores are sharded like the abstract
targets given, so a run resumes on its mesh without a host copy of the model.

A checkpoint that fails to restore (corrupted or half written) is reported and skipped in
favour of the newest one before it, so a crash during a save loses one iteration, never
the run.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class CheckpointRestoreError(RuntimeError):
    """No checkpoint in the directory could be restored."""


class RunCheckpointer:
    """Save and restore `{name: pytree}` plus a JSON `meta` dict per step."""

    def __init__(self, directory: str | os.PathLike, keep: int = 2):
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, trees: dict[str, Any], meta: dict[str, Any]) -> None:
        """Write step `step` (blocking, so a preemption right after cannot lose it)."""
        items = {name: ocp.args.StandardSave(tree) for name, tree in trees.items()}
        items["meta"] = ocp.args.JsonSave(meta)
        self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        self._manager.wait_until_finished()

    def restore_latest(self, abstract_trees: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """(step, trees, meta) of the newest restorable checkpoint, or None when there is none.

        abstract_trees: {name: pytree of jax.ShapeDtypeStruct with shardings} giving the
        structure, dtypes and placement to restore into.
        """
        steps = self.steps()
        if not steps:
            return None
        errors = []
        for step in reversed(steps):
            try:
                trees, meta = self._restore(step, abstract_trees)
            except Exception as err:  # orbax raises many types for damaged files
                log.warning("checkpoint step %d in %s cannot be restored (%s); trying an older one", step, self.directory, err)
                errors.append(f"step {step}: {type(err).__name__}: {err}")
                continue
            return step, trees, meta
        raise CheckpointRestoreError(f"no checkpoint in {self.directory} could be restored: " + "; ".join(errors))

    def restore(self, step: int, abstract_trees: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(trees, meta) of step `step`; only the items named in `abstract_trees` are read
        (e.g. one role's weights without the optimizer states). Raises
        CheckpointRestoreError when the step is not saved or cannot be restored."""
        steps = self.steps()
        if step not in steps:
            raise CheckpointRestoreError(f"no checkpoint of step {step} in {self.directory}; saved steps: {steps}")
        try:
            return self._restore(step, abstract_trees)
        except Exception as err:  # orbax raises many types for damaged files
            raise CheckpointRestoreError(f"checkpoint step {step} in {self.directory} cannot be restored: {type(err).__name__}: {err}") from err

    def _restore(self, step: int, abstract_trees: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        items = {name: ocp.args.StandardRestore(tree) for name, tree in abstract_trees.items()}
        items["meta"] = ocp.args.JsonRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        return {name: restored[name] for name in abstract_trees}, dict(restored["meta"])

    def close(self) -> None:
        self._manager.close()
