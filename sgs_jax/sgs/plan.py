"""A run's device programs compiled ahead of time for a topology you may not have.

`plan_programs(cfg, topology("v5p:2x2x2"))` builds what `SGSRun` builds from the same
config (the mesh, the Solver's `TrainPrograms` through `roles.train_config`, the `Sampler`)
from shape structs only, lowers their jitted functions (the same objects a run calls:
`TrainPrograms.accumulate` / `.apply`, `Sampler.lower_prefill` / `.lower_decode`) and
compiles them for the topology's devices. Nothing is allocated; the model's architecture
comes from `model.checkpoint`'s config.json when it is on disk, else from a preset.

Programs (each one execution):
  train    one micro-batch's forward + backward into the gradient accumulator
           [micro_batch_size x seq_len tokens]
  apply    the optimiser update (clip, Adam, parameter update)
  prefill  prefill of `prefill_batch` prompts of one bucket, written into KV pages
  decode   one decode chunk: `chunk_steps` steps of every slot, each row attending over the
           pages it holds (rows of `decode_tokens` cached tokens on average)
The sampling programs take the weights in the form a run samples with
(`sampling.weights_dtype`, `sampling.weights_layout`) and the config's KV pool
(`sampling.kv_pool_tokens`, `sampling.page_size`). Under `roles.placement=split` the
programs are those of the Solver's sub-mesh (the topology's devices less the Guide's and
the Conjecturer's, as `roles.role_meshes` takes them); the sub-meshes' own programs are
not compiled here.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import jax
import numpy as np

from sgs_jax.models.build import abstract_model
from sgs_jax.models.config import ModelConfig, preset
from sgs_jax.parallel.aot import GIB, ProgramReport, Topology, compile_timed, report
from sgs_jax.parallel.memory import kv_bytes
from sgs_jax.parallel.mesh import mesh_and_order
from sgs_jax.parallel.rules import layout_rules, replicated_parameters
from sgs_jax.rl.train_step import TrainConfig, programs_for
from sgs_jax.sampling import Sampler
from sgs_jax.sampling.scheduler import pages_for, work_bucket
from sgs_jax.sampling.shapes import DEFAULT_PROMPT_BUCKETS, bucket_for
from sgs_jax.sgs.roles import (SOLVER, SPLIT, conjecturer_mesh_shape, guide_mesh_shape, split_role_devices, train_config,
                               training_lengths)

PROGRAMS = ("train", "apply", "prefill", "decode")
DEFAULT_PRESET = "deepseek-prover-v2-7b"


def plan_model_config(cfg, num_layers: int | None = None, preset_name: str = DEFAULT_PRESET) -> tuple[ModelConfig, str]:
    """(architecture with the config's numerics, where it came from)."""
    runtime = dict(dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype, remat_policy=cfg.model.remat_policy,
                   attention=cfg.model.attention, layer_loop=cfg.model.layer_loop)
    checkpoint = cfg.model.checkpoint
    if checkpoint and os.path.isfile(os.path.join(checkpoint, "config.json")):
        config, source = ModelConfig.from_hf_file(checkpoint, **runtime), checkpoint
    else:
        config, source = preset(preset_name, **runtime), f"preset {preset_name} ({checkpoint or 'no checkpoint'} is not a local directory)"
    if num_layers is not None:
        config = config.replace(num_layers=num_layers)
        source += f", {num_layers} layers"
    return config, source


def solver_train_config(cfg, micro_batch: int | None = None) -> TrainConfig:
    """The Solver's TrainConfig exactly as `roles.build_roles` makes it (micro_batch overrides)."""
    config = train_config(cfg.solver_train, cfg.sgs.solver_objective, cfg.cispo, training_lengths(cfg)[0])
    return dataclasses.replace(config, micro_batch_size=micro_batch) if micro_batch else config


def non_embedding_params(config: ModelConfig) -> int:
    """Parameters that take part in matmuls: all but the input embedding table (a gather)."""
    return config.num_params() - config.vocab_size * config.hidden_size


def resident_bytes(tree) -> float:
    """Bytes one device holds of a pytree of sharded shape structs."""
    total = 0.0
    for leaf in jax.tree_util.tree_leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += math.prod(shard) * np.dtype(leaf.dtype).itemsize
    return total


@dataclasses.dataclass(frozen=True)
class Plan:
    """The reports of one plan and what it was made from."""

    model_source: str
    model: ModelConfig
    mesh: dict[str, int]
    device_order: str
    train: TrainConfig
    reports: tuple[ProgramReport, ...]
    replicated: tuple[str, ...]  # `rules.replicated_parameters` on this mesh
    held_besides: dict[str, float]  # per-device bytes resident during the Solver's micro-step beyond its arguments

    def by_name(self, name: str) -> ProgramReport:
        return next(r for r in self.reports if r.name == name)

    def training_total(self) -> float:
        """Per-device peak of the training phase: the micro-step's peak plus everything else
        the run keeps on device meanwhile (the Solver's Adam state, the other roles)."""
        return self.by_name("train").peak_bytes + sum(self.held_besides.values())


def held_besides_training(cfg, params_bytes: float, opt_bytes: float) -> dict[str, float]:
    """What `SGSRun` keeps on device while the Solver trains, besides the micro-step's
    arguments (its parameters and gradient accumulator), per device; all roles share one
    architecture and mesh, so each role's parameters take `params_bytes`."""
    s = cfg.sgs
    held = {"Solver Adam state": opt_bytes}
    shared = cfg.model.parameter_sharing and s.use_conjecturer and s.train_conjecturer
    if s.use_conjecturer and not shared and conjecturer_mesh_shape(cfg) is None:  # else on devices of its own
        held["Conjecturer parameters"] = params_bytes
        if s.train_conjecturer:
            held["Conjecturer Adam state"] = opt_bytes
    if s.use_guide and guide_mesh_shape(cfg) is None:  # else on devices of its own
        held["Guide parameters"] = params_bytes
    return held


def plan_programs(
    cfg,
    topo: Topology,
    programs: Sequence[str] = PROGRAMS,
    num_layers: int | None = None,
    micro_batch: int | None = None,
    seq_len: int | None = None,
    prompt_len: int = 1024,
    decode_tokens: int | None = None,
    preset_name: str = DEFAULT_PRESET,
    hlo_dir: str | None = None,
) -> Plan:
    """Compile `programs` of the run `cfg` describes for `topo` and report each.

    micro_batch / seq_len: the training micro-batch (default: the config's micro-batch and
    the Solver's longest bucket). prompt_len: prefill prompt length (at most the Solver's
    max_total_len - 1, rounded up to its bucket). The sampler runs max_batch slots over the
    config's KV pool, page tables as wide as the Solver's max_total_len; decode_tokens:
    cached tokens per row on average in the decode chunk (default: the pool shared evenly
    by the slots, at most max_total_len), which sets the ragged work list (gather backend)
    and the live KV the report compares HBM traffic with. hlo_dir: write each program's optimised HLO there as NAME.hlo.txt.
    """
    unknown = set(programs) - set(PROGRAMS)
    if unknown:
        raise ValueError(f"unknown programs {sorted(unknown)}; choose from {PROGRAMS}")
    model_config, source = plan_model_config(cfg, num_layers, preset_name)
    own = topo.devices if cfg.roles.placement != SPLIT else split_role_devices(cfg, topo.devices)[SOLVER]
    mesh, order = mesh_and_order(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices=own)
    mesh_shape = dict(mesh.shape)
    graphdef, abstract = abstract_model(model_config)
    tc = solver_train_config(cfg, micro_batch)
    reports: list[ProgramReport] = []

    def compile_program(name: str, lower):
        compiled, wall, cpu = compile_timed(lower)
        if hlo_dir:
            os.makedirs(hlo_dir, exist_ok=True)
            with open(os.path.join(hlo_dir, f"{name}.hlo.txt"), "w") as f:
                f.write(compiled.as_text())
        return compiled, dict(compile_s=wall, compile_cpu_s=cpu)

    n_matmul = non_embedding_params(model_config)
    devices = mesh.devices.size  # the devices the programs run on (all of the topology's under shared)
    held: dict[str, float] = {}
    if "train" in programs or "apply" in programs:
        progs = programs_for(graphdef, abstract, tc, mesh)
        length = seq_len or tc.buckets[-1]
        params, acc, opt = progs.abstract_params, progs.abstract_acc, progs.abstract_opt_state
        held = held_besides_training(cfg, resident_bytes(params), resident_bytes(opt))
        if "train" in programs:
            compiled, timing = compile_program("train", lambda: progs.accumulate.lower(params, acc, progs.abstract_micro_batch(length)))
            tokens = tc.micro_batch_size * length
            reports.append(report("train", compiled, topo, mesh_shape, f"micro-batch {tc.micro_batch_size} x {length} tokens", **timing,
                                  tokens=tokens, useful_flops=6.0 * n_matmul * tokens / devices,
                                  notes=[f"MFU counts 6 x {n_matmul / 1e9:.2f}B non-embedding parameters x tokens (no attention FLOPs)"]))
        if "apply" in programs:
            compiled, timing = compile_program("apply", lambda: progs.apply.lower(params, opt, acc))
            reports.append(report("apply", compiled, topo, mesh_shape, "one optimiser update", **timing))
    if "prefill" in programs or "decode" in programs:
        sampler = Sampler.from_config(cfg, model_config, mesh)
        weights = sampler.abstract_weights(cfg.sampling.weights_dtype, layout_rules(cfg.sampling.weights_layout))
        max_total = cfg.sampling.solver_max_total_len
        slots = sampler.max_batch
        max_pages, pages_per_shard = sampler.pool_shape(slots, max_total - 1)
        num_pages = pages_per_shard * sampler.shards
        pool = f"pool {num_pages:,} pages x {sampler.page_size} tokens"
        if "prefill" in programs:
            bucket = bucket_for(min(prompt_len, max_total - 1), DEFAULT_PROMPT_BUCKETS)
            batch = min(sampler.prefill_batch, slots)
            compiled, timing = compile_program("prefill", lambda: sampler.lower_prefill(weights, slots, num_pages, bucket, batch))
            reports.append(report("prefill", compiled, topo, mesh_shape, f"{batch} prompts x {bucket} tokens into {slots} slots, {pool}",
                                  **timing, tokens=batch * bucket))
        if "decode" in programs:
            steps = sampler.chunk_steps
            live = decode_tokens or min(num_pages * sampler.page_size // slots, max_total)
            row_pages = int(pages_for(live, sampler.page_size))
            if row_pages > max_pages or slots * row_pages > num_pages:
                raise ValueError(f"decode_tokens={live:,} per row: {slots} rows need {slots * row_pages:,} pages of {sampler.page_size} "
                                 f"tokens, the KV pool holds {num_pages:,} (sampling.kv_pool_tokens) and a row at most {max_pages} "
                                 f"(sampling.solver_max_total_len)")
            work = min(pages_per_shard, work_bucket(slots // sampler.shards * row_pages))
            compiled, timing = compile_program(
                "decode", lambda: sampler.lower_decode(weights, slots, num_pages, max_pages, work_size=work))
            weight_bytes = resident_bytes(weights)
            mesh_dims = (mesh_shape["data"], mesh_shape["fsdp"], mesh_shape["tensor"])
            kv_live = kv_bytes(model_config, mesh_dims, slots * row_pages * sampler.page_size)
            backend = sampler.attention_backend
            r = report("decode", compiled, topo, mesh_shape, f"{steps} steps x {slots} slots, rows of {live:,} cached tokens on average, {pool}",
                       **timing, tokens=steps * slots, useful_flops=2.0 * n_matmul * steps * slots / devices)
            notes = [f"decode attention: {backend}" + (f" (ragged work list of {work:,} pages per batch shard)" if backend == "gather" else "")]
            if r.unestimated_kernel_bytes:
                # The paged kernel's operand is the whole pool, but it reads only the pages rows
                # hold: count the live KV for it (the workload this plan states) instead.
                kernel = r.unestimated_kernel_bytes
                r = dataclasses.replace(r, hbm_bytes=r.hbm_bytes - kernel + kv_live * steps,
                                        memory_s=(r.hbm_bytes - kernel + kv_live * steps) / topo.chip.device_hbm_bandwidth)
                notes.append(f"HBM counts the paged kernel reading the live KV ({kv_live / GIB:.2f} GiB per step); its operands (the "
                             f"whole pool, every layer) would count {kernel / steps / GIB:.2f} GiB per step")
            traffic = r.hbm_bytes / steps
            notes.append(f"per device: sampling weights {weight_bytes / GIB:.2f} GiB ({cfg.sampling.weights_dtype}, "
                         f"{cfg.sampling.weights_layout} layout) + live KV {kv_live / GIB:.2f} GiB = {(weight_bytes + kv_live) / GIB:.2f} "
                         f"GiB; HBM traffic per step {traffic / GIB:.2f} GiB ({traffic / (weight_bytes + kv_live):.2f}x)")
            reports.append(dataclasses.replace(r, notes=r.notes + tuple(notes)))
    return Plan(source, model_config, mesh_shape, order, tc, tuple(reports), tuple(replicated_parameters(abstract, mesh)), held)
