"""Model configuration of the LLaMA-family decoder, built from a Hugging Face `config.json`.

`ModelConfig` holds the architecture (what a checkpoint fixes) and the run-time numerics
(dtypes, rematerialisation, attention backend: what a run chooses). It reads both the
older `config.json` layout (`rope_theta` and `rope_scaling` at top level, as the DeepSeek
checkpoints have) and the current one (`rope_parameters`), and writes the current one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp

# The RoPE scaling types Hugging Face defines for Llama, besides plain RoPE ("default").
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
REMAT_POLICIES = ("none", "full", "dots", "offload")
ATTENTION_IMPLEMENTATIONS = ("auto", "native", "blockwise", "xla", "cudnn", "splash")
LAYER_LOOPS = ("auto", "scan", "unrolled")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture and numerics of one decoder.

    rope_scaling is stored as a sorted tuple of (key, value) pairs so the config stays
    hashable (NNX keeps it as static graph data); `rope_params()` returns it as a dict.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # empty = plain RoPE
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    # Run-time numerics, not part of the checkpoint.
    dtype: str = "float32"  # activations / matmul compute
    param_dtype: str = "float32"  # stored parameters
    remat_policy: str = "none"  # per-layer rematerialisation in training: none | full | dots (save matmul and native attention outputs) | offload (full, saved layer inputs in host memory)
    attention: str = "auto"  # attention backend (sgs_jax.models.attention): auto | native | blockwise | xla | cudnn | splash
    layer_loop: str = "auto"  # how the full forward (training) runs the layers: scan (one lax.scan, a program the same size at any depth) | unrolled (traced one after another: on XLA:CPU each layer's saved activations keep buffers of their own, not stacks) | auto (unrolled on one CPU device, else scan)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope type {self.rope_type!r}; supported: {ROPE_TYPES}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy must be one of {REMAT_POLICIES}, got {self.remat_policy!r}")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLEMENTATIONS}, got {self.attention!r}")
        if self.layer_loop not in LAYER_LOOPS:
            raise ValueError(f"layer_loop must be one of {LAYER_LOOPS}, got {self.layer_loop!r}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"{name} must be one of {sorted(_DTYPES)}, got {getattr(self, name)!r}")

    # ---- derived -------------------------------------------------------------------
    @property
    def rope_type(self) -> str:
        return self.rope_params().get("rope_type", "default")

    def rope_params(self) -> dict[str, Any]:
        """RoPE scaling parameters as a dict (HF key names); {} for plain RoPE."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.rope_scaling}

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def weight_dtype(self):
        return _DTYPES[self.param_dtype]

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Parameter count (embeddings and head included)."""
        e, m, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = e * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        per_layer = attn + 3 * e * m + 2 * e
        head = 0 if self.tie_word_embeddings else e * v
        return v * e + self.num_layers * per_layer + e + head

    # ---- Hugging Face config.json -----------------------------------------------------
    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **runtime: Any) -> "ModelConfig":
        """Build from a `config.json` dict (old `rope_scaling` or new `rope_parameters` layout).

        `runtime` sets dtype, param_dtype, remat_policy, attention and layer_loop.
        """
        model_type = hf.get("model_type", "llama")
        if model_type != "llama":
            raise ValueError(f"expected a Llama checkpoint (model_type 'llama'), got {model_type!r}")
        if hf.get("attention_bias") or hf.get("mlp_bias"):
            raise ValueError("attention_bias / mlp_bias checkpoints are not supported (this family has none)")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"only SwiGLU (hidden_act 'silu') is supported, got {hf.get('hidden_act')!r}")
        num_heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
        rope_theta, rope = _rope_from_hf(hf)
        eos = hf.get("eos_token_id")
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=_freeze(rope),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
            pad_token_id=hf.get("pad_token_id"),
            **runtime,
        )

    @classmethod
    def from_hf_file(cls, path: str | os.PathLike, **runtime: Any) -> "ModelConfig":
        """Read `path` (a checkpoint directory or a config.json file)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path, encoding="utf-8") as f:
            return cls.from_hf_dict(json.load(f), **runtime)

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` dict in the current `transformers` layout (`rope_parameters`)."""
        rope = {"rope_type": "default", **self.rope_params(), "rope_theta": self.rope_theta}
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
            "dtype": self.param_dtype,
        }


def _freeze(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


def _rope_from_hf(hf: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """(rope_theta, scaling params without theta) from either config.json layout."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = params.pop("rope_theta", None) or hf.get("rope_theta", 10_000.0)
    if "type" in params:  # older files name it "type"
        params.setdefault("rope_type", params.pop("type"))
    rope_type = params.setdefault("rope_type", "default")
    if rope_type == "default":
        return theta, {}
    if rope_type in ("llama3", "yarn"):
        # As transformers does: a top-level original_max_position_embeddings wins, and the
        # pretraining length defaults to max_position_embeddings.
        if "original_max_position_embeddings" in hf:
            params["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
        params.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings", 2048))
    return theta, params


# ---- presets --------------------------------------------------------------------------


def deepseek_prover_v2_7b(**runtime: Any) -> ModelConfig:
    """DeepSeek-Prover-V2-7B's architecture (SPEC Section 2), for planning and random init.

    Real runs load the checkpoint's own `config.json` with `load_hf`, which also brings its
    RoPE scaling and context length; those two fields here are only placeholders.
    """
    runtime.setdefault("dtype", "bfloat16")
    runtime.setdefault("param_dtype", "bfloat16")
    return ModelConfig(
        vocab_size=102_400,
        hidden_size=4096,
        intermediate_size=11_008,
        num_layers=30,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        max_position_embeddings=32_768,
        rms_norm_eps=1e-6,
        rope_theta=10_000.0,
        tie_word_embeddings=False,
        bos_token_id=100_000,
        eos_token_id=100_001,
        **runtime,
    )


def tiny(**overrides: Any) -> ModelConfig:
    """A few-kilobyte model for unit tests (GQA: 4 heads over 2 KV heads)."""
    fields = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


PRESETS = {"deepseek-prover-v2-7b": deepseek_prover_v2_7b, "tiny": tiny}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named preset: one of `PRESETS`."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name](**overrides)
