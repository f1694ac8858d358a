"""Tiny random `transformers` Llama checkpoints: the independent reference for parity tests."""

from __future__ import annotations

import numpy as np
import torch
import transformers

ROPE_CASES = {
    "none": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
}


def make_hf_model(rope="none", num_kv_heads=2, tie=False, seed=0, max_pos=32, **overrides):
    """A random fp32 LlamaForCausalLM (2 layers, hidden 32, 4 heads) in eval mode."""
    torch.manual_seed(seed)
    rope_parameters = {"rope_type": "default", "rope_theta": 10_000.0}
    if ROPE_CASES[rope]:
        rope_parameters = {**ROPE_CASES[rope], "rope_theta": 10_000.0}
    kwargs = dict(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=56,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_pos,
        rms_norm_eps=1e-6,
        rope_parameters=rope_parameters,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation="eager",
    )
    kwargs.update(overrides)
    config = transformers.LlamaConfig(**kwargs)
    model = transformers.LlamaForCausalLM(config).float().eval()
    # Random (not identity) norm scales so a layout mistake in them cannot hide.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def hf_logits(model, input_ids: np.ndarray, attention_mask=None, position_ids=None) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.as_tensor(np.asarray(input_ids), dtype=torch.long),
            attention_mask=None if attention_mask is None else torch.as_tensor(np.asarray(attention_mask), dtype=torch.long),
            position_ids=None if position_ids is None else torch.as_tensor(np.asarray(position_ids), dtype=torch.long),
        )
    return out.logits.float().numpy()
