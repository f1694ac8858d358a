"""The sharded training step of one role (Solver or Conjecturer; the Guide's SFT too).

`Trainer` owns a model's parameters and fp32 Adam state on a mesh and runs one optimiser
update per batch of `SequenceExample`s:

  host:   batch -> per-sequence scale over the whole batch -> length-bucketed micro-batches
  device: for each micro-batch  accumulate(params, acc, micro_batch) -> acc   (jitted)
          then                  apply(params, opt_state, acc) -> params, opt_state (jitted)

Both jitted functions take the `nnx.split` state as a pytree with explicit in/out
shardings (parameters by the logical-axis rules, micro-batch rows over (data, fsdp)) and
donate what they replace. Micro-batches enter as global arrays of which each process
places only its own rows (`parallel.global_arrays.to_global`), so the same code runs on
one host and on many. Because every row carries its share of the batch normaliser,
summing micro-batch gradients gives exactly the gradient of the whole batch's loss; each
bucket length compiles once. Remat follows the model config (`remat_policy`).

The weight-sync boundary: the Trainer's fp32 master weights stay in the training layout;
`export_for_inference(dtype, rules)` hands the rollout engine its own copy (e.g. bf16,
replicated over data and fsdp) by one jitted cast-and-reshard, and `weights_version` tells
holders of such a copy when it is stale. `to_host` / `to_device` move an idle role's
weights and optimizer state out of device memory and back.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sgs_jax.models.llama import ACCUMULATING_REMAT
from sgs_jax.parallel import activation_sharding, make_mesh, state_shardings
from sgs_jax.parallel.global_arrays import host_read, to_global
from sgs_jax.parallel.placement import DEVICE, HOST, cast_and_shard, to_memory
from sgs_jax.parallel.rules import batch_spec, check_batch
from sgs_jax.rl import objectives
from sgs_jax.rl.batching import (
    MicroBatch,
    SequenceExample,
    batch_scale,
    group_batches,
    length_buckets,
    make_micro_batches,
    pack_micro_batches,
    padding_fraction,
)
from sgs_jax.rl.logprobs import token_logprobs
from sgs_jax.rl.optimizer import OptimizerConfig, make_optimizer

OBJECTIVES = ("reinforce_half", "cispo", "expert_iteration", "sft")

# How each objective metric combines over micro-batches: summed, or a mean weighted by
# the named count of each micro-batch.
_METRIC_WEIGHT = {
    "token_count": None,
    "sequence_count": None,
    "mean_weight": "sequence_count",
    "nll_per_token": "token_count",
    "clip_fraction_low": "token_count",
    "clip_fraction_high": "token_count",
    "clip_fraction": "token_count",
    "mean_importance_weight": "token_count",
    "mean_ratio": "token_count",
}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One role's training settings.

    objective: one of OBJECTIVES ("sft" = NLL with weight 1 on every sequence).
    normalization: "batch_tokens" (official code, default), "sequence" (paper Eq. 4) or
    "group_tokens" (official CISPO); computed over the whole optimiser batch.
    batch_size / micro_batch_size: sequences per optimiser step / rows per forward-backward
    (one sequence per row unless packed).
    max_seq_len: longest model input (prompt + completion - 1) accepted.
    pack_length: 0 = one sequence per row, padded to a length bucket; > 0 = packed rows
    of up to pack_length tokens (>= max_seq_len), several sequences side by side, so
    little of a micro-batch is padding (`rl.batching.pack_micro_batches`; the attention
    backend must be reference, blockwise, native, splash or, through a dense mask, xla
    or cudnn).
    min_bucket: shortest length bucket.
    logits_chunk: most positions per row whose fp32 logits exist at once; rows up to
    this long keep their softmax for the backward, longer ones recompute it chunk by
    chunk. On one CPU device the LM head runs only on chunks holding completion tokens
    (`rl.logprobs.loss_position_logprobs`).
    reset_optimizer: `train_epoch` starts from a fresh Adam state (method.md §4 step 9).

    normalization, batch_size, max_seq_len, min_bucket, reset_optimizer and pack_length
    (beyond whether it is 0) only steer the host (batching, bucket choice); the compiled
    programs depend on the rest
    (`program_config`), so roles that differ only there share their programs.
    """

    objective: str = "reinforce_half"
    normalization: str = "batch_tokens"
    batch_size: int = 32
    micro_batch_size: int = 4
    max_seq_len: int = 8192
    pack_length: int = 0
    min_bucket: int = 64
    logits_chunk: int = 1024
    cispo_eps_low: float = 1.0
    cispo_eps_high: float = 3.0
    reset_optimizer: bool = True
    optimizer: OptimizerConfig = OptimizerConfig()

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; expected one of {OBJECTIVES}")
        if self.normalization not in objectives.NORMALIZATIONS:
            raise ValueError(f"unknown normalization {self.normalization!r}; expected one of {objectives.NORMALIZATIONS}")
        for name in ("batch_size", "micro_batch_size", "max_seq_len", "min_bucket", "logits_chunk"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.pack_length and self.pack_length < self.max_seq_len:
            raise ValueError(f"pack_length must be 0 (no packing) or >= max_seq_len ({self.max_seq_len}), got {self.pack_length}")

    @property
    def packed(self) -> bool:
        return self.pack_length > 0

    @property
    def buckets(self) -> tuple[int, ...]:
        """Micro-batch lengths: the shapes the accumulate program compiles for. Two per
        octave from min_bucket to max_seq_len; packed, four per octave up to pack_length
        (packed rows are filled to any length, and most micro-batches of a large batch
        are full, so the finer steps cost few extra programs)."""
        if self.packed:
            return length_buckets(self.pack_length, min(self.min_bucket, self.pack_length), per_octave=4)
        return length_buckets(self.max_seq_len, min(self.min_bucket, self.max_seq_len))

    def program_config(self) -> "TrainConfig":
        """This config with its host-only fields at their defaults: the key of the compiled
        programs (a program never reads those fields)."""
        host = {f: TrainConfig.__dataclass_fields__[f].default for f in _HOST_FIELDS}
        # Whether rows are packed changes the programs; how long they may be does not.
        host["pack_length"] = host["max_seq_len"] if self.packed else 0
        return dataclasses.replace(self, **host)


_HOST_FIELDS = ("normalization", "batch_size", "max_seq_len", "min_bucket", "reset_optimizer")


def micro_batch_loss(model, batch: MicroBatch, config: TrainConfig, layer_grad_acc=None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The objective's loss on one micro-batch (its share of the whole batch's loss, as
    `batch.scale` holds the batch-wide normaliser) and its metrics. `layer_grad_acc`: see
    `Llama.hidden_states` (differentiated, the layers' gradient comes back added to it)."""
    # Micro-batch rows are right-padded (rl.batching), so causal attention alone hides padding;
    # packed rows carry segment ids instead.
    logprobs = token_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.targets, config.logits_chunk, right_padded=True,
        segment_ids=batch.segment_ids, layer_grad_acc=layer_grad_acc, loss_mask=batch.loss_mask > 0,
    )
    mask, shared = batch.loss_mask, {"scale": batch.scale, "segment_ids": batch.segment_ids}
    if config.objective == "cispo":
        return objectives.cispo_loss(
            logprobs, batch.old_logprobs, mask, batch.weights, config.cispo_eps_low, config.cispo_eps_high, **shared
        )
    if config.objective == "reinforce_half":
        return objectives.reinforce_half_loss(logprobs, mask, batch.weights, **shared)
    weights = None if config.objective == "sft" else batch.weights
    return objectives.expert_iteration_loss(logprobs, mask, weights, **shared)


def _metric_sums(loss, metrics) -> dict[str, jax.Array]:
    """Micro-batch metrics as sums that add up across micro-batches."""
    sums = {"loss": loss}
    for name, value in metrics.items():
        weight = _METRIC_WEIGHT.get(name, "token_count")
        sums[name] = value if weight is None else value * metrics[weight]
    return sums


def _finish_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Summed micro-batch metrics (`_metric_sums`) -> batch metrics."""
    out = {}
    for name, value in sums.items():
        weight = None if name in _APPLY_METRICS else _METRIC_WEIGHT.get(name, "token_count")
        out[name] = value / max(sums[weight], 1.0) if weight else value
    return out


_APPLY_METRICS = ("loss", "grad_norm", "update_norm", "param_norm")  # not averaged


def epoch_metric(steps: Sequence[Mapping[str, float]], name: str) -> float | None:
    """Metric `name` over an epoch's optimiser steps (`Trainer.train_epoch`'s list): a
    per-token or per-sequence mean weighted by each step's count, as micro-batches combine
    into a step; a per-step value (loss, grad_norm, ...) averaged over steps. None when
    no step has it."""
    having = [s for s in steps if name in s]
    if not having:
        return None
    weight = None if name in _APPLY_METRICS else _METRIC_WEIGHT.get(name, "token_count")
    if weight is None or not all(weight in s for s in having):
        return float(np.mean([s[name] for s in having]))
    counts = np.array([s[weight] for s in having], np.float64)
    values = np.array([s[name] for s in having], np.float64)
    return float(values @ counts / max(counts.sum(), 1.0))


# The TPU compiler's bf16 propagation sees that the layers' forward loop reads each fp32
# master weight only through its cast to bf16, and so casts the whole [layers, ...] stack
# to bf16 before the loop: a second copy of the weights (1.45 GiB per chip for the 7B
# micro-step on v5p-8) live through the step, while the backward loop still reads the
# fp32 stack. Without it each layer is cast inside the loop; the values are the same
# (the pass only moves casts), and the measured HBM traffic is unchanged (docs/planning.md).
_TPU_ACCUMULATE_OPTIONS = {"xla_jf_bf16_propagation": False}


def accumulate_compiler_options(mesh: Mesh) -> dict | None:
    """XLA options for the `accumulate` program on `mesh`'s platform (None: the defaults)."""
    return dict(_TPU_ACCUMULATE_OPTIONS) if mesh.devices.flat[0].platform == "tpu" else None


class TrainPrograms:
    """The compiled pieces of one (architecture, program config, mesh), with their shardings.

    Pure functions of pytrees; every `Trainer` with the same three shares one instance
    (`programs_for`), so a second Trainer of a role, the other role with the same objective
    and optimiser, a test or a restarted stage compiles nothing new. `accumulate` compiles
    once per micro-batch length (`TrainConfig.buckets`), and `start` (a step's first
    micro-batch) once per length a step begins with; `apply` and `init_opt` once. The
    micro-batch must split over the mesh's (data, fsdp) axes (checked here, before any
    work).
    """

    def __init__(self, graphdef, abstract_params, config: TrainConfig, mesh: Mesh):
        self.graphdef, self.config, self.mesh = graphdef, config, mesh
        # Full remat saves only layer inputs; the layers' backward can then add into the
        # accumulator in place (no second [layers, ...] gradient buffer; docs/planning.md).
        self._accumulate_in_backward = nnx.merge(graphdef, abstract_params).config.remat_policy in ACCUMULATING_REMAT
        check_batch(config.micro_batch_size, mesh, "micro_batch_size")
        self.optimizer = make_optimizer(config.optimizer)
        self.param_shardings = state_shardings(abstract_params, mesh)
        self.abstract_params = _with_shardings(abstract_params, self.param_shardings)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        abstract_opt = jax.eval_shape(self.optimizer.init, abstract_params)
        is_sharding = lambda x: isinstance(x, NamedSharding)  # noqa: E731
        self.opt_shardings = optax.tree_utils.tree_map_params(
            self.optimizer, lambda _, s: s, abstract_opt, self.param_shardings,
            transform_non_params=lambda _: self.replicated, is_leaf=is_sharding,
        )
        self.abstract_opt_state = _with_shardings(abstract_opt, self.opt_shardings)
        self.batch_shardings = self._micro_batch_shardings()
        self.metric_names = self._abstract_metric_names(abstract_params)
        self.acc_shardings = (self.param_shardings, {k: self.replicated for k in self.metric_names})
        self.init_opt = jax.jit(self.optimizer.init, in_shardings=(self.param_shardings,), out_shardings=self.opt_shardings)
        self.abstract_acc = _with_shardings(jax.eval_shape(self._zeros, abstract_params), self.acc_shardings)
        # A step's first micro-batch starts the accumulator from its own gradient: no zeroed
        # accumulator to build and add to (one pass over the gradient less per step).
        self.start = jax.jit(
            self._start_fn,
            in_shardings=(self.param_shardings, self.batch_shardings),
            out_shardings=self.acc_shardings,
            compiler_options=accumulate_compiler_options(mesh),
        )
        self.accumulate = jax.jit(
            self._accumulate_fn,
            in_shardings=(self.param_shardings, self.acc_shardings, self.batch_shardings),
            out_shardings=self.acc_shardings,
            donate_argnums=(1,),
            compiler_options=accumulate_compiler_options(mesh),
        )
        self.apply = jax.jit(
            self._apply_fn,
            in_shardings=(self.param_shardings, self.opt_shardings, self.acc_shardings),
            out_shardings=(self.param_shardings, self.opt_shardings, {k: self.replicated for k in self.metric_names + _APPLY_METRICS}),
            donate_argnums=(0, 1),  # the gradient accumulator has no output to alias
        )

    def _micro_batch_shardings(self) -> MicroBatch:
        b = self.config.micro_batch_size
        rows = NamedSharding(self.mesh, batch_spec(("batch", "seq"), self.mesh, (b, 1), "micro_batch_size"))
        if self.config.packed:
            return MicroBatch(rows, rows, rows, rows, rows, rows, rows, rows)
        vec = NamedSharding(self.mesh, batch_spec(("batch",), self.mesh, (b,), "micro_batch_size"))
        return MicroBatch(rows, rows, rows, rows, rows, vec, vec)

    def abstract_micro_batch(self, length: int, shardings: bool = True) -> MicroBatch:
        """Shape structs of one [micro_batch_size, length] micro-batch (the layout
        `rl.batching.make_micro_batches` or, packed, `pack_micro_batches` fills), with
        their shardings unless asked not to."""
        b = self.config.micro_batch_size
        rows = lambda dtype: jax.ShapeDtypeStruct((b, length), dtype)  # noqa: E731
        if self.config.packed:
            per_token = rows(jnp.float32)
            segments = rows(jnp.int32)
        else:
            per_token, segments = jax.ShapeDtypeStruct((b,), jnp.float32), None
        batch = MicroBatch(
            rows(jnp.int32), rows(bool), rows(jnp.int32), rows(jnp.float32), rows(jnp.float32), per_token, per_token, segments
        )
        return _with_shardings(batch, self.batch_shardings) if shardings else batch

    def _loss(self, params, batch: MicroBatch, layer_grad_acc=None):
        with activation_sharding(self.mesh):
            model = nnx.merge(self.graphdef, params)
            loss, metrics = micro_batch_loss(model, batch, self.config, layer_grad_acc)
        return loss, _metric_sums(loss, metrics)

    def _abstract_metric_names(self, abstract_params) -> tuple[str, ...]:
        _, sums = jax.eval_shape(self._loss, abstract_params, self.abstract_micro_batch(2, shardings=False))
        return tuple(sorted(sums))

    def _zeros(self, params):
        grads = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        return grads, {k: jnp.zeros((), jnp.float32) for k in self.metric_names}

    def _start_fn(self, params, batch: MicroBatch):
        # The same program as accumulating into zeros, which XLA folds away (x + 0 -> x);
        # under full remat the layers' backward adds into a zeroed buffer of its own.
        return self._accumulate_fn(params, self._zeros(params), batch)

    def _accumulate_fn(self, params, acc, batch: MicroBatch):
        grad_acc, metric_acc = acc
        # Full remat: the layers' backward scan adds into the donated accumulator in place
        # (`Llama.hidden_states`), so their gradient comes back already summed; the rest
        # (embeddings, final norm, lm_head) is added here.
        layer_acc = grad_acc["layers"] if self._accumulate_in_backward else None
        grads, sums = jax.grad(self._loss, has_aux=True)(params, batch, layer_acc)
        if layer_acc is not None:
            summed_layers = grads["layers"]
            grads["layers"] = jax.tree_util.tree_map(jnp.zeros_like, summed_layers)
        grad_acc = jax.tree_util.tree_map(lambda a, g: a + g.astype(jnp.float32), grad_acc, grads)
        if layer_acc is not None:
            grad_acc["layers"] = summed_layers
        return grad_acc, {k: metric_acc[k] + sums[k].astype(jnp.float32) for k in metric_acc}

    def _apply_fn(self, params, opt_state, acc):
        grads, sums = acc
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        metrics = {
            **sums,  # passed through: the accumulator is donated
            "grad_norm": optax.global_norm(grads),  # before clipping
            "update_norm": optax.global_norm(updates),
            "param_norm": optax.global_norm(new_params),
        }
        return new_params, opt_state, metrics


def _with_shardings(tree, shardings):
    """Shape structs of `tree` carrying `shardings` (for lowering without arrays)."""
    return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


_PROGRAMS: dict[tuple, TrainPrograms] = {}


def programs_for(graphdef, params, config: TrainConfig, mesh: Mesh) -> TrainPrograms:
    """The shared `TrainPrograms` of (graphdef, config.program_config(), mesh); built on
    first use. `params` may be arrays or shape structs."""
    program_config = config.program_config()
    key = (graphdef, program_config, mesh)
    if key not in _PROGRAMS:
        abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        _PROGRAMS[key] = TrainPrograms(graphdef, abstract, program_config, mesh)
    return _PROGRAMS[key]


class Trainer:
    """Parameters, fp32 optimiser state and the compiled step of one role.

    The Trainer takes over `model`'s parameters: it places them on `mesh` (default: the
    first device alone) and, after each update, points `model` at the new parameters, so
    `trainer.model` can go straight to the sampler. Buffers are donated, so arrays taken
    from the model earlier become invalid after a step.
    """

    def __init__(self, model, config: TrainConfig, mesh: Mesh | None = None):
        self.model = model
        self.config = config
        self.mesh = mesh if mesh is not None else make_mesh(1, 1, 1, devices=jax.devices()[:1])
        graphdef, params = nnx.split(model)
        self.programs = programs_for(graphdef, params, config, self.mesh)
        self.weights_version = 0  # bumped whenever `params` is replaced (a step, a restore)
        self.params = jax.device_put(params, self.programs.param_shardings)
        nnx.update(self.model, self.params)
        self.opt_state = self.programs.init_opt(self.params)

    @property
    def params(self):
        """The master weights (nnx.State, the model's param dtype, training layout)."""
        return self._params

    @params.setter
    def params(self, value) -> None:
        self._params = value
        self.weights_version += 1  # copies exported from the old weights are now stale

    # ---- the weight-sync boundary --------------------------------------------------------
    def export_for_inference(self, dtype, rules) -> nnx.State:
        """The weights as the rollout engine holds them: cast to `dtype` and laid out by
        `rules` (`parallel.rules.LAYOUTS`) on this trainer's mesh, by one jitted
        cast-and-reshard. New buffers: the master weights stay as they are (dtype, layout,
        values). In the master dtype and the training layout it is the master weights
        themselves (no copy), valid until the next step donates them; check
        `weights_version` before reusing any export.
        """
        return cast_and_shard(to_memory(self.params, DEVICE), self.mesh, dtype, rules)

    def to_host(self) -> None:
        """Move the master weights and optimizer state to pinned host memory (an idle role
        between phases); `step`, `train_epoch` and `export_for_inference` bring them back."""
        self._move(HOST)

    def to_device(self) -> None:
        """Bring the master weights and optimizer state back to device memory (a no-op there)."""
        self._move(DEVICE)

    def _move(self, kind: str) -> None:
        self._params = to_memory(self._params, kind)  # same values: the version stays
        self.opt_state = to_memory(self.opt_state, kind)
        nnx.update(self.model, self._params)

    # ---- host-side API ----------------------------------------------------------------
    def reset_optimizer(self) -> None:
        """A fresh Adam state (step count 0, zero moments), as each SGS iteration starts."""
        self.opt_state = None  # the old moments go first (device or host): never two at once
        self.to_device()
        self.opt_state = self.programs.init_opt(self.params)

    def micro_batches(self, examples: Sequence[SequenceExample], num_groups: int | None = None) -> list[MicroBatch]:
        """The micro-batches one optimiser step over `examples` runs (num_groups: see `step`)."""
        if self.config.objective == "cispo" and any(e.old_logprobs is None for e in examples):
            raise ValueError("the cispo objective needs old_logprobs on every example")
        if self.config.normalization != "group_tokens":
            num_groups = None  # only the group normaliser divides by a group count
        scale = batch_scale(examples, self.config.normalization, num_groups)
        if self.config.packed:
            return pack_micro_batches(examples, scale, self.config.micro_batch_size, self.config.buckets, self._pad_id())
        return make_micro_batches(examples, scale, self.config.micro_batch_size, self.config.buckets, self._pad_id())

    def _pad_id(self) -> int:
        pad = self.model.config.pad_token_id
        return 0 if pad is None else int(pad)

    def step(self, examples: Sequence[SequenceExample], num_groups: int | None = None) -> dict[str, float]:
        """One optimiser update over `examples` (one optimiser batch, any size >= 1).

        num_groups: the group count the "group_tokens" normaliser divides by (None: the
        groups present); `train_epoch` passes the constant groups per CISPO batch.

        Returns loss (the whole batch's), grad_norm (before clipping), update_norm,
        param_norm, the objective's metrics combined over the batch, num_micro_batches,
        padding_fraction and tokens (real input tokens processed).
        """
        if not examples:
            raise ValueError("an optimiser step needs at least one example")
        batches = self.micro_batches(examples, num_groups)
        self.to_device()
        programs = self.programs
        acc = None
        for batch in batches:
            # Every process builds the same micro-batch and places only the rows it owns.
            placed = to_global(batch, programs.batch_shardings)
            acc = programs.start(self.params, placed) if acc is None else programs.accumulate(self.params, acc, placed)
        self.params, self.opt_state, sums = programs.apply(self.params, self.opt_state, acc)
        nnx.update(self.model, self.params)
        metrics = _finish_metrics({k: float(v) for k, v in host_read(sums).items()})
        metrics["num_micro_batches"] = float(len(batches))
        metrics["padding_fraction"] = padding_fraction(batches)
        metrics["tokens"] = float(sum(int(np.sum(b.attention_mask)) for b in batches))
        return metrics

    def train_epoch(self, examples: Sequence[SequenceExample], seed: int) -> list[dict[str, float]]:
        """One epoch, one `step` per optimiser batch, shuffled with `seed`. Resets the
        optimiser first when `config.reset_optimizer`.

        CISPO: whole groups shuffled and batches cut on group boundaries (`group_batches`),
        the group normaliser dividing by the constant groups per batch. Other objectives:
        sequences shuffled, `batch_size` per batch (the last batch may be smaller).
        """
        if self.config.reset_optimizer:
            self.reset_optimizer()
        if self.config.objective == "cispo":
            batches, per_batch = group_batches(examples, self.config.batch_size, seed)
            return [self.step(batch, per_batch) for batch in batches]
        order = list(range(len(examples)))
        random.Random(seed).shuffle(order)
        size = self.config.batch_size
        return [self.step([examples[i] for i in order[s : s + size]]) for s in range(0, len(order), size)]
