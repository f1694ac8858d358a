"""Run checkpoints with orbax: role parameters (and optimizer state) plus loop metadata,
each verified on restore.

A checkpoint at step N holds everything needed to resume after iteration N: one pytree
per trainable role and a JSON `meta` item (iteration, generation counter, target set,
anything small). Restores are sharded like the abstract targets given, so a run resumes
on its mesh without a host copy of the model.

Integrity. Orbax commits a step atomically (it writes into a temporary directory and
renames it), but it does not notice damaged data: flipped bytes in an array file restore
as NaN or 1e38 without a word. So every save stores, inside `meta`, a 64-bit digest of
each array leaf (computed on device over the bits of the array, independent of its
sharding) and a SHA-256 of the metadata, and refuses to save non-finite floating values
(a diverged run stops instead of checkpointing garbage). A restore recomputes the
digests and checks finiteness; a mismatch is a corrupted checkpoint.

Fallback. A step that cannot be restored (unreadable, truncated, missing files, digest
mismatch, non-finite values) is moved aside to `corrupt-N/` (so saving step N again
works) with one warning line, and the newest good step before it is restored. When no
step can be restored nothing is moved and `CheckpointRestoreError` says so in one line.
"""

from __future__ import annotations

import dataclasses
import errno
import gc
import hashlib
import json
import logging
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from sgs_jax.faults import fault_point

log = logging.getLogger(__name__)

INTEGRITY_KEY = "_integrity"  # reserved key of the saved meta dict
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)
_STORAGE_TEXT = {"no space left": errno.ENOSPC, "disk quota": errno.EDQUOT, "read-only file system": errno.EROFS,
                 "permission denied": errno.EACCES, "file too large": errno.EFBIG}


class CheckpointRestoreError(RuntimeError):
    """No checkpoint in the directory could be restored."""


class CorruptCheckpointError(ValueError):
    """A restored step does not match its recorded digests, or holds non-finite values."""


class NonFiniteWeightsError(ValueError):
    """A tree about to be saved holds NaN or infinite values (training diverged)."""


# ---- digests ---------------------------------------------------------------------------
_U32 = jnp.uint32


def _mix(x):
    """A bijective 32-bit finaliser (murmur3 fmix32): any change of x changes the output."""
    x = x ^ (x >> 16)
    x = x * _U32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * _U32(0xC2B2AE35)
    return x ^ (x >> 16)


def _bits(x: jax.Array) -> jax.Array:
    """The bits of `x` as uint32 words (one per element; two per 64-bit element)."""
    if x.dtype == jnp.bool_:
        return x.astype(_U32)
    width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x, width).astype(_U32)


def _leaf_digest(x: jax.Array) -> jax.Array:
    """uint32[2] digest of one array. Each word is mixed with its global flat index, so the
    digest covers values and positions; sums wrap mod 2^32 and are exact in any order, so
    any sharding gives the same digest."""
    u = _bits(x)
    index = jnp.zeros(u.shape, _U32)
    stride = 1
    for axis in reversed(range(u.ndim)):
        index = index + jax.lax.broadcasted_iota(_U32, u.shape, axis) * _U32(stride % 2**32)
        stride *= u.shape[axis]
    h1 = jnp.sum(_mix(u ^ _mix(index + _U32(0x9E3779B9))), dtype=_U32)
    h2 = jnp.sum(_mix((u + _U32(0x7F4A7C15)) * _U32(0x2545F491) ^ _mix(index ^ _U32(0x632BE5AB))), dtype=_U32)
    return jnp.stack([h1, h2])


def _leaf_finite(x: jax.Array) -> jax.Array:
    return jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.array(True)


_tree_digests = jax.jit(lambda tree: (jax.tree_util.tree_map(_leaf_digest, tree), jax.tree_util.tree_map(_leaf_finite, tree)))


def _host(x: jax.Array) -> np.ndarray:
    """A replicated (possibly multi-host) scalar result on this host."""
    return np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array) else np.asarray(x)


def tree_digests(tree: Any) -> tuple[dict[str, str], list[str]]:
    """({leaf path: 16-hex-digit digest}, [paths of leaves with non-finite values])."""
    digest_tree, finite_tree = _tree_digests(tree)
    flat, _ = jax.tree_util.tree_flatten_with_path(digest_tree)
    finite = jax.tree_util.tree_leaves(finite_tree)
    digests, nonfinite = {}, []
    for (path, digest), finite in zip(flat, finite):
        name = jax.tree_util.keystr(path)
        words = _host(digest).astype(np.uint64)
        digests[name] = f"{int(words[0]) << 32 | int(words[1]):016x}"
        if not bool(_host(finite)):
            nonfinite.append(name)
    return digests, nonfinite


def meta_digest(meta: dict[str, Any]) -> str:
    """SHA-256 of the metadata's canonical JSON (what a JSON round trip preserves)."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


# ---- the meta item, with the mid-checkpoint fault point --------------------------------
class _MetaHandler(ocp.JsonCheckpointHandler):
    """orbax's JSON handler; `finalize` runs after every item is written into the step's
    temporary directory and before the step is renamed into place (committed)."""

    def finalize(self, directory) -> None:
        super().finalize(directory)
        fault_point("checkpoint", directory)


@ocp.args.register_with_handler(_MetaHandler, for_save=True)
@dataclasses.dataclass
class _MetaSave(ocp.args.JsonSave):
    pass


@ocp.args.register_with_handler(_MetaHandler, for_restore=True)
@dataclasses.dataclass
class _MetaRestore(ocp.args.JsonRestore):
    pass


def _short(err: BaseException, limit: int = 160) -> str:
    """The first line of an error, cut to `limit` characters (TensorStore errors run to
    dozens of lines of spec dump)."""
    text = str(err).split(" See full TensorStore details")[0].strip().splitlines()
    first = text[0] if text else type(err).__name__
    return (first[: limit - 3] + "...") if len(first) > limit else first


def _is_aborted_io_noise(exc: BaseException | None, where: object = None) -> bool:
    """The echo of a failed orbax read or write, already reported by its caller: when one
    array fails, orbax closes its event loop while TensorStore finishes the others, whose
    callbacks then raise "Event loop is closed"; un-awaited read coroutines are reported
    when collected; orbax's worker threads log the failure with a full traceback."""
    text = f"{exc!r} {where!r}"
    return "Event loop is closed" in text or "_read_array_index" in text or "orbax" in text


class _AbortedIoLogFilter(logging.Filter):
    """Drops orbax's worker-thread reports of a failed read or write (absl logger) and
    asyncio's "exception was never retrieved" for its abandoned gather futures."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        text = record.getMessage()
        if record.name == "absl":
            return not ("raised an exception" in text and "_SignalingThread" in text)
        error = record.exc_info[1] if record.exc_info else None
        return not ("exception was never retrieved" in text and ("OCDBT" in f"{text} {error}" or "orbax" in text))


_noise_filtered = False


def _filter_aborted_io_noise() -> None:
    """Keep the echoes of a failed save or restore (dozens of tracebacks from orbax and
    TensorStore threads, some after the failure was reported) off the terminal; the
    caller reports the failure in one line. Process-wide and idempotent; it drops nothing
    else."""
    global _noise_filtered
    if _noise_filtered:
        return
    _noise_filtered = True
    for name in ("absl", "asyncio"):
        logging.getLogger(name).addFilter(_AbortedIoLogFilter())
    unraisable, excepthook = sys.unraisablehook, sys.excepthook

    def quiet_unraisable(info):
        if _is_aborted_io_noise(info.exc_value, info.object):
            log.debug("after a failed checkpoint read or write: %r", info.exc_value)
            return
        unraisable(info)

    def quiet_excepthook(kind, value, tb):
        if isinstance(value, RuntimeError) and "Event loop is closed" in str(value):
            return
        excepthook(kind, value, tb)

    sys.unraisablehook, sys.excepthook = quiet_unraisable, quiet_excepthook


def storage_errno(err: BaseException) -> int | None:
    """The errno of a storage failure (disk full, read-only, permissions) anywhere in an
    exception's chain or text, or None when the failure is something else."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _STORAGE_ERRNOS:
            return err.errno
        text = str(err).lower()
        for phrase, code in _STORAGE_TEXT.items():
            if phrase in text:
                return code
        err = err.__cause__ or err.__context__
    return None


class RunCheckpointer:
    """Save and restore `{name: pytree}` plus a JSON `meta` dict per step, verified."""

    def __init__(self, directory: str | os.PathLike, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = os.path.abspath(os.fspath(directory))
        _filter_aborted_io_noise()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=False,
            cleanup_tmp_directories=True,  # a save cut off mid-way leaves a temporary directory
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, step: int, trees: dict[str, Any], meta: dict[str, Any]) -> None:
        """Write step `step` (blocking, so a preemption right after cannot lose it).

        Raises NonFiniteWeightsError (nothing written) when a tree holds NaN/inf, and
        OSError (errno ENOSPC, EROFS, ...; filename = the checkpoint directory) when the
        storage refuses the write; the previous checkpoints stay as they were.
        """
        digests, bad = {}, []
        for name, tree in trees.items():
            digests[name], nonfinite = tree_digests(tree)
            bad += [f"{name}{leaf}" for leaf in nonfinite]
        if bad:
            raise NonFiniteWeightsError(
                f"non-finite values in {len(bad)} arrays ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}) "
                f"at step {step}: training diverged, so this step is not checkpointed"
            )
        saved_meta = {**meta, INTEGRITY_KEY: {"trees": digests, "meta_sha256": meta_digest(meta)}}
        items = {name: ocp.args.StandardSave(tree) for name, tree in trees.items()}
        items["meta"] = _MetaSave(saved_meta)
        try:
            self._manager.save(step, args=ocp.args.Composite(**items), force=True)
            self._manager.wait_until_finished()
        except Exception as err:
            code = storage_errno(err)
            if code is None:
                raise
            raise OSError(code, os.strerror(code), self.directory) from err

    def restore_latest(self, abstract_trees: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """(step, trees, meta) of the newest restorable checkpoint, or None when there is none.

        abstract_trees: {name: pytree of jax.ShapeDtypeStruct with shardings} giving the
        structure, dtypes and placement to restore into. Newer steps that fail are moved
        aside (one warning line each) once an older one restores.
        """
        failed: list[tuple[int, str]] = []
        for step in reversed(self.steps()):
            try:
                trees, meta = self._restore_verified(step, abstract_trees)
            except Exception as err:  # orbax and TensorStore raise many types for damaged files
                gc.collect()  # un-awaited read coroutines are reported now, into the filter
                failed.append((step, _short(err)))
                continue
            if failed:
                self._set_aside(failed, step)
            return step, trees, meta
        if failed:
            reasons = "; ".join(f"step {s}: {r}" for s, r in failed)
            raise CheckpointRestoreError(f"no checkpoint in {self.directory} can be restored ({reasons})")
        return None

    def _restore_verified(self, step: int, abstract_trees: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        items = {name: ocp.args.StandardRestore(tree) for name, tree in abstract_trees.items()}
        items["meta"] = _MetaRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        meta = dict(restored["meta"])
        trees = {name: restored[name] for name in abstract_trees}
        integrity = meta.pop(INTEGRITY_KEY, None)
        if integrity is None:
            log.warning("checkpoint step %d has no digests (written before they existed); restoring it unverified", step)
        elif meta_digest(meta) != integrity.get("meta_sha256"):
            raise CorruptCheckpointError("metadata digest mismatch")
        for name, tree in trees.items():
            digests, nonfinite = tree_digests(tree)
            if nonfinite:
                raise CorruptCheckpointError(f"non-finite values in {name}{nonfinite[0]}")
            if integrity is not None:
                recorded = integrity["trees"].get(name)
                if recorded is None or set(recorded) != set(digests):
                    raise CorruptCheckpointError(f"{name}: recorded digests do not cover the restored arrays")
                wrong = [leaf for leaf in digests if digests[leaf] != recorded[leaf]]
                if wrong:
                    raise CorruptCheckpointError(f"digest mismatch in {len(wrong)} arrays of {name}, first {name}{wrong[0]}")
        return trees, meta

    def _set_aside(self, failed: list[tuple[int, str]], restored: int) -> None:
        """Move the failed steps aside (process 0, on shared storage) and warn once each."""
        for step, reason in failed:
            where = self._move_aside(step) if jax.process_index() == 0 else f"corrupt-{step}"
            log.warning("checkpoint step %d is unreadable (%s); moved it to %s and resumed from step %d",
                        step, reason, where, restored)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("sgs-checkpoint-set-aside")
        self._manager.reload()

    def _move_aside(self, step: int) -> str:
        """Rename step `step`'s directory to corrupt-N (corrupt-N.1, ... when taken); returns
        the new path relative to the checkpoint directory."""
        source = os.path.join(self.directory, str(step))
        name = f"corrupt-{step}"
        suffix = 0
        while os.path.exists(os.path.join(self.directory, name)):
            suffix += 1
            name = f"corrupt-{step}.{suffix}"
        os.replace(source, os.path.join(self.directory, name))
        return os.path.join(os.path.basename(self.directory), name)

    def restore(self, step: int, abstract_trees: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(trees, meta) of step `step`; only the items named in `abstract_trees` are read
        (e.g. one role's weights without the optimizer states). Raises
        CheckpointRestoreError when the step is not saved or cannot be restored."""
        steps = self.steps()
        if step not in steps:
            raise CheckpointRestoreError(f"no checkpoint of step {step} in {self.directory}; saved steps: {steps}")
        try:
            return self._restore_verified(step, abstract_trees)
        except Exception as err:  # orbax and TensorStore raise many types for damaged files
            raise CheckpointRestoreError(f"checkpoint step {step} in {self.directory} cannot be restored: {_short(err)}") from err

    def close(self) -> None:
        self._manager.close()
