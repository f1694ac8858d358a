"""The optimiser against a NumPy Adam with global-norm clipping; fp32 state for bf16 params."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sgs_jax.rl.optimizer import OptimizerConfig, make_optimizer


def numpy_adam(params, grads_seq, lr, b1, b2, eps, clip):
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    p = {k: x.astype(np.float64) for k, x in params.items()}
    for t, grads in enumerate(grads_seq, 1):
        norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values()))
        factor = min(1.0, clip / norm)
        for k, g in grads.items():
            g = g * factor
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            p[k] = p[k] - lr * (m[k] / (1 - b1**t)) / (np.sqrt(v[k] / (1 - b2**t)) + eps)
    return p


def test_matches_numpy_adam_with_clipping():
    rng = np.random.default_rng(0)
    params = {"a": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=(5,)).astype(np.float32)}
    # Norms above and below the clip threshold of 1.0.
    grads_seq = [{k: (rng.normal(size=x.shape) * s).astype(np.float32) for k, x in params.items()} for s in (2.0, 0.05, 1.0)]
    config = OptimizerConfig(learning_rate=0.05)
    opt = make_optimizer(config)
    state, p = opt.init(params), jax.tree_util.tree_map(jnp.asarray, params)
    for grads in grads_seq:
        updates, state = opt.update(grads, state, p)
        p = optax.apply_updates(p, updates)
    expected = numpy_adam(params, grads_seq, 0.05, 0.9, 0.95, 1e-8, 1.0)
    for k in params:
        np.testing.assert_allclose(np.asarray(p[k]), expected[k], atol=1e-6, rtol=0)


def test_bf16_params_get_fp32_state_and_stay_bf16():
    params = {"w": jnp.ones((4, 4), jnp.bfloat16)}
    opt = make_optimizer(OptimizerConfig(learning_rate=0.5))
    state = opt.init(params)
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(state) if leaf.ndim} == {jnp.dtype(jnp.float32)}
    updates, state = opt.update({"w": jnp.full((4, 4), 0.1, jnp.bfloat16)}, state, params)
    new = optax.apply_updates(params, updates)
    assert new["w"].dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(new["w"], np.float32), 0.5, atol=1e-2)  # 1 - lr * sign(g)
