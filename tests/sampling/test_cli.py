"""`sgs-generate` end to end on a tiny checkpoint whose byte-level tokenizer decodes most
token sequences to invalid UTF-8; bad lines become error entries, nothing is lost."""

import json

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from sgs_jax.cli import generate as generate_cli
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
        json.dumps({"prompt": "éé"}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "ÿé"}]}).encode(),
        json.dumps({"prompt": ""}).encode(),
        b"",  # blank
        b"{not json",
        json.dumps({"prompt": "é" * 40}).encode(),  # 80 tokens > --max-total-len 64
        b'{"prompt": "\xff\xfe"}',  # bytes that are not UTF-8
        b"   ",  # whitespace only
        json.dumps({"other": 1}).encode(),
    ]
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out.jsonl"
    argv = ["--checkpoint", str(checkpoint), "--prompts", str(tmp_path / "in.jsonl"), "--out", str(out),
            "--num-samples", "2", "--temperature", "1.0", "--top-p", "0.95", "--top-k", "40",
            "--max-new-tokens", "8", "--max-total-len", "64", "--seed", "3", "--max-batch", "4"]
    assert main(argv) == 0
    results = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in results] == list(range(1, 10))  # one record per input line, in order
    for r in results[:2]:
        assert len(r["samples"]) == 2
        for s in r["samples"]:
            assert set(s) == {"token_ids", "text", "logprobs", "finish_reason"}
            assert len(s["logprobs"]) == len(s["token_ids"]) and s["finish_reason"] in ("stop", "length")
    texts = "".join(s["text"] for r in results[:2] for s in r["samples"])
    assert "\ufffd" in texts  # invalid UTF-8 the model produced became replacement characters
    errors = [r.get("error", "") for r in results]
    assert "empty" in errors[2] and "line 4 is blank" in errors[3] and "line 5 is not JSON" in errors[4]
    assert "max_total_len" in errors[5] and "line 7 is not valid UTF-8 (byte 0xff" in errors[6]
    assert "line 8 is blank" in errors[7] and "prompt" in errors[8]
    err = capsys.readouterr().err
    assert "samples finished" in err and "7 of 9 lines had errors" in err


def test_results_are_written_as_they_finish(checkpoint, tmp_path, monkeypatch):
    """Each record reaches the file (flushed) while later prompts still generate, so a
    killed run keeps what was done."""
    real = generate_cli.generate_records
    out = tmp_path / "out.jsonl"
    written = []  # lines in the file after each finished record

    def spy(*args, on_record, **kwargs):
        def record(position, result):
            on_record(position, result)
            written.append(len(out.read_text(encoding="utf-8").splitlines()))

        return real(*args, on_record=record, **kwargs)

    monkeypatch.setattr(generate_cli, "generate_records", spy)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"prompt": "é" * n}) + "\n" for n in range(1, 7)), encoding="utf-8")
    argv = ["--checkpoint", str(checkpoint), "--prompts", str(tmp_path / "in.jsonl"), "--out", str(out),
            "--num-samples", "2", "--max-new-tokens", "12", "--max-total-len", "64", "--max-batch", "4", "--no-progress"]
    assert main(argv) == 0
    assert len(written) == 6 and written == sorted(written) and written[-1] == 6
    assert written[-2] >= 1  # lines were on disk before the last prompt finished


@pytest.mark.parametrize(
    "files, message",
    [(None, "does not exist"), ([], "is empty"), (["tokenizer.json"], "has no config.json")],
)
def test_bad_checkpoint_directory_says_so_plainly(tmp_path, capsys, files, message):
    checkpoint = tmp_path / "ckpt"
    if files is not None:
        checkpoint.mkdir()
        for name in files:
            (checkpoint / name).write_text("{}")
    (tmp_path / "in.jsonl").write_text('{"prompt": "é"}\n')
    argv = ["--checkpoint", str(checkpoint), "--prompts", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o.jsonl")]
    assert main(argv) == 2
    assert f"sgs-generate: checkpoint directory {str(checkpoint)!r} {message}" in capsys.readouterr().err


def test_unwritable_out_fails_before_any_work(checkpoint, tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"prompt": "é"}\n')
    argv = ["--checkpoint", str(checkpoint), "--prompts", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "no" / "o.jsonl")]
    assert main(argv) == 2
    assert "No such file or directory" in capsys.readouterr().err
    argv[-1] = str(tmp_path / "in.jsonl")
    assert main(argv) == 2
    assert "is the input file" in capsys.readouterr().err
    assert (tmp_path / "in.jsonl").read_text() == '{"prompt": "é"}\n'


def test_unknown_tokenizer_is_a_clear_error(checkpoint, tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"prompt": "é"}\n')
    argv = ["--checkpoint", str(checkpoint), "--tokenizer", str(tmp_path / "missing"), "--prompts", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o.jsonl")]
    assert main(argv) == 2
    assert "cannot load a tokenizer" in capsys.readouterr().err
