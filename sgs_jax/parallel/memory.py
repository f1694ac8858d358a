"""Memory plan: bytes per device of parameters, optimizer state, KV cache and activations.

`plan_memory` sizes one model; `plan_roles` sizes an SGS run's three roles phase by phase:
the trainers' fp32 master weights, Adam moments and gradient accumulator (training layout),
their inference copies, the frozen Guide (and a frozen Conjecturer) in the inference form,
the sampler's KV pool, and which of them each phase holds on device (all of them, or with
`roles.offload_idle` only what the phase uses).

Parameter shapes come from `jax.eval_shape` (nothing is allocated) and shardings from the
same logical-axis rules the run uses, on an abstract mesh of any size, so a TPU slice or
GPU node can be sized from a laptop. Activation figures are estimates of the dominant
terms (stated in each row), not measurements.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AbstractMesh

from sgs_jax.models.build import abstract_model
from sgs_jax.models.config import ModelConfig
from sgs_jax.parallel.mesh import MESH_AXES
from sgs_jax.parallel.rules import layout_rules, logical_to_spec, param_logical_axes

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


def parameter_bytes(config: ModelConfig, mesh_shape: tuple[int, int, int], dtype=None, rules=None) -> tuple[float, int]:
    """(bytes per device, parameter count) of the model's parameters in `dtype` (default:
    the config's param dtype) laid out by `rules` (default: the training RULES)."""
    mesh = AbstractMesh(tuple(mesh_shape), MESH_AXES)
    sizes = dict(zip(MESH_AXES, mesh_shape))
    _, state = abstract_model(config)
    total, count = 0.0, 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        spec = logical_to_spec(param_logical_axes(path), mesh, leaf.shape, rules)
        n = math.prod(leaf.shape)
        count += n
        total += n * np.dtype(dtype or leaf.dtype).itemsize / _shard_factor(spec, sizes)
    return total, count


def _local(size: int, shards: int) -> float:
    """A dimension's per-device size when split over `shards` (whole when it does not divide)."""
    return size / shards if size % shards == 0 else size


def kv_bytes(config: ModelConfig, mesh_shape: tuple[int, int, int], tokens: int) -> float:
    """Per-device bytes of `tokens` KV-cache entries (all layers, keys and values, compute
    dtype), rows split over data x fsdp and KV heads over tensor."""
    data, fsdp, tensor = mesh_shape
    per_token = 2 * config.num_layers * _local(config.num_kv_heads, tensor) * config.head_dim * np.dtype(config.compute_dtype).itemsize
    return per_token * tokens / (data * fsdp)


def training_activation_rows(config: ModelConfig, mesh_shape: tuple[int, int, int], micro_batch: int, seq_len: int,
                             label: str = "") -> list[tuple[str, float, str]]:
    """The dominant activation terms of one training micro-batch (estimates, per device)."""
    data, fsdp, tensor = mesh_shape
    act_bytes = np.dtype(config.compute_dtype).itemsize
    local_mb = math.ceil(micro_batch / (data * fsdp))
    suffix = f" ({label})" if label else ""
    saved = config.num_layers * local_mb * seq_len * config.hidden_size * act_bytes
    scores = local_mb * _local(config.num_heads, tensor) * seq_len * seq_len * 4
    logits = local_mb * seq_len * _local(config.vocab_size, tensor) * 4
    return [
        (f"saved layer inputs (remat=full){suffix}", saved, f"{local_mb} seqs x {seq_len} tokens per device per micro-batch"),
        (f"attention scores, one layer{suffix}", scores, "fp32 [heads, T, T]; no fused attention kernel"),
        (f"logits, one micro-batch{suffix}", logits, "fp32 [T, vocab/tensor]"),
    ]


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
    data, fsdp, _ = mesh_shape
    param_bytes, param_count = parameter_bytes(config, mesh_shape)
    rows = [("parameters", param_bytes, f"{param_count / 1e9:.2f}B params in {config.param_dtype}, sharded by rules")]
    if trainable:
        fp32 = param_bytes * 4 / np.dtype(config.weight_dtype).itemsize
        rows.append(("gradients", fp32, "fp32 accumulator, sharded as the parameters"))
        rows.append(("Adam moments (fp32 mu, nu)", 2 * fp32, "two fp32 copies"))
    local_sample = math.ceil(sample_batch / (data * fsdp))
    rows.append(("KV cache (sampling)", kv_bytes(config, mesh_shape, local_sample * (data * fsdp) * seq_len),
                 f"{local_sample} seqs x {seq_len} slots per device"))
    if trainable:
        rows += training_activation_rows(config, mesh_shape, micro_batch, seq_len)
    return MemoryPlan(tuple(rows))


# ---- the three roles over an SGS iteration --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RolesPlan:
    """Per-device bytes of every role's state, and which of them each phase holds on device.

    rows: (item, bytes per device, note). phases: (phase, items on device during it).
    """

    rows: tuple[tuple[str, float, str], ...]
    phases: tuple[tuple[str, tuple[str, ...]], ...]
    notes: tuple[str, ...] = ()

    def item_bytes(self, item: str) -> float:
        return next(b for name, b, _ in self.rows if name == item)

    def phase_bytes(self, phase: str) -> float:
        items = dict(self.phases)[phase]
        return sum(self.item_bytes(i) for i in items)

    @property
    def peak(self) -> tuple[str, float]:
        """(phase, bytes per device) of the phase that holds the most."""
        return max(((p, self.phase_bytes(p)) for p, _ in self.phases), key=lambda x: x[1])

    def table(self, hbm_bytes: float | None = None) -> str:
        width = 44
        lines = [f"{'item':<{width}} {'GiB/device':>11}  note", "-" * 96]
        lines += [f"{name:<{width}} {b / GIB:>11.3f}  {note}" for name, b, note in self.rows]
        lines += ["-" * 96, "on device per phase (one SGS iteration, in order):"]
        for phase, items in self.phases:
            lines.append(f"  {phase:<{width - 2}} {self.phase_bytes(phase) / GIB:>11.3f}  {', '.join(items)}")
        phase, peak = self.peak
        verdict = f"peak {peak / GIB:.3f} GiB per device ({phase})"
        if hbm_bytes is not None:
            fits = "fits" if peak <= hbm_bytes else "DOES NOT FIT"
            verdict += f" of {hbm_bytes / GIB:.1f} GiB HBM: {fits} ({(hbm_bytes - peak) / GIB:+.2f} GiB)"
        lines.append(verdict)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class RoleTraining:
    """A trained role: its name and its training micro-batch (global sequences x tokens)."""

    name: str
    micro_batch: int
    seq_len: int


def plan_roles(
    config: ModelConfig,
    mesh_shape: tuple[int, int, int],
    trained: Sequence[RoleTraining],
    sampling: Sequence[tuple[str, str]],
    frozen: Sequence[str],
    weights_dtype: str,
    weights_layout: str,
    keep_inference_weights: bool,
    offload_idle: bool,
    kv_pool_tokens: int,
) -> RolesPlan:
    """Per-device memory of an SGS run's roles on one (data, fsdp, tensor) mesh, phase by phase
    (under `roles.placement=split`, called once per sub-mesh with the roles it holds).

    config: the architecture in the run's numerics (param_dtype = the trainers' master
    dtype, dtype = compute and KV dtype). trained: roles with a trainer (fp32 Adam moments
    and gradient accumulator in the training layout). sampling: (role, whose weights it
    samples with) in the order the phases run (e.g. Conjecturer, Solver, Guide; a shared
    Conjecturer samples with the Solver's); a trained role's weights are its inference copy
    (`weights_dtype`, `weights_layout`), a frozen role's its own in that form. kv_pool_tokens: the sampler's KV capacity in tokens (one pool,
    alive during sampling phases only).
    """
    rules = layout_rules(weights_layout)
    master, count = parameter_bytes(config, mesh_shape)
    fp32 = master * 4 / np.dtype(config.weight_dtype).itemsize
    inference, _ = parameter_bytes(config, mesh_shape, weights_dtype, rules)
    aliased = weights_layout == "training" and np.dtype(weights_dtype) == np.dtype(config.weight_dtype)
    copy_note = (f"{weights_dtype}, {weights_layout} layout"
                 + (": the master weights themselves (no copy)" if aliased else "; made by one jitted cast-and-reshard per phase"))
    rows: list[tuple[str, float, str]] = []
    by_name = {t.name: t for t in trained}
    for t in trained:
        rows.append((f"{t.name} master weights", master, f"{count / 1e9:.2f}B params in {config.param_dtype}, training layout"))
        rows.append((f"{t.name} Adam moments", 2 * fp32, "fp32 mu, nu, training layout"))
        rows.append((f"{t.name} gradient accumulator", fp32, "fp32, training layout; during its training phase only"))
        rows += training_activation_rows(config, mesh_shape, t.micro_batch, t.seq_len, t.name)
        if not aliased:
            rows.append((f"{t.name} inference weights", inference, copy_note))
    for name in frozen:
        rows.append((f"{name} weights", inference, f"frozen, loaded straight in {weights_dtype}, {weights_layout} layout"))
    rows.append(("KV pool", kv_bytes(config, mesh_shape, kv_pool_tokens),
                 f"{kv_pool_tokens:,} tokens, rows over data x fsdp, KV heads over tensor; sampling phases only"))

    def state(name):  # what a trainer keeps between its steps
        return [f"{name} master weights", f"{name} Adam moments"]

    def copy(name):
        return f"{name} master weights" if aliased else f"{name} inference weights"

    phases: list[tuple[str, tuple[str, ...]]] = []
    kept: list[str] = []  # trainers whose inference copy outlives its phase (keep_inference_weights)
    for role, owner in sampling:
        items = ["KV pool"]
        if owner in by_name:
            items.append(copy(owner))
            if offload_idle and not aliased and owner not in kept:
                items.append(f"{owner} master weights")  # read by the export at the phase's start
        else:
            items.append(f"{owner} weights")
        if not offload_idle:
            items += [i for t in trained for i in state(t.name)] + [f"{f} weights" for f in frozen]
        items += [copy(k) for k in kept]
        phases.append((f"sample: {role}", tuple(dict.fromkeys(items))))
        if keep_inference_weights and owner in by_name and not aliased and owner not in kept:
            kept.append(owner)
    for t in trained:
        if t.name in kept:
            kept.remove(t.name)  # a training phase frees the copy it makes stale
        items = state(t.name) + [f"{t.name} gradient accumulator"]
        items += [r[0] for r in training_activation_rows(config, mesh_shape, t.micro_batch, t.seq_len, t.name)]
        if not offload_idle:
            items += [i for o in trained if o is not t for i in state(o.name)] + [f"{f} weights" for f in frozen]
        items += [copy(k) for k in kept]
        phases.append((f"train: {t.name}", tuple(dict.fromkeys(items))))
    notes = ["training activations are estimates of the dominant terms (remat=full inputs, one layer's scores, one micro-batch's "
             "logits)"] if trained else []
    notes.append("decode and prefill activations are not counted (small beside the KV pool)")
    if offload_idle:
        notes.append("roles.offload_idle: what a phase does not use waits in pinned host memory; a checkpoint brings it back")
    if keep_inference_weights and not aliased:
        notes.append("sampling.keep_inference_weights: a trainer's copy stays until its next training phase")
    return RolesPlan(tuple(rows), tuple(phases), tuple(notes))
