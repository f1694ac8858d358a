"""The testbed's tokenizer: a small byte-level BPE (Hugging Face `tokenizers`) trained on
the domain's text (statements, proofs, prompt templates, Guide replies), saved in Hugging
Face format with a chat template, so `AutoTokenizer.from_pretrained(dir)` loads it.

Byte-level means every string round-trips exactly (unicode `→ ∧ ₀`, newlines, indents).

    python -m sgs_jax.testbed.tokenizer --out sgs_jax/testbed/data/tokenizer
rebuilds the packaged files (fixed seed, so the result is reproducible).
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Iterable

TOKENIZER_DIR = pathlib.Path(__file__).resolve().parent / "data" / "tokenizer"
BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
VOCAB_SIZE = 1024

# User turn, then assistant turn ending in EOS; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}User: {{ message['content'] }}\n\n"
    "{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'] }}{{ eos_token }}"
    "{% else %}{{ message['content'] }}\n\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int = VOCAB_SIZE):
    """A `PreTrainedTokenizerFast` with byte-level BPE trained on `corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def domain_corpus(count: int = 300, seed: int = 2) -> list[str]:
    """Text the tokenizer is trained on: warm-start prompts and completions of all roles."""
    from sgs_jax.testbed.generator import DEFAULT_MIX, generate
    from sgs_jax.testbed.warmstart import build_sets

    items = generate(DEFAULT_MIX, count, seed, prefix="tok")
    sets = build_sets((("", it.statement.lean()) for it in items), seed=seed)
    texts = []
    for rows in sets.values():
        for row in rows:
            texts += [m["content"] for m in row["messages"]] + [row["completion"]]
    return texts


def save_tokenizer(tok, out: pathlib.Path) -> None:
    """Save in Hugging Face format with the chat template inside tokenizer_config.json
    (where every transformers version finds it) and a special_tokens_map.json."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = CHAT_TEMPLATE
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").unlink(missing_ok=True)


def load_tokenizer(path: pathlib.Path | str = TOKENIZER_DIR):
    """The packaged tokenizer (or one saved at `path`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train and save the testbed tokenizer.")
    ap.add_argument("--out", type=pathlib.Path, default=TOKENIZER_DIR)
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = ap.parse_args(argv)
    tok = train_tokenizer(domain_corpus(), args.vocab_size)
    save_tokenizer(tok, args.out)
    print(f"saved tokenizer ({len(tok)} tokens) to {args.out}")


if __name__ == "__main__":
    main()
