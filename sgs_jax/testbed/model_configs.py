"""Tiny LLaMA configurations for the testbed, sized for a 2-core CPU.

Each is a Hugging Face `LlamaConfig` dict (what `config.json` holds); the vocabulary and
special ids come from the packaged tokenizer, so they always agree with it.
"""

from __future__ import annotations

import functools

# name -> (layers, hidden, MLP, heads, KV heads); head dim = hidden / heads.
SIZES = {
    "nano": (2, 64, 176, 4, 2),
    "micro": (3, 128, 352, 4, 2),
    "mini": (4, 256, 688, 8, 4),
    "small": (4, 192, 512, 6, 2),  # 2.0M parameters: the pair in data/models_small
}


@functools.lru_cache(maxsize=1)
def _tokenizer_ids() -> dict:
    from sgs_jax.testbed.tokenizer import load_tokenizer

    tok = load_tokenizer()
    return {"vocab_size": len(tok), "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}


def llama_config(name: str = "nano", max_position_embeddings: int = 2048) -> dict:
    """The `config.json` dict of a tiny LLaMA (`LlamaForCausalLM`) for the testbed."""
    if name not in SIZES:
        raise ValueError(f"unknown testbed model size {name!r}; known: {sorted(SIZES)}")
    layers, hidden, mlp, heads, kv_heads = SIZES[name]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": mlp,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        **_tokenizer_ids(),
    }
