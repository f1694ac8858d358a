"""The three roles and their weights: Solver and Conjecturer train, the Guide is frozen.

All three share one architecture (so one `Sampler` serves them). Solver and Conjecturer
have separate weights unless `parameter_sharing`; a frozen Conjecturer (ablation) keeps
the base weights and has no trainer.

The weight-sync boundary: a trainer's fp32 master weights stay in the training layout; the
sampler gets the role's inference weights (`sampling.weights_dtype`, `sampling.weights_layout`),
made by the trainer's one jitted cast-and-reshard when a sampling phase asks for them
(`Roles.rollout_weights`), reused while the trainer has not stepped, and released after the
phase unless `sampling.keep_inference_weights`. Frozen roles (the Guide, a frozen
Conjecturer) hold only that form. With `roles.offload_idle`, the weights and optimizer
states a phase does not use wait in pinned host memory.

Placement (`roles.placement`): `shared` time-slices every role on one mesh of all devices;
`split` gives the frozen Guide a sub-mesh of its own (`roles.guide_devices`, `role_meshes`),
where it is loaded, sampled (its own `Sampler`) and never offloaded, while the trainers and
the Solver's and Conjecturer's sampling use the rest; the iteration then runs the Guide
phase while the Solver trains (`sgs.iteration`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import jax
from flax import nnx

from jax.sharding import Mesh

from sgs_jax.config import ConfigError
from sgs_jax.models import Llama
from sgs_jax.parallel.memory import RolesPlan, RoleTraining, plan_roles
from sgs_jax.parallel.mesh import make_mesh, split_devices
from sgs_jax.parallel.placement import DEVICE, HOST, cast_and_shard, supports_host_memory, to_memory
from sgs_jax.parallel.rules import check_batch, layout_rules
from sgs_jax.rl.optimizer import OptimizerConfig
from sgs_jax.rl.train_step import TrainConfig, Trainer
from sgs_jax.sampling.scheduler import pool_pages_per_shard

SOLVER, CONJECTURER, GUIDE = "solver", "conjecturer", "guide"
SHARED, SPLIT = "shared", "split"  # roles.placement


def copy_model(model: Llama) -> Llama:
    """An independent copy (new buffers: a trainer donating one copy cannot touch the other)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree_util.tree_map(lambda x: x.copy(), state))


@dataclasses.dataclass(frozen=True)
class RolloutForm:
    """How the sampler holds every role's weights (configs/base.py `sampling.*`, `roles.*`)."""

    dtype: str = "bfloat16"
    layout: str = "inference"
    keep: bool = False  # keep a trainer's export until it steps (else release it after the phase)
    offload_idle: bool = False  # park what a phase does not use in pinned host memory

    @classmethod
    def from_config(cls, cfg) -> "RolloutForm":
        return cls(cfg.sampling.weights_dtype, cfg.sampling.weights_layout,
                   cfg.sampling.keep_inference_weights, cfg.roles.offload_idle)

    @property
    def rules(self):
        return layout_rules(self.layout)


@dataclasses.dataclass
class Roles:
    """The trainers and frozen weights of a run, and the sampler's copies of them.

    frozen: role name -> weights in the rollout form (the Guide; a frozen Conjecturer).
    """

    solver: Trainer
    conjecturer: Trainer | None  # None: no Conjecturer, a frozen one, or shared with the Solver
    frozen: dict[str, nnx.State]
    shared: bool = False
    form: RolloutForm = RolloutForm()
    mesh: Mesh | None = None
    guide_mesh: Mesh | None = None  # the Guide's own sub-mesh (roles.placement=split); None: it shares `mesh`
    # role -> (trainer's weights_version when exported, the export)
    _exports: dict[str, tuple[int, nnx.State]] = dataclasses.field(default_factory=dict)

    def trainer_of(self, role: str) -> Trainer | None:
        """The trainer whose weights `role` samples with (None for a frozen role)."""
        if role == SOLVER or (role == CONJECTURER and self.shared):
            return self.solver
        if role == CONJECTURER and self.conjecturer is not None:
            return self.conjecturer
        if role in self.frozen:
            return None
        raise KeyError(f"this run has no {role} weights")

    def on_own_mesh(self, role: str) -> bool:
        """Whether `role` has a sub-mesh of its own (the Guide under split): nothing else
        lives on its devices, so it stays on device and its phases move nothing else."""
        return role == GUIDE and self.guide_mesh is not None

    def trainable(self) -> dict[str, Trainer]:
        """Role name -> trainer, for checkpoints."""
        out = {SOLVER: self.solver}
        if self.conjecturer is not None:
            out[CONJECTURER] = self.conjecturer
        return out

    def inference_weights(self, role: str) -> nnx.State:
        """`role`'s weights in the rollout form (an nnx.State for `Sampler.generate`): a
        frozen role's own; a trained role's export, made once and reused until its trainer
        steps (`Trainer.weights_version`)."""
        trainer = self.trainer_of(role)
        if trainer is None:
            return self.frozen[role]
        key = self._export_key(role)
        cached = self._exports.get(key)
        if cached is None or cached[0] != trainer.weights_version:
            self._drop(key)
            self._exports[key] = (trainer.weights_version, trainer.export_for_inference(self.form.dtype, self.form.rules))
        return self._exports[key][1]

    @contextlib.contextmanager
    def rollout_weights(self, role: str) -> Iterator[nnx.State]:
        """One sampling phase of `role`: its inference weights (made before the phase), the
        rest parked on the host with `offload_idle`; the export released afterwards unless
        `keep`."""
        weights = self.inference_weights(role)  # exported while the master is still on device
        if self.form.offload_idle and not self.on_own_mesh(role):
            self._place(sample=role)
            weights = self.inference_weights(role)  # the same export, or the frozen role's on device
        try:
            yield weights
        finally:
            if not self.form.keep:
                self._drop(self._export_key(role))

    @contextlib.contextmanager
    def training(self, role: str) -> Iterator[Trainer | None]:
        """One training phase of `role`'s own trainer (None when it has none); with
        `offload_idle`, only that trainer's state is on device meanwhile."""
        trainer = self.trainable().get(role)
        if trainer is not None:
            self._drop(self._export_key(role))  # a kept copy is stale after this phase: free it now
            if self.form.offload_idle:
                self._place(train=trainer)
        yield trainer

    def to_device(self) -> None:
        """Every trainer's weights and optimizer state, and every frozen role, in device
        memory (how a run starts; a checkpoint reads them there). The next phase parks the
        idle ones again (`offload_idle`)."""
        if self.form.offload_idle:
            for trainer in self.trainable().values():
                trainer.to_device()
            self.frozen = {role: to_memory(w, DEVICE) for role, w in self.frozen.items()}

    # ---- internals ----------------------------------------------------------------------
    def _export_key(self, role: str) -> str:
        return SOLVER if self.trainer_of(role) is self.solver else role

    def _drop(self, key: str) -> None:
        """Release an export: its own buffers are deleted at once; an export that is the
        master weights themselves (training form) is only forgotten."""
        entry = self._exports.pop(key, None)
        if entry is None:
            return
        trainer = self.solver if key == SOLVER else self.conjecturer
        master = {id(x) for x in jax.tree_util.tree_leaves(trainer.params)}
        for x in jax.tree_util.tree_leaves(entry[1]):
            if id(x) not in master and not x.is_deleted():
                x.delete()

    def _place(self, sample: str | None = None, train: Trainer | None = None) -> None:
        """Device memory for what the phase uses (the sampled role's inference weights, or
        the trained role's weights and optimizer state); pinned host memory for the rest of
        what shares their mesh (a role on its own sub-mesh is left where it is)."""
        for trainer in self.trainable().values():
            trainer.to_device() if trainer is train else trainer.to_host()
        for role, weights in self.frozen.items():
            if not self.on_own_mesh(role):
                self.frozen[role] = to_memory(weights, DEVICE if role == sample else HOST)


def train_config(role_cfg, objective: str, cispo_cfg, max_seq_len: int) -> TrainConfig:
    """The `TrainConfig` of one role from its config section (configs/base.py)."""
    normalization = role_cfg.normalization
    if objective == "cispo" and cispo_cfg.normalization == "group_tokens":
        normalization = "group_tokens"
    return TrainConfig(
        objective=objective,
        normalization=normalization,
        batch_size=role_cfg.batch_size,
        micro_batch_size=role_cfg.micro_batch_size,
        max_seq_len=max_seq_len,
        min_bucket=role_cfg.min_bucket,
        cispo_eps_low=cispo_cfg.eps_low,
        cispo_eps_high=cispo_cfg.eps_high,
        reset_optimizer=role_cfg.reset_optimizer,
        optimizer=OptimizerConfig(
            learning_rate=role_cfg.lr,
            b1=role_cfg.b1,
            b2=role_cfg.b2,
            eps=role_cfg.eps,
            max_grad_norm=role_cfg.clip_norm,
        ),
    )


# Where the Conjecturer's weights come from (`conjecturer_weights`).
CONJECTURER_SHARED = "shared"  # the Solver's weights (parameter_sharing)
CONJECTURER_TRAINED = "trained"  # its own trainer (checkpoint item "conjecturer")
CONJECTURER_FROZEN = "frozen"  # the base model, never updated (ablation)
CONJECTURER_NONE = "none"  # Solver-only experiments


def conjecturer_weights(cfg) -> str:
    """Which weights the configured experiment's Conjecturer samples with (see above)."""
    s = cfg.sgs
    if not s.use_conjecturer:
        return CONJECTURER_NONE
    if not s.train_conjecturer:
        return CONJECTURER_FROZEN
    return CONJECTURER_SHARED if cfg.model.parameter_sharing else CONJECTURER_TRAINED


def training_lengths(cfg) -> tuple[int, int]:
    """(Solver, Conjecturer) longest training sequence: the Solver's prompt + proof cap (a
    shared model also trains on conjectures), the Conjecturer's that plus its generation."""
    max_len = cfg.sampling.solver_max_total_len
    conj_len = max_len + cfg.sampling.conjecturer_max_new_tokens
    shared = conjecturer_weights(cfg) == CONJECTURER_SHARED
    return (max(max_len, conj_len) if shared else max_len), conj_len


def guide_mesh_shape(cfg) -> tuple[int, int, int] | None:
    """The (data, fsdp, tensor) shape of the Guide's sub-mesh under `roles.placement=split`:
    `roles.guide_devices / mesh.tensor` rows of `mesh.tensor` devices (the rollout form
    replicates over data and splits heads over tensor, so an fsdp axis would only
    replicate); None under shared."""
    if cfg.roles.placement != SPLIT:
        return None
    tensor = cfg.mesh.tensor
    return cfg.roles.guide_devices // tensor, 1, tensor


@dataclasses.dataclass(frozen=True)
class RoleMeshes:
    """train: the trainers' mesh, where the Solver and Conjecturer also sample (every device
    under shared, where the Guide samples too). guide: the Guide's sub-mesh (split), or None."""

    train: Mesh
    guide: Mesh | None = None


def role_meshes(cfg, devices=None) -> RoleMeshes:
    """The meshes of `roles.placement` over `devices` (default: every device of every
    process). Under split the Guide takes `roles.guide_devices` (the same number from each
    process: `parallel.mesh.split_devices`) and `mesh.*` lays out the rest. Raises
    ConfigError naming the field, with the numbers, before any work, when the devices
    cannot be split so or a batch (`sampling.max_batch` on either sub-mesh, a training
    micro-batch on the trainers') does not split over its sub-mesh's batch axes."""
    devices = list(jax.devices() if devices is None else devices)
    if cfg.roles.placement != SPLIT:
        return RoleMeshes(make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices))
    count = cfg.roles.guide_devices
    try:
        rest, taken = split_devices(devices, count)
    except ValueError as err:
        raise ConfigError(f"roles.guide_devices={count} of {len(devices)} devices: {err}") from None
    data, fsdp, tensor = guide_mesh_shape(cfg)
    processes = len({d.process_index for d in devices})
    if (count // processes) % tensor:
        raise ConfigError(f"roles.guide_devices={count}: {count // processes} per process is not a multiple of "
                          f"mesh.tensor={tensor} (a tensor-parallel group stays within one process)")
    try:
        train = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, rest)
    except ValueError as err:
        raise ConfigError(f"mesh.data / mesh.fsdp / mesh.tensor: the trainers' sub-mesh has the {len(rest)} devices "
                          f"roles.guide_devices={count} leaves: {err}") from None
    guide = make_mesh(data, fsdp, tensor, taken)
    batches = [("the Guide's", guide, "sampling.max_batch", cfg.sampling.max_batch),
               ("the trainers'", train, "sampling.max_batch", cfg.sampling.max_batch)]
    batches += [("the trainers'", train, f"{role}.micro_batch_size", cfg[role].micro_batch_size)
                for role in ("solver_train", "conjecturer_train")]
    for name, mesh, field, rows in batches:
        try:
            check_batch(rows, mesh, field)
        except ValueError as err:
            raise ConfigError(f"roles.guide_devices={count}, {name} sub-mesh {dict(mesh.shape)}: {err}") from None
    return RoleMeshes(train, guide)


def _kv_pool_tokens(cfg, mesh_shape: tuple[int, int, int]) -> int:
    """The Sampler's KV pool on a (data, fsdp, tensor) mesh: `sampling.kv_pool_tokens` in
    whole pages of `sampling.page_size` per batch shard (data x fsdp)."""
    page, shards = cfg.sampling.page_size, mesh_shape[0] * mesh_shape[1]
    return pool_pages_per_shard(cfg.sampling.kv_pool_tokens, page, shards) * page * shards


def _plan(cfg, model_config, mesh_shape, trained, sampling, frozen) -> RolesPlan:
    s = cfg.sampling
    return plan_roles(model_config, mesh_shape, trained, sampling, frozen, s.weights_dtype, s.weights_layout,
                      s.keep_inference_weights, cfg.roles.offload_idle, _kv_pool_tokens(cfg, mesh_shape))


def memory_plan(cfg, model_config, mesh_shape: tuple[int, int, int]) -> RolesPlan:
    """The per-device memory plan of the configured experiment's roles (`parallel.memory.
    plan_roles`) for `model_config` (the architecture in the run's numerics) on a (data,
    fsdp, tensor) mesh: every role under shared; under split the trainers' sub-mesh (the
    Guide is on its own: `guide_memory_plan`). The KV pool is the Sampler's
    (`_kv_pool_tokens`)."""
    s, kind = cfg.sgs, conjecturer_weights(cfg)
    solver_seq, conj_len = training_lengths(cfg)
    trained = [RoleTraining("Solver", cfg.solver_train.micro_batch_size, solver_seq)]
    if kind == CONJECTURER_TRAINED:
        trained.append(RoleTraining("Conjecturer", cfg.conjecturer_train.micro_batch_size, conj_len))
    guide_here = s.use_guide and cfg.roles.placement == SHARED
    frozen = (["Conjecturer"] if kind == CONJECTURER_FROZEN else []) + (["Guide"] if guide_here else [])
    sampling = []
    if kind != CONJECTURER_NONE:
        sampling.append(("Conjecturer", "Solver" if kind == CONJECTURER_SHARED else "Conjecturer"))
    sampling.append(("Solver", "Solver"))
    if guide_here:
        sampling.append(("Guide", "Guide"))
    return _plan(cfg, model_config, mesh_shape, trained, sampling, frozen)


def guide_memory_plan(cfg, model_config) -> RolesPlan | None:
    """Under split, the per-device plan of the Guide's own sub-mesh (`guide_mesh_shape`): its
    weights in the rollout form and its Sampler's KV pool, both always on device (nothing
    else uses those devices); None under shared."""
    shape = guide_mesh_shape(cfg)
    if shape is None:
        return None
    return _plan(cfg, model_config, shape, [], [("Guide", "Guide")], ["Guide"])


def build_roles(cfg, base: Llama, guide: nnx.State | None, mesh, guide_mesh: Mesh | None = None) -> Roles:
    """Trainers (on `mesh`) and frozen weights for the configured experiment, all from
    `base` (the Guide's weights come ready, in the rollout form, on `guide_mesh` under
    split, else on `mesh`). Raises ConfigError when
    `roles.offload_idle` is set and the devices have no pinned host memory."""
    s = cfg.sgs
    form = RolloutForm.from_config(cfg)
    if form.offload_idle and not supports_host_memory(mesh):
        platform = mesh.devices.flat[0].platform
        raise ConfigError(f"roles.offload_idle: the {platform} devices have no pinned_host memory kind, so idle roles "
                          "cannot be parked in host memory; set roles.offload_idle=False")
    kind = conjecturer_weights(cfg)
    shared = kind == CONJECTURER_SHARED
    if shared and s.solver_objective == "cispo":
        raise ValueError("parameter_sharing with a CISPO Solver is not supported (the Conjecturer's update is weighted NLL)")
    solver_seq, conj_len = training_lengths(cfg)
    solver = Trainer(copy_model(base), train_config(cfg.solver_train, s.solver_objective, cfg.cispo, solver_seq), mesh)
    conjecturer = None
    frozen: dict[str, nnx.State] = {}
    if kind == CONJECTURER_TRAINED:
        conjecturer = Trainer(
            copy_model(base),
            train_config(cfg.conjecturer_train, "reinforce_half", cfg.cispo, conj_len),
            mesh,
        )
    elif kind == CONJECTURER_FROZEN:
        # The base in the rollout form; the base's own (training-form) buffers go with `base`.
        frozen[CONJECTURER] = cast_and_shard(nnx.state(base), mesh, form.dtype, form.rules)
    if guide is not None and (s.use_guide or cfg.guide.shadow_score):
        frozen[GUIDE] = guide
    return Roles(solver, conjecturer, frozen, shared, form, mesh, guide_mesh)
