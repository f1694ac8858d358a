"""sgs-export: a run's roles as Hugging Face checkpoints that `transformers` loads, with the
same logits as the run's weights (fp32, 1e-4) and the run's tokenizer and chat template."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from sgs_jax.cli import export as export_cli
from sgs_jax.models import ModelConfig, abstract_model, load_hf
from sgs_jax.models.tokenizer import encode_chat, load_tokenizer
from sgs_jax.sgs.testbed_pretrain import MODELS_DIR

TOL = 1e-4


def _input_ids(vocab: int) -> np.ndarray:
    return np.random.default_rng(0).integers(3, vocab, size=(2, 24), dtype=np.int32)


def _ours(state, ids):
    graphdef, _ = abstract_model(ModelConfig.from_hf_file(MODELS_DIR / "base"))
    return np.asarray(nnx.merge(graphdef, state)(ids))


def _transformers(path, ids, dtype=torch.float32):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(ids, dtype=torch.long)).logits.float().numpy()


def test_export_solver_matches_the_runs_weights(trained_run, tmp_path):
    workdir, weights = trained_run
    out = tmp_path / "solver"
    assert export_cli.main(["--run", str(workdir), "--role", "solver", "--out", str(out)]) == 0
    ids = _input_ids(1024)
    reference = _ours(weights["solver"], ids)
    np.testing.assert_allclose(_transformers(out, ids), reference, atol=TOL, rtol=0)
    # The trained Solver differs from the base: the export is not the starting checkpoint.
    assert np.abs(_transformers(MODELS_DIR / "base", ids) - reference).max() > 10 * TOL
    # Standard files, the run's tokenizer with its chat template, and what was exported.
    config = json.load(open(out / "config.json"))
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    exported, original = transformers.AutoTokenizer.from_pretrained(out), load_tokenizer(MODELS_DIR / "base")
    messages = [{"role": "user", "content": "Complete the following Lean 4 code:"}]
    assert exported.chat_template and encode_chat(exported, messages) == encode_chat(original, messages)
    assert json.load(open(out / "sgs_export.json"))["iteration"] == 1
    # The export is a checkpoint our own loader takes too (e.g. as model.checkpoint).
    np.testing.assert_allclose(np.asarray(load_hf(out)(ids)), reference, atol=TOL, rtol=0)


def test_export_other_roles_and_iterations(trained_run, tmp_path, capsys):
    workdir, weights = trained_run
    ids = _input_ids(1024)
    run = ["--run", str(workdir)]
    assert export_cli.main(run + ["--role", "conjecturer", "--out", str(tmp_path / "c")]) == 0
    np.testing.assert_allclose(_transformers(tmp_path / "c", ids), _ours(weights["conjecturer"], ids), atol=TOL, rtol=0)
    # The frozen Guide, re-saved: the same logits as the Guide checkpoint the run used.
    assert export_cli.main(run + ["--role", "guide", "--out", str(tmp_path / "g")]) == 0
    np.testing.assert_allclose(_transformers(tmp_path / "g", ids), _transformers(MODELS_DIR / "guide", ids), atol=TOL, rtol=0)
    # Iteration 0: the starting weights.
    assert export_cli.main(run + ["--iteration", "0", "--out", str(tmp_path / "s0")]) == 0
    np.testing.assert_allclose(_transformers(tmp_path / "s0", ids), _transformers(MODELS_DIR / "base", ids), atol=TOL, rtol=0)
    # bfloat16 for serving: the run's weights rounded to bf16 (compared in fp32 compute).
    assert export_cli.main(run + ["--dtype", "bfloat16", "--out", str(tmp_path / "bf16")]) == 0
    assert json.load(open(tmp_path / "bf16" / "config.json"))["dtype"] == "bfloat16"
    rounded = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), weights["solver"])
    np.testing.assert_allclose(_transformers(tmp_path / "bf16", ids), _ours(rounded, ids), atol=TOL, rtol=0)
    # A non-empty output needs --overwrite; unsaved iterations and bad roles are named.
    assert export_cli.main(run + ["--out", str(tmp_path / "c")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert export_cli.main(run + ["--iteration", "5", "--out", str(tmp_path / "x")]) == 2
    assert "iteration 5 is not saved" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        export_cli.main(run + ["--role", "critic", "--out", str(tmp_path / "x")])


def test_export_overwrite_replaces_weights(trained_run, tmp_path):
    workdir, weights = trained_run
    out = tmp_path / "e"
    run = ["--run", str(workdir), "--out", str(out)]
    assert export_cli.main(run + ["--max-shard-gib", "0.0001"]) == 0  # sharded, with an index
    assert (out / "model.safetensors.index.json").exists()
    assert export_cli.main(run + ["--overwrite"]) == 0  # one file: the old shards are gone
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    assert not (out / "model.safetensors.index.json").exists()
    ids = _input_ids(1024)
    np.testing.assert_allclose(_transformers(out, ids), _ours(weights["solver"], ids), atol=TOL, rtol=0)
