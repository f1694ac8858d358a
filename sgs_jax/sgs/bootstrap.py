"""Where a run starts from: its target set, prompt templates, tokenizer, base model and Guide.

The base model (the starting point of Solver and Conjecturer) is a Hugging Face checkpoint:
DeepSeek-Prover-V2-7B for real runs, or the packaged testbed model (made by
`python -m sgs_jax.sgs.testbed_pretrain`) for CPU runs. The Guide is either a ready
checkpoint (the authors released theirs) or the base fine-tuned on `guide.sft_data`, a
JSONL of rubric replies; a Guide fine-tuned here is saved in the run directory so a resumed
run reloads it instead of training it again.

The base is loaded in the training form (`model.param_dtype`, the training layout): the
trainers start from it. The frozen Guide only ever samples, so it is loaded straight into
the rollout engine's form (`sampling.weights_dtype`, `sampling.weights_layout`) and never
holds a master-precision copy.
"""

from __future__ import annotations

import logging
import os

import jax.numpy as jnp
from flax import nnx

from sgs_jax.models import Llama, load_hf, save_hf
from sgs_jax.models.tokenizer import load_tokenizer
from sgs_jax.parallel.rules import layout_rules
from sgs_jax.sgs import prompts
from sgs_jax.sgs.roles import copy_model
from sgs_jax.sgs.target_set import TargetSet, download_from_hub

log = logging.getLogger(__name__)


def load_target_set(cfg) -> TargetSet:
    """The configured target set (testbed default, a D3k-format file, or the hub)."""
    t = cfg.targets
    if t.source == "testbed":
        from sgs_jax.testbed.generator import DEFAULT_PATH

        path = DEFAULT_PATH
    elif t.source == "file":
        path = t.path
    else:
        path = download_from_hub(t.hub_id)
    target_set = TargetSet.load(path, t.max_proofs)
    if t.limit:
        target_set = target_set.first(t.limit)
    return target_set


def load_templates(cfg) -> prompts.PromptTemplates:
    """The prompt templates of the run (packaged ones unless the config names files)."""
    overrides = {role: path for role, path in cfg.prompts.items() if path}
    return prompts.PromptTemplates.load(overrides)


def load_role_tokenizer(cfg):
    """The base checkpoint's tokenizer (all roles share it)."""
    return load_tokenizer(cfg.model.checkpoint)


def load_model(cfg, path: str, mesh) -> Llama:
    """A role's checkpoint in the run's dtypes, remat policy, attention backend and layer
    loop, sharded on `mesh`."""
    return load_hf(path, dtype=jnp.dtype(cfg.model.dtype), mesh=mesh, param_dtype=jnp.dtype(cfg.model.param_dtype),
                   remat_policy=cfg.model.remat_policy, attention=cfg.model.attention, layer_loop=cfg.model.layer_loop)


def load_inference_weights(cfg, path: str, mesh) -> nnx.State:
    """A frozen role's checkpoint straight in the rollout engine's form: parameters in
    `sampling.weights_dtype`, laid out by `sampling.weights_layout`'s rules on `mesh`,
    streamed from disk shard by shard (no master-precision copy is ever made)."""
    model = load_hf(path, dtype=jnp.dtype(cfg.model.dtype), mesh=mesh, rules=layout_rules(cfg.sampling.weights_layout),
                    param_dtype=jnp.dtype(cfg.sampling.weights_dtype), attention=cfg.model.attention)
    return nnx.state(model)


def initial_models(cfg, tokenizer, mesh, workdir: str, guide_mesh=None) -> tuple[Llama, nnx.State | None]:
    """(base model in the training form on `mesh`, the Guide's weights in the inference form
    on `guide_mesh` (its own sub-mesh under roles.placement=split; default `mesh`) or None
    when the experiment uses no Guide). A Guide fine-tuned here trains on `mesh`."""
    if not cfg.model.checkpoint:
        raise ValueError("model.checkpoint is empty: name the base prover checkpoint (the testbed preset names the packaged one)")
    base = load_model(cfg, cfg.model.checkpoint, mesh)
    if not (cfg.sgs.use_guide or cfg.guide.shadow_score):
        return base, None
    path = guide_path(cfg, workdir)
    if not (cfg.model.guide_checkpoint or os.path.exists(os.path.join(path, "config.json"))):
        save_hf(fine_tune_guide(cfg, base, tokenizer, mesh), path, tokenizer=tokenizer)
    return base, load_inference_weights(cfg, path, mesh if guide_mesh is None else guide_mesh)


def guide_path(cfg, workdir: str) -> str:
    """The run's Guide checkpoint: `model.guide_checkpoint`, else the Guide fine-tuned
    into `workdir/guide` (which exists once the Guide stage has run)."""
    return cfg.model.guide_checkpoint or os.path.join(workdir, "guide")


def fine_tune_guide(cfg, base: Llama, tokenizer, mesh) -> Llama:
    """The Guide stage: a copy of the base fine-tuned on rubric replies (then frozen)."""
    from sgs_jax.rl.sft import fine_tune, read_sft_jsonl

    if not cfg.guide.sft_data:
        raise ValueError("model.guide_checkpoint is empty, so guide.sft_data must name a JSONL of Guide replies")
    pairs = read_sft_jsonl(cfg.guide.sft_data)
    log.info("fine-tuning the Guide on %d replies for %d epochs", len(pairs), cfg.guide.sft_epochs)
    return fine_tune(copy_model(base), pairs, tokenizer, mesh=mesh, learning_rate=cfg.guide.sft_lr,
                     epochs=cfg.guide.sft_epochs, batch_size=cfg.guide.sft_batch_size,
                     micro_batch_size=cfg.guide.sft_micro_batch_size)
