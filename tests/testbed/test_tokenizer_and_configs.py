from sgs_jax.testbed.model_configs import SIZES, llama_config
from sgs_jax.testbed.tokenizer import load_tokenizer


def test_tokenizer_roundtrip_and_specials():
    tok = load_tokenizer()
    text = "theorem x (p q : Prop) (h₀ : p → q) : ¬¬p ∧ q ↔ True := by\n  intro h\n  exact ⟨h.1, h₀⟩"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 1.5  # BPE merges the domain's words
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)


def test_chat_template():
    tok = load_tokenizer()
    msgs = [{"role": "user", "content": "Complete the following Lean 4 code:"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        "<s>User: Complete the following Lean 4 code:\n\nAssistant:"
    full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "ok"}], tokenize=False)
    assert full.endswith("Assistant: ok</s>")


def test_llama_configs_match_tokenizer():
    from transformers import LlamaConfig

    tok = load_tokenizer()
    for name in SIZES:
        cfg = LlamaConfig(**llama_config(name))
        assert cfg.vocab_size == len(tok) and cfg.eos_token_id == tok.eos_token_id
        assert cfg.hidden_size % cfg.num_attention_heads == 0 and cfg.num_hidden_layers <= 4
