"""Chat prompts are encoded as the official pipeline does: template text, then no extra specials."""

import pytest
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from sgs_jax.models.tokenizer import TokenizerError, chat_prompt_text, decode, encode_chat, load_tokenizer

TEMPLATE = "{{ bos_token }} {% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}assistant{% endif %}"


@pytest.fixture
def tokenizer_dir(tmp_path):
    words = ["<pad>", "<s>", "</s>", "<unk>", "user", "assistant", "prove", "p", "q"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(tmp_path)
    return tmp_path


def test_encode_chat_adds_bos_once(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    messages = [{"role": "user", "content": "prove p"}]
    text = chat_prompt_text(tok, messages)
    assert text == "<s> user prove p assistant"
    ids = encode_chat(tok, messages)
    assert ids == [1, 4, 6, 7, 5]  # BOS from the template only, nothing added twice
    assert "prove" in decode(tok, ids) and "<s>" not in decode(tok, ids)


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="cannot load"):
        load_tokenizer(tmp_path / "nowhere")


def test_no_chat_template_is_a_clear_error(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    tok.chat_template = None
    with pytest.raises(TokenizerError, match="no chat template"):
        encode_chat(tok, [{"role": "user", "content": "p"}])
