"""Independent NumPy references for sampling tests: full-forward logits and the warped
distribution computed token by token (no shared code with sgs_jax.sampling)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

PAD_TO = 64  # one compiled reference forward for every sequence length up to this


@functools.lru_cache(maxsize=None)
def _forward(graphdef):
    return jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids))


def full_logits(model, ids) -> np.ndarray:
    """Logits [T, V] of one sequence from a plain full causal forward pass (no cache).

    Right padding to PAD_TO cannot change the first T positions of a causal pass; it only
    keeps the reference to one compiled program."""
    ids = list(ids)
    assert len(ids) <= PAD_TO
    graphdef, state = nnx.split(model)
    padded = jnp.asarray([ids + [0] * (PAD_TO - len(ids))], jnp.int32)
    return np.asarray(_forward(graphdef)(state, padded))[0, : len(ids)].astype(np.float64)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def entropy(logits: np.ndarray) -> np.ndarray:
    logp = log_softmax(logits)
    return -(np.exp(logp) * logp).sum(axis=-1)


def warped_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Sampling distribution of one row [V]: temperature, keep the k most likely, then the
    smallest prefix (most likely first) whose mass reaches top_p, renormalised."""
    scaled = logits / temperature
    order = list(np.argsort(-scaled, kind="stable"))
    if top_k:
        order = order[:top_k]
    probs = np.exp(log_softmax(scaled[order]))
    kept, mass = [], 0.0
    for token, p in zip(order, probs):
        if mass >= top_p:
            break
        kept.append(token)
        mass += p
    out = np.zeros_like(scaled)
    out[kept] = np.exp(scaled[kept] - scaled[kept].max())
    return out / out.sum()
