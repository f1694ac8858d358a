"""`sgs-generate` end to end on a tiny checkpoint whose byte-level tokenizer decodes most
token sequences to invalid UTF-8; bad lines become error entries, nothing is lost."""

import json

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from sgs_jax.cli.generate import main
from sgs_jax.models import save_hf, tiny
from tests.sampling.conftest import random_model

# Byte-level symbols that stand for themselves: lead bytes 0xC0-0xFF and continuation
# bytes 0xA1-0xBF (without 0xAD), 94 of them, after 3 special tokens: vocabulary 97.
BYTES = [b for b in range(0xA1, 0x100) if b != 0xAD]
TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{chr(b): i + 3 for i, b in enumerate(BYTES)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = TEMPLATE
    assert len(fast) == 97
    save_hf(random_model(tiny(max_position_embeddings=512), seed=7), path, tokenizer=fast)
    return path


def test_generate_jsonl_with_errors_and_invalid_utf8(checkpoint, tmp_path, capsys):
    lines = [
        json.dumps({"prompt": "éé"}),
        json.dumps({"messages": [{"role": "user", "content": "ÿé"}]}),
        json.dumps({"prompt": ""}),
        "{not json",
        json.dumps({"prompt": "é" * 40}),  # 80 tokens > --max-total-len 64
        json.dumps({"other": 1}),
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ["--checkpoint", str(checkpoint), "--prompts", str(tmp_path / "in.jsonl"), "--out", str(out),
            "--num-samples", "2", "--temperature", "1.0", "--top-p", "0.95", "--top-k", "40",
            "--max-new-tokens", "8", "--max-total-len", "64", "--seed", "3", "--max-batch", "4"]
    assert main(argv) == 0
    results = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["index"] for r in results] == list(range(6))
    for r in results[:2]:
        assert len(r["samples"]) == 2
        for s in r["samples"]:
            assert set(s) == {"token_ids", "text", "logprobs", "finish_reason"}
            assert len(s["logprobs"]) == len(s["token_ids"]) and s["finish_reason"] in ("stop", "length")
    texts = "".join(s["text"] for r in results[:2] for s in r["samples"])
    assert "\ufffd" in texts  # invalid UTF-8 became replacement characters, not an error
    assert "empty" in results[2]["error"] and "not JSON" in results[3]["error"]
    assert "max_total_len" in results[4]["error"] and "prompt" in results[5]["error"]
    err = capsys.readouterr().err
    assert "samples finished" in err and "4 of 6 lines had errors" in err


def test_unknown_tokenizer_is_a_clear_error(checkpoint, tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"prompt": "é"}\n')
    argv = ["--checkpoint", str(checkpoint), "--tokenizer", str(tmp_path / "missing"), "--prompts", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o.jsonl")]
    assert main(argv) == 2
    assert "cannot load a tokenizer" in capsys.readouterr().err
