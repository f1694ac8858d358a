"""The projection matmuls of a training step, for the benchmarks that time them: their
shapes, and each shape's three products as our step and PyTorch's run them.

`matmul.py` times every product alone; `train_step.py` sums them into the step's floor
(`matmul_floor`). Both build their calls here, so the two time the same products;
`square_products` gives the host's roofline rate beside them.
"""

from __future__ import annotations

import collections
from typing import Callable

import jax
import numpy as np
import torch

from sgs_jax.models.llama import project

# The order `our_products` and `torch_products` return their calls in.
PRODUCTS = ("forward", "input gradient", "weight gradient")

# Ours: `llama.project` and its VJP, each product a jitted program of its own (the VJP of
# one operand only, so nothing else is computed). Module-level, so calls at the same
# shapes share one compile.
_forward = jax.jit(project)
_input_gradient = jax.jit(lambda x, w, dy: jax.vjp(lambda x: project(x, w), x)[1](dy)[0])
_weight_gradient = jax.jit(lambda x, w, dy: jax.vjp(lambda w: project(x, w), w)[1](dy)[0])
_square = jax.jit(jax.numpy.dot)


def projection_shapes(config) -> list[tuple[int, int, int]]:
    """(in features, out features, count) of the projection matmuls of one forward pass:
    each layer's query, key, value, output, gate, up and down projections, and the LM head."""
    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layer = [(c.hidden_size, q), (c.hidden_size, kv), (c.hidden_size, kv), (q, c.hidden_size),
             (c.hidden_size, c.intermediate_size), (c.hidden_size, c.intermediate_size), (c.intermediate_size, c.hidden_size)]
    shapes = collections.Counter(layer * c.num_layers)
    shapes[(c.hidden_size, c.vocab_size)] += 1
    return [(k, n, count) for (k, n), count in shapes.items()]


def our_products(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> tuple[Callable[[], object], ...]:
    """Our step's three `PRODUCTS` of x [tokens, in] and w [in, out] (dy [tokens, out] the
    output's gradient): x @ w, dy @ w^T and x^T @ dy, each a call that waits for its result."""
    x, w, dy = (jax.device_put(a) for a in (x, w, dy))
    return (lambda: _forward(x, w).block_until_ready(), lambda: _input_gradient(x, w, dy).block_until_ready(),
            lambda: _weight_gradient(x, w, dy).block_until_ready())


def square_products(size: int = 2048) -> dict[str, Callable[[], object]]:
    """One large square fp32 product ([size, size] @ [size, size]) by each library, JAX's (a
    jitted `jnp.dot` on the CPU device: XLA:CPU's own) and torch's (MKL), each a call that
    waits for its result. A product this large runs near the cores' peak, so its rate is a
    roofline for the step's smaller ones."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size), np.float32) for _ in range(2))
    ja, jb = jax.device_put(a), jax.device_put(b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return {"JAX": lambda: _square(ja, jb).block_until_ready(), "torch": lambda: ta @ tb}


def torch_products(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> tuple[Callable[[], object], ...]:
    """The same `PRODUCTS` as `nn.Linear` computes them: its weight is stored [out, in]."""
    x, w, dy = torch.from_numpy(x), torch.from_numpy(np.ascontiguousarray(w.T)), torch.from_numpy(dy)
    return (lambda: x @ w.T, lambda: dy @ w, lambda: dy.T @ x)
