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
    from safetensors.numpy import load_file, save_file

    hf = make_hf_model("none")
    hf.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if "layers.1.mlp.up_proj" not in k}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="lacks parameters"):
        load_hf(tmp_path)


@pytest.mark.parametrize("module", ["q_proj", "k_proj", "o_proj", "up_proj", "down_proj", "input_layernorm"])
def test_shard_reads_equal_slices_of_the_whole_tensor(tmp_path, module):
    """`read_our_slice` reads only a shard's box of the file; it equals slicing the whole HF
    tensor converted by hand (torch Linear [out, in] -> ours) for shards on every axis."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from sgs_jax.models.hf_io import hf_shape, read_our_slice

    config = ModelConfig(vocab_size=32, hidden_size=12, intermediate_size=20, num_layers=1, num_heads=4,
                         num_kv_heads=2, head_dim=6)
    e, h, kv, d, f = 12, 4, 2, 6, 20
    ours_shape = {"q_proj": (e, h, d), "k_proj": (e, kv, d), "o_proj": (h, d, e), "up_proj": (e, f),
                  "down_proj": (f, e), "input_layernorm": (e,)}[module]
    path = ("layers", *{"input_layernorm": ("attn_norm", "scale")}.get(module, ("attn" if module[0] in "qko" else "mlp", module, "kernel")))
    hf = np.random.default_rng(0).standard_normal(hf_shape(path, ours_shape)).astype(np.float32)
    if module in ("q_proj", "k_proj"):
        whole = hf.T.reshape(e, ours_shape[1], d)
    elif module == "o_proj":
        whole = hf.T.reshape(h, d, e)
    elif module.endswith("proj"):
        whole = hf.T
    else:
        whole = hf
    save_file({"t": hf}, tmp_path / "t.safetensors")
    rng = np.random.default_rng(1)
    with safe_open(tmp_path / "t.safetensors", framework="numpy") as file:
        source = file.get_slice("t")
        for _ in range(12):
            index = []
            for n in ours_shape:
                a = int(rng.integers(0, n))
                index.append(slice(None) if rng.random() < 0.3 else slice(a, int(rng.integers(a + 1, n + 1))))
            index = tuple(index)
            np.testing.assert_array_equal(read_our_slice(path, source, index, ours_shape, config), whole[index])


def test_bf16_load(tmp_path):
    hf = make_hf_model("none")
    hf.to(dtype=__import__("torch").bfloat16).save_pretrained(tmp_path)
    model = load_hf(tmp_path, dtype=jnp.bfloat16)
    assert model.embed.embedding[...].dtype == jnp.bfloat16
    logits = model(jnp.asarray(_ids()))
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
