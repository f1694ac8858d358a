"""Memory plan: bytes per device of parameters, optimizer state, KV cache and activations.

Parameter shapes come from `jax.eval_shape` (nothing is allocated) and shardings from the
same logical-axis rules the run uses, on an abstract mesh of any size, so a TPU slice or
GPU node can be sized from a laptop. Activation figures are estimates of the dominant
terms (stated in each row), not measurements.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.sharding import AbstractMesh

from sgs_jax.models.build import abstract_model
from sgs_jax.models.config import ModelConfig
from sgs_jax.parallel.mesh import MESH_AXES
from sgs_jax.parallel.rules import logical_to_spec, param_logical_axes

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    rows: tuple[tuple[str, float, str], ...]  # (item, bytes per device, how it was computed)

    @property
    def total_bytes(self) -> float:
        return sum(r[1] for r in self.rows)

    def table(self) -> str:
        lines = [f"{'item':<34} {'GiB/device':>11}  note", "-" * 78]
        lines += [f"{name:<34} {b / GIB:>11.3f}  {note}" for name, b, note in self.rows]
        lines += ["-" * 78, f"{'total':<34} {self.total_bytes / GIB:>11.3f}"]
        return "\n".join(lines)


def _shard_factor(spec, mesh_shape: dict[str, int]) -> int:
    factor = 1
    for entry in spec:
        for axis in (entry if isinstance(entry, tuple) else (entry,)):
            if axis is not None:
                factor *= mesh_shape[axis]
    return factor


def plan_memory(
    config: ModelConfig,
    mesh_shape: tuple[int, int, int],
    micro_batch: int = 1,
    seq_len: int = 8192,
    sample_batch: int = 64,
    trainable: bool = True,
) -> MemoryPlan:
    """Per-device bytes for `config` on a (data, fsdp, tensor) mesh.

    micro_batch: sequences per training micro-batch (global); seq_len: tokens per sequence;
    sample_batch: concurrent sequences in the sampler's KV cache (global).
    """
    mesh = AbstractMesh(tuple(mesh_shape), MESH_AXES)
    sizes = dict(zip(MESH_AXES, mesh_shape))
    _, state = abstract_model(config)
    param_bytes = 0.0
    param_count = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        spec = logical_to_spec(param_logical_axes(path), mesh, leaf.shape)
        n = math.prod(leaf.shape)
        param_count += n
        param_bytes += n * np.dtype(leaf.dtype).itemsize / _shard_factor(spec, sizes)
    rows = [("parameters", param_bytes, f"{param_count / 1e9:.2f}B params in {config.param_dtype}, sharded by rules")]
    if trainable:
        itemsize = np.dtype(config.weight_dtype).itemsize
        rows.append(("gradients", param_bytes, "same dtype and sharding as parameters"))
        rows.append(("Adam moments (fp32 mu, nu)", param_bytes * 2 * 4 / itemsize, "two fp32 copies"))
    batch_shards = sizes["data"] * sizes["fsdp"]
    act_bytes = np.dtype(config.compute_dtype).itemsize
    kv_heads_local = config.num_kv_heads / (sizes["tensor"] if config.num_kv_heads % sizes["tensor"] == 0 else 1)
    local_sample = math.ceil(sample_batch / batch_shards)
    kv = 2 * config.num_layers * local_sample * seq_len * kv_heads_local * config.head_dim * act_bytes
    rows.append(("KV cache (sampling)", kv, f"{local_sample} seqs x {seq_len} slots per device"))
    if trainable:
        local_mb = math.ceil(micro_batch / batch_shards)
        saved = config.num_layers * local_mb * seq_len * config.hidden_size * act_bytes
        rows.append(("saved layer inputs (remat=full)", saved, f"{local_mb} seqs per device per micro-batch"))
        heads_local = config.num_heads / (sizes["tensor"] if config.num_heads % sizes["tensor"] == 0 else 1)
        scores = local_mb * heads_local * seq_len * seq_len * 4
        rows.append(("attention scores, one layer", scores, "fp32 [heads, T, T]; no fused attention kernel"))
        vocab_local = config.vocab_size / (sizes["tensor"] if config.vocab_size % sizes["tensor"] == 0 else 1)
        rows.append(("logits, one micro-batch", local_mb * seq_len * vocab_local * 4, "fp32 [T, vocab/tensor]"))
    return MemoryPlan(tuple(rows))
