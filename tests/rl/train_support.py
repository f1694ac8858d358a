"""Shared helpers of the training tests: random sequences and a NumPy loss reference."""

from __future__ import annotations

import numpy as np

from sgs_jax.rl.batching import SequenceExample


def random_examples(n, vocab, seed=0, max_prompt=6, max_completion=9, weights=None, with_old=False, groups=1):
    """n SequenceExamples with random lengths and ids in [3, vocab); weights default to
    a mix of 1, 0 (counted in the denominator), 0.5 and a negative length penalty."""
    rng = np.random.default_rng(seed)
    cycle = (1.0, 0.0, 0.5, -0.4)
    out = []
    for i in range(n):
        prompt = tuple(int(t) for t in rng.integers(3, vocab, rng.integers(1, max_prompt + 1)))
        completion = tuple(int(t) for t in rng.integers(3, vocab, rng.integers(1, max_completion + 1)))
        old = tuple(float(x) for x in rng.normal(-3.0, 1.5, len(completion))) if with_old else None
        weight = cycle[i % len(cycle)] if weights is None else weights[i]
        out.append(SequenceExample(prompt, completion, weight, old, i % groups))
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def completion_logprobs(logits_fn, examples) -> list[np.ndarray]:
    """log p of each completion token of each example (float64), from one right-padded
    batch: `logits_fn(ids [N, L], mask [N, L]) -> [N, L, V]` (padding after a sequence
    cannot change its causal logits)."""
    seqs = [np.concatenate([e.prompt_ids, e.completion_ids]) for e in examples]  # id arrays
    width = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), width), np.int32)
    mask = np.zeros((len(seqs), width), bool)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = True
    logp = log_softmax(np.asarray(logits_fn(ids, mask)))
    out = []
    for row, (e, seq) in enumerate(zip(examples, seqs)):
        p = len(e.prompt_ids)
        out.append(logp[row, np.arange(p - 1, len(seq) - 1), np.asarray(seq[p:])])
    return out


def weighted_nll_batch_tokens(logits_fn, examples) -> float:
    """-sum_i w_i sum_t log p / (all completion tokens, zero-weight sequences included)."""
    total = sum(len(e.completion_ids) for e in examples)
    lps = completion_logprobs(logits_fn, examples)
    return -sum(e.weight * lp.sum() for e, lp in zip(examples, lps)) / total
