"""The two presets every experiment file offers, and the helper experiment files use.

  testbed  embedded propositional Lean domain, the packaged tiny base and Guide models,
           `prop` verifier, CPU-sized everything (minutes)
  paper    DeepSeek-Prover-V2-7B on D3k, Lean 4.15 + Mathlib REPL pool, the paper's constants
"""

from ml_collections import ConfigDict

from configs.base import get_config as base_config

PRESETS = ("testbed", "paper")


def testbed(c: ConfigDict) -> None:
    from sgs_jax.sgs.testbed_pretrain import MODELS_DIR, TEMPLATES_DIR
    from sgs_jax.sgs.testbed_targets import SOLVER_MAX_TOTAL_LEN

    c.run.iterations = 10
    c.targets.source = "testbed"
    c.targets.limit = 96
    # The packaged stand-ins for the prover and the Guide (python -m sgs_jax.sgs.testbed_pretrain).
    c.model.checkpoint = str(MODELS_DIR / "base")
    c.model.guide_checkpoint = str(MODELS_DIR / "guide")
    # The cap the packaged target set was calibrated at: its statements' Solver rows fit it.
    c.sampling.solver_max_total_len = SOLVER_MAX_TOTAL_LEN
    c.sampling.conjecturer_max_new_tokens = 128
    c.sampling.guide_max_new_tokens = 128
    c.sampling.max_batch = 128
    c.sampling.kv_pool_tokens = 65_536  # 128 slots x 512: every row's worst case fits (no preemption)
    c.sampling.page_size = 16
    c.verify.backend = "prop"
    # Short Conjecturer and Guide prompts (the ones the testbed models were trained on): the
    # full rubric costs hundreds of tokens per call on a CPU.
    for role in ("conjecturer", "conjecturer_no_target", "guide"):
        c.prompts[role] = str(TEMPLATES_DIR / f"{role}.txt")
    for role in (c.solver_train, c.conjecturer_train):
        role.lr = 3e-4  # tiny models move slowly at the 7B learning rate
        role.batch_size = 32
        role.micro_batch_size = 32


def paper(c: ConfigDict) -> None:
    c.run.iterations = 500
    c.targets.source = "hub"
    c.model.checkpoint = "deepseek-ai/DeepSeek-Prover-V2-7B"
    c.model.guide_checkpoint = "LukeBailey181Pub/dspv2_guide"
    c.model.dtype = "bfloat16"
    # fp32 master weights (as DeepSpeed's bf16 mode keeps): a 3e-6 step mostly vanishes in bf16.
    c.model.param_dtype = "float32"
    # Full remat with the 30 saved layer inputs (64 MiB each per chip at 8K tokens) in host
    # memory between forward and backward: 1.9 GiB less HBM per chip (docs/planning.md).
    c.model.remat_policy = "offload"
    # MHA KV cache is 480 KiB per token in bf16: the base pool of 512K tokens (240 GiB, 30
    # GiB per chip on 8) holds 256 rows averaging 2K tokens; rows grow into it by pages.
    c.sampling.max_batch = 256
    # One 8K sequence per device per micro-batch on 8 devices (micro-batches must split over
    # mesh data x fsdp: on 16 chips set 16); buckets from 1K: 7 training shapes up to 8K.
    for role in (c.solver_train, c.conjecturer_train):
        role.micro_batch_size = 8
        role.min_bucket = 1024
    c.guide.sft_micro_batch_size = 8
    c.verify.backend = "lean"
    c.verify.options.timeout_s = 200.0
    c.verify.options.memory_limit_gib = 12.0


def experiment(name: str, preset: str, **changes) -> ConfigDict:
    """Base config + `preset` + the experiment's own `changes` ({"a.b": value}); a callable
    value is applied to the preset's value (so a ratio holds in every preset)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {PRESETS}")
    c = base_config()
    c.experiment = name
    c.run.workdir = f"runs/{name}_{preset}"
    {"testbed": testbed, "paper": paper}[preset](c)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = c
        for part in parents:
            node = node[part]
        if leaf not in node:
            raise KeyError(f"{name}: unknown field {dotted}")
        node[leaf] = value(node[leaf]) if callable(value) else value
    return c
