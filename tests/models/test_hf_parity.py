"""Parity with `transformers.LlamaForCausalLM` (PyTorch CPU, fp32): load, forward, export.

Tolerance: max |logit difference| <= 1e-4 in fp32.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from sgs_jax.models import CheckpointError, ModelConfig, load_hf, save_hf
from tests.models.hf_reference import ROPE_CASES, hf_logits, make_hf_model

TOL = 1e-4


def _ids(batch=2, seq=24, vocab=101, seed=0):
    return np.random.default_rng(seed).integers(3, vocab, size=(batch, seq), dtype=np.int32)


CASES = [(rope, kv, tie) for rope in ROPE_CASES for kv, tie in [(4, False), (2, True)]]


@pytest.mark.parametrize("rope,num_kv_heads,tie", CASES)
def test_load_matches_transformers(tmp_path, rope, num_kv_heads, tie):
    hf = make_hf_model(rope, num_kv_heads=num_kv_heads, tie=tie, max_pos=16 if rope == "dynamic" else 32)
    hf.save_pretrained(tmp_path)
    model = load_hf(tmp_path, dtype=jnp.float32)
    ids = _ids()  # seq 24 > max_pos 16 for dynamic: exercises the NTK rescaling
    ours = np.asarray(model(jnp.asarray(ids)))
    assert ours.shape == (2, 24, 101)
    np.testing.assert_allclose(ours, hf_logits(hf, ids), atol=TOL, rtol=0)


@pytest.mark.parametrize("rope", ["none", "yarn"])
def test_save_reloads_in_transformers(tmp_path, rope):
    hf = make_hf_model(rope, num_kv_heads=2)
    hf.save_pretrained(tmp_path / "in")
    model = load_hf(tmp_path / "in")
    save_hf(model, tmp_path / "out", max_shard_bytes=20_000)  # forces a sharded index
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").float().eval()
    ids = _ids(seed=1)
    np.testing.assert_allclose(hf_logits(reloaded, ids), hf_logits(hf, ids), atol=TOL, rtol=0)
    # and our own round trip
    again = load_hf(tmp_path / "out")
    np.testing.assert_allclose(np.asarray(again(jnp.asarray(ids))), hf_logits(hf, ids), atol=TOL, rtol=0)


def test_padded_batch_matches_transformers_with_positions(tmp_path):
    hf = make_hf_model("none")
    hf.save_pretrained(tmp_path)
    model = load_hf(tmp_path)
    ids = _ids(seq=10)
    mask = np.ones_like(ids)
    mask[0, :3] = 0  # left padding on row 0
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(positions)))
    ref = hf_logits(hf, ids, attention_mask=mask, position_ids=positions)
    np.testing.assert_allclose(ours[mask == 1], ref[mask == 1], atol=TOL, rtol=0)


def test_old_style_config_json_is_read(tmp_path):
    """DeepSeek checkpoints carry `rope_theta` / `rope_scaling` at top level (older transformers)."""
    hf = make_hf_model("linear")
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = {"type": rope["rope_type"], "factor": rope["factor"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    config = ModelConfig.from_hf_file(tmp_path)
    assert config.rope_type == "linear" and config.rope_params()["factor"] == 2.0
    ids = _ids()
    np.testing.assert_allclose(np.asarray(load_hf(tmp_path)(jnp.asarray(ids))), hf_logits(hf, ids), atol=TOL, rtol=0)


def test_corrupted_checkpoint_gives_clear_error(tmp_path):
    hf = make_hf_model("none")
    hf.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated
    with pytest.raises(ValueError, match="truncated"):
        load_hf(tmp_path)


def test_missing_tensor_gives_clear_error(tmp_path):
    from sgs_jax.models import safetensors_io

    hf = make_hf_model("none")
    hf.save_pretrained(tmp_path)
    tensors = dict(safetensors_io.iter_tensors(tmp_path / "model.safetensors"))
    tensors = {k: np.array(v) for k, v in tensors.items() if "layers.1.mlp.up_proj" not in k}
    specs = [(k, v.shape, v.dtype) for k, v in tensors.items()]
    safetensors_io.write_file(tmp_path / "model.safetensors", specs, tensors.__getitem__)
    with pytest.raises(CheckpointError, match="lacks parameters"):
        load_hf(tmp_path)


def test_bf16_load(tmp_path):
    hf = make_hf_model("none")
    hf.to(dtype=__import__("torch").bfloat16).save_pretrained(tmp_path)
    model = load_hf(tmp_path, dtype=jnp.bfloat16)
    assert model.embed.embedding[...].dtype == jnp.bfloat16
    logits = model(jnp.asarray(_ids()))
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
