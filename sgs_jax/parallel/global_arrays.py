"""Host data in and out of arrays that span every process's devices.

Data in: `to_global` builds a global array from the rows this process owns
(`jax.make_array_from_process_local_data`), so each process places only its own shards.
A process owns the block of a batch that its addressable devices hold under the array's
sharding (`process_block`): with `parallel.mesh`'s device order the processes lie along the
outer (data, else fsdp) mesh axis, so process p of P owns rows [p B/P, (p+1) B/P) of a
B-row batch sharded over (data, fsdp), and all of a replicated array. Every process derives
the same global batch from the same seed and state, so all agree on who owns what.

Data out: `host_read` returns a pytree of arrays as NumPy on every process: fully
addressable or replicated arrays are read locally, arrays with shards on other processes
are gathered (`multihost_utils.process_allgather`, one collective for the whole tree).
Callers read once per decode chunk or optimiser step, never per token.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding


def process_block(sharding: Sharding, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The box of a `shape` array that this process's devices hold under `sharding` (one
    slice per dimension). Raises ValueError when those shards do not tile one box (a
    device order that interleaves processes: not one `parallel.mesh` builds)."""
    indices = sharding.addressable_devices_indices_map(tuple(shape)).values()
    box = []
    for dim, size in enumerate(shape):
        spans = {idx[dim].indices(size)[:2] for idx in indices}
        start, stop = min(s for s, _ in spans), max(e for _, e in spans)
        box.append(slice(start, stop))
    held = {tuple(i.indices(n)[:2] for i, n in zip(idx, shape)) for idx in indices}
    covered = sum(int(np.prod([e - s for s, e in spans])) for spans in held)
    if covered < int(np.prod([b.stop - b.start for b in box])):
        raise ValueError(f"this process's shards of a {tuple(shape)} array under {sharding} do not form one block")
    return tuple(box)


def to_global(tree: Any, shardings: Any) -> Any:
    """Global `jax.Array`s of a pytree of host arrays (each the whole global value, the same
    on every process) with matching `shardings`: each process passes only its own block.
    With one process that block is everything, and one `jax.device_put` of the whole tree
    places it (a training step's two micro-batches: 0.8 ms against 2.2 leaf by leaf)."""
    if jax.process_count() == 1:
        return jax.device_put(jax.tree_util.tree_map(np.asarray, tree), shardings)

    def one(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(sharding, x[process_block(sharding, x.shape)], x.shape)

    return jax.tree_util.tree_map(one, tree, shardings)


def host_read(tree: Any) -> Any:
    """`jax.device_get` that also works for arrays with shards on other processes: those are
    gathered in one `process_allgather` over the tree; everything else is read locally."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    spans = lambda x: isinstance(x, jax.Array) and not x.is_fully_addressable  # noqa: E731
    remote = [i for i, x in enumerate(leaves) if spans(x) and not x.is_fully_replicated]
    out = jax.device_get([None if spans(x) else x for x in leaves])
    for i, x in enumerate(leaves):
        if spans(x) and x.is_fully_replicated:
            out[i] = np.asarray(x.addressable_data(0))  # every process holds the whole value
    if remote:
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather([leaves[i] for i in remote], tiled=True)
        for i, value in zip(remote, gathered):
            out[i] = np.asarray(value)
    return jax.tree_util.tree_unflatten(treedef, out)
