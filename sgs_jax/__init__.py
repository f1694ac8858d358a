"""sgs-jax: Self-Guided Self-Play for formal theorem proving, in JAX and Flax NNX.

Sub-packages (imports flow one way: models, parallel <- sampling, rl <- sgs <- cli):
  models    the LLaMA-family decoder, its config, KV cache, HF checkpoint I/O, tokenizer
  parallel  device mesh, logical-axis rules, shardings, multi-host set-up
  sampling  the rollout engine (prefill, decode loop, per-token logprobs and entropies)
  verify    verification interface and backends (Lean REPL pool, remote, propositional)
  testbed   the embedded propositional-logic Lean domain for CPU runs and tests
  sgs       the method: prompts, extraction, rewards, target set, iteration phases
  rl        objectives, packing, the sharded optax training step, supervised fine-tuning
  analysis  statement analysis, scaling-law fits, reports
"""

__version__ = "0.1.0"
