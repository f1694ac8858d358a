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
`split` gives the frozen Guide (`roles.guide_devices`) and/or the Conjecturer
(`roles.conjecturer_devices`) a sub-mesh of its own (`role_meshes`), where the role is loaded,
sampled (its own `Sampler`), trained (the Conjecturer's trainer) and never offloaded, while
the Solver trains and samples on the rest. The iteration then overlaps what runs on
different devices (`sgs.iteration`): the Solver trains while the Guide samples, and the
Conjecturer trains beside the Solver.
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
    own_meshes: dict[str, Mesh] = dataclasses.field(default_factory=dict)  # role -> its own sub-mesh (split); others share `mesh`
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
        """Whether `role` has a sub-mesh of its own (split: the Guide, the Conjecturer):
        nothing else lives on its devices, so it stays on device and its phases move nothing
        else."""
        return role in self.own_meshes

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
            if self.form.offload_idle and not self.on_own_mesh(role):
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
        for role, trainer in self.trainable().items():
            if not self.on_own_mesh(role):
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
        pack_length=role_cfg.pack_length,
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
    """The (data, fsdp, tensor) shape of the Guide's sub-mesh (`roles.guide_devices` under
    split): `roles.guide_devices / mesh.tensor` rows of `mesh.tensor` devices (the rollout
    form replicates over data and splits heads over tensor, so an fsdp axis would only
    replicate); None when the Guide shares the Solver's mesh."""
    if cfg.roles.placement != SPLIT or not cfg.roles.guide_devices:
        return None
    tensor = cfg.mesh.tensor
    return cfg.roles.guide_devices // tensor, 1, tensor


def conjecturer_mesh_shape(cfg) -> tuple[int, int, int] | None:
    """The (data, fsdp, tensor) shape of the Conjecturer's sub-mesh (`roles.conjecturer_devices`
    under split): its trainer shards the weights over `roles.conjecturer_devices / mesh.tensor`
    fsdp devices of `mesh.tensor` each (its sampler splits slots over the same devices);
    None when it shares the Solver's mesh."""
    if cfg.roles.placement != SPLIT or not cfg.roles.conjecturer_devices:
        return None
    tensor = cfg.mesh.tensor
    return 1, cfg.roles.conjecturer_devices // tensor, tensor


# The roles that may have a sub-mesh of their own, with the config field of its device count.
OWN_MESH_FIELDS = {GUIDE: "guide_devices", CONJECTURER: "conjecturer_devices"}


def own_mesh_shapes(cfg) -> dict[str, tuple[int, int, int]]:
    """Role -> the (data, fsdp, tensor) shape of its own sub-mesh, for the roles that have one
    (`guide_mesh_shape`, `conjecturer_mesh_shape`); empty under shared."""
    shapes = {GUIDE: guide_mesh_shape(cfg), CONJECTURER: conjecturer_mesh_shape(cfg)}
    return {role: shape for role, shape in shapes.items() if shape is not None}


@dataclasses.dataclass(frozen=True)
class RoleMeshes:
    """train: the Solver's mesh, where it trains and samples (every device under shared,
    where every role lives). guide / conjecturer: that role's own sub-mesh (split), or None
    when it shares `train`."""

    train: Mesh
    guide: Mesh | None = None
    conjecturer: Mesh | None = None

    def own(self) -> dict[str, Mesh]:
        """Role -> its own sub-mesh, for the roles that have one."""
        return {role: mesh for role, mesh in ((GUIDE, self.guide), (CONJECTURER, self.conjecturer)) if mesh is not None}


def split_role_devices(cfg, devices) -> dict[str, list]:
    """Role -> its devices under `roles.placement` (SOLVER: what the sub-meshes leave; the
    Guide's, then the Conjecturer's, taken as `parallel.mesh.split_devices` takes them: the
    same number from every process). Raises ConfigError with the numbers."""
    devices = list(devices)
    out = {}
    processes = len({d.process_index for d in devices})
    for role, shape in own_mesh_shapes(cfg).items():
        field = OWN_MESH_FIELDS[role]
        count = cfg.roles[field]
        try:
            devices, out[role] = split_devices(devices, count)
        except ValueError as err:
            raise ConfigError(f"roles.{field}={count} of the {len(devices)} devices left for it: {err}") from None
        if (count // processes) % shape[2]:
            raise ConfigError(f"roles.{field}={count}: {count // processes} per process is not a multiple of "
                              f"mesh.tensor={shape[2]} (a tensor-parallel group stays within one process)")
    out[SOLVER] = devices
    return out


def role_meshes(cfg, devices=None) -> RoleMeshes:
    """The meshes of `roles.placement` over `devices` (default: every device of every
    process). Under split the Guide and the Conjecturer take their `roles.*_devices`
    (`split_role_devices`) and `mesh.*` lays out the rest for the Solver. Raises
    ConfigError naming the field, with the numbers, before any work, when the devices
    cannot be split so or a batch (`sampling.max_batch` on any sub-mesh, a training
    micro-batch on its trainer's) does not split over its sub-mesh's batch axes."""
    devices = list(jax.devices() if devices is None else devices)
    if cfg.roles.placement != SPLIT:
        return RoleMeshes(make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices))
    parts = split_role_devices(cfg, devices)
    shapes = own_mesh_shapes(cfg)
    fields = " / ".join(f"roles.{OWN_MESH_FIELDS[role]}={cfg.roles[OWN_MESH_FIELDS[role]]}" for role in shapes)
    try:
        train = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, parts[SOLVER])
    except ValueError as err:
        raise ConfigError(f"mesh.data / mesh.fsdp / mesh.tensor: the Solver's sub-mesh has the {len(parts[SOLVER])} "
                          f"devices {fields} leaves: {err}") from None
    own = {role: make_mesh(*shape, parts[role]) for role, shape in shapes.items()}
    guide, conjecturer = own.get(GUIDE), own.get(CONJECTURER)
    conj_trainer = conjecturer if conjecturer is not None else train
    batches = [(f"the {role.capitalize()}'s", mesh, "sampling.max_batch", cfg.sampling.max_batch) for role, mesh in own.items()]
    batches += [("the Solver's", train, "sampling.max_batch", cfg.sampling.max_batch),
                ("the Solver's", train, "solver_train.micro_batch_size", cfg.solver_train.micro_batch_size)]
    if conjecturer_weights(cfg) == CONJECTURER_TRAINED:
        name = "the Conjecturer's" if conjecturer is not None else "the Solver's"
        batches.append((name, conj_trainer, "conjecturer_train.micro_batch_size", cfg.conjecturer_train.micro_batch_size))
    for name, mesh, field, rows in batches:
        try:
            check_batch(rows, mesh, field)
        except ValueError as err:
            raise ConfigError(f"{fields}, {name} sub-mesh {dict(mesh.shape)}: {err}") from None
    return RoleMeshes(train, guide, conjecturer)


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
    fsdp, tensor) mesh: every role under shared; under split the Solver's sub-mesh and the
    roles that share it (a role on its own: `own_memory_plans`). The KV pool is the
    Sampler's (`_kv_pool_tokens`)."""
    s, kind = cfg.sgs, conjecturer_weights(cfg)
    guide_here = s.use_guide and guide_mesh_shape(cfg) is None
    conjecturer_here = kind != CONJECTURER_NONE and conjecturer_mesh_shape(cfg) is None
    return _role_plan(cfg, model_config, mesh_shape, solver=True, conjecturer=conjecturer_here, guide=guide_here)


def own_memory_plans(cfg, model_config) -> dict[str, tuple[tuple[int, int, int], RolesPlan]]:
    """Under split, role -> (its sub-mesh's shape, the per-device plan of that sub-mesh): the
    Guide's weights in the rollout form and its Sampler's KV pool; the Conjecturer's trainer
    (weights, Adam state, micro-step) and its sampling. All stay on device (nothing else
    uses those devices). Empty under shared."""
    return {role: (shape, _role_plan(cfg, model_config, shape, solver=False, conjecturer=role == CONJECTURER,
                                     guide=role == GUIDE))
            for role, shape in own_mesh_shapes(cfg).items()}


def _role_plan(cfg, model_config, mesh_shape, solver: bool, conjecturer: bool, guide: bool) -> RolesPlan:
    """The plan of the roles a mesh holds: the Solver's trainer and sampling, the
    Conjecturer in the form `conjecturer_weights` gives it, the Guide's frozen weights."""
    kind = conjecturer_weights(cfg)
    solver_seq, conj_len = training_lengths(cfg)
    trained = [RoleTraining("Solver", cfg.solver_train.micro_batch_size, solver_seq)] if solver else []
    if conjecturer and kind == CONJECTURER_TRAINED:
        trained.append(RoleTraining("Conjecturer", cfg.conjecturer_train.micro_batch_size, conj_len))
    frozen = (["Conjecturer"] if conjecturer and kind == CONJECTURER_FROZEN else []) + (["Guide"] if guide else [])
    sampling = []
    if conjecturer:
        sampling.append(("Conjecturer", "Solver" if kind == CONJECTURER_SHARED else "Conjecturer"))
    if solver:
        sampling.append(("Solver", "Solver"))
    if guide:
        sampling.append(("Guide", "Guide"))
    return _plan(cfg, model_config, mesh_shape, trained, sampling, frozen)


def build_roles(cfg, base: Llama, guide: nnx.State | None, meshes: RoleMeshes, conjecturer_base: Llama | None = None) -> Roles:
    """Trainers and frozen weights for the configured experiment, all from `base` (on
    `meshes.train`). The Guide's weights come ready, in the rollout form, on its mesh
    (`meshes.guide`, else `meshes.train`). A Conjecturer with its own sub-mesh is made from
    `conjecturer_base`: the base checkpoint loaded straight onto `meshes.conjecturer`
    (`bootstrap.load_model`). Raises ConfigError when `roles.offload_idle` is set and the
    devices have no pinned host memory."""
    s = cfg.sgs
    mesh = meshes.train
    form = RolloutForm.from_config(cfg)
    if form.offload_idle and not supports_host_memory(mesh):
        platform = mesh.devices.flat[0].platform
        raise ConfigError(f"roles.offload_idle: the {platform} devices have no pinned_host memory kind, so idle roles "
                          "cannot be parked in host memory; set roles.offload_idle=False")
    kind = conjecturer_weights(cfg)
    shared = kind == CONJECTURER_SHARED
    if shared and s.solver_objective == "cispo":
        raise ValueError("parameter_sharing with a CISPO Solver is not supported (the Conjecturer's update is weighted NLL)")
    if (meshes.conjecturer is None) != (conjecturer_base is None):
        raise ValueError("a Conjecturer on its own sub-mesh needs conjecturer_base on it, and only then")
    solver_seq, conj_len = training_lengths(cfg)
    solver = Trainer(copy_model(base), train_config(cfg.solver_train, s.solver_objective, cfg.cispo, solver_seq), mesh)
    conjecturer = None
    frozen: dict[str, nnx.State] = {}
    conj_mesh = meshes.conjecturer if meshes.conjecturer is not None else mesh
    conj_source = conjecturer_base if conjecturer_base is not None else copy_model(base)
    if kind == CONJECTURER_TRAINED:
        conjecturer = Trainer(conj_source, train_config(cfg.conjecturer_train, "reinforce_half", cfg.cispo, conj_len), conj_mesh)
    elif kind == CONJECTURER_FROZEN:
        # The base in the rollout form; the training-form buffers go with `conj_source`.
        frozen[CONJECTURER] = cast_and_shard(nnx.state(conj_source), conj_mesh, form.dtype, form.rules)
    if guide is not None and (s.use_guide or cfg.guide.shadow_score):
        frozen[GUIDE] = guide
    return Roles(solver, conjecturer, frozen, shared, form, mesh, meshes.own())
