"""The checkpoint's tokenizer and chat template, encoded as the official pipeline does.

Chat prompts: the template is applied as text with the generation prompt, then tokenised
*without* adding special tokens again (the template already holds BOS).
"""

from __future__ import annotations

import os
from typing import Sequence

# The project uses transformers for tokenizers and chat templates only; without PyTorch
# (the main job's install) its import-time advice that models are unavailable is noise.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import transformers  # noqa: E402


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded or lacks what a role needs (e.g. a chat template)."""


def load_tokenizer(path: str | os.PathLike) -> transformers.PreTrainedTokenizerBase:
    """Load the tokenizer saved with a checkpoint (a local directory, or a hub id where reachable)."""
    try:
        return transformers.AutoTokenizer.from_pretrained(os.fspath(path))
    except (OSError, ValueError, TypeError) as err:
        raise TokenizerError(f"cannot load a tokenizer from {os.fspath(path)!r}: {err}") from err


def chat_prompt_text(tokenizer, messages: Sequence[dict[str, str]]) -> str:
    """The chat template applied to `messages` with the generation prompt, as text."""
    if not getattr(tokenizer, "chat_template", None):
        raise TokenizerError("this tokenizer has no chat template; give plain prompts instead of messages")
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


def encode_chat(tokenizer, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt: template text, then tokenised without special tokens."""
    return list(tokenizer.encode(chat_prompt_text(tokenizer, messages), add_special_tokens=False))


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of a plain prompt, with the tokenizer's own special tokens (BOS)."""
    return list(tokenizer.encode(text, add_special_tokens=True))


def decode(tokenizer, token_ids: Sequence[int]) -> str:
    """Text of generated ids (special tokens dropped); invalid UTF-8 becomes U+FFFD, never an error."""
    return tokenizer.decode(list(token_ids), skip_special_tokens=True)
