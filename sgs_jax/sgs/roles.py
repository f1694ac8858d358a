"""The three roles and their weights: Solver and Conjecturer train, the Guide is frozen.

All three share one architecture (so one `Sampler` serves them). Solver and Conjecturer
have separate weights unless `parameter_sharing`; a frozen Conjecturer (ablation) keeps
the base weights and has no trainer.
"""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from sgs_jax.models import Llama
from sgs_jax.rl.optimizer import OptimizerConfig
from sgs_jax.rl.train_step import TrainConfig, Trainer


def copy_model(model: Llama) -> Llama:
    """An independent copy (new buffers: a trainer donating one copy cannot touch the other)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree_util.tree_map(lambda x: x.copy(), state))


@dataclasses.dataclass
class Roles:
    solver: Trainer
    conjecturer: Trainer | None  # None: no Conjecturer, a frozen one, or shared with the Solver
    conjecturer_frozen: Llama | None  # the frozen Conjecturer's weights (ablation)
    guide_model: Llama | None
    shared: bool = False

    @property
    def conjecturer_model(self) -> Llama:
        if self.shared:
            return self.solver.model
        if self.conjecturer is not None:
            return self.conjecturer.model
        return self.conjecturer_frozen

    def trainable(self) -> dict[str, Trainer]:
        """Role name -> trainer, for checkpoints."""
        out = {"solver": self.solver}
        if self.conjecturer is not None:
            out["conjecturer"] = self.conjecturer
        return out


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


def build_roles(cfg, base: Llama, guide: Llama | None, mesh) -> Roles:
    """Trainers and frozen models for the configured experiment, all from `base`."""
    s = cfg.sgs
    max_len = cfg.sampling.solver_max_total_len
    conj_len = max_len + cfg.sampling.conjecturer_max_new_tokens
    kind = conjecturer_weights(cfg)
    shared = kind == CONJECTURER_SHARED
    if shared and s.solver_objective == "cispo":
        raise ValueError("parameter_sharing with a CISPO Solver is not supported (the Conjecturer's update is weighted NLL)")
    solver_seq = max(max_len, conj_len) if shared else max_len
    solver = Trainer(copy_model(base), train_config(cfg.solver_train, s.solver_objective, cfg.cispo, solver_seq), mesh)
    conjecturer = frozen = None
    if kind == CONJECTURER_TRAINED:
        conjecturer = Trainer(
            copy_model(base),
            train_config(cfg.conjecturer_train, "reinforce_half", cfg.cispo, conj_len),
            mesh,
        )
    elif kind == CONJECTURER_FROZEN:
        frozen = base
    return Roles(solver, conjecturer, frozen, guide if (s.use_guide or cfg.guide.shadow_score) else None, shared)
