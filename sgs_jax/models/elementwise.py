"""The SwiGLU gate with a hand-written VJP that keeps only its inputs.

Left to autodiff, silu(gate) * up keeps sigmoid(gate), silu(gate) and more beside gate and
up, each as large as the MLP's activations. Inside the training step's layer scan with
`remat_policy="none"`, every residual is a stacked [layers, B, T, ...] buffer written in the
forward and read in the backward: 6 MLP-wide per layer. This VJP keeps gate and up and
recomputes the sigmoid in the backward, which leaves 3 (gate, up, and their product, the
down projection's input): less activation memory on every platform and, on CPU, less
memory traffic (`docs/training_benchmark.md`, "Fewer saved activations").

Its forward is the same operations in the same dtypes as before, so inference and the HF
parity are unchanged; its gradients equal autodiff's to float rounding
(`tests/models/test_elementwise.py`).

RMSNorm was tried the same way (keeping x and the [..., 1] inverse RMS) and not kept: on
CPU it added about 1% at best, and compiled for TPU (`sgs-plan --aot v5p:2x2x2 --config
configs/sgs.py:paper --num-layers 2`, offload remat) its fp32 backward raised the
micro-step's temporaries from 3.78 to 4.38 GiB per chip, where autodiff's version fuses.
"""

from __future__ import annotations

import jax


@jax.custom_vjp
def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """silu(gate) * up, elementwise (the Llama MLP's gate; any shape, any float dtype)."""
    return jax.nn.silu(gate) * up


def _swiglu_fwd(gate, up):
    return swiglu(gate, up), (gate, up)


def _swiglu_bwd(residuals, dy):
    gate, up = residuals
    sig = jax.nn.sigmoid(gate)
    silu = gate * sig
    # silu'(g) = sig + g sig (1 - sig) = sig (1 + g (1 - sig)).
    return dy * up * sig * (1 + gate * (1 - sig)), dy * silu


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)
