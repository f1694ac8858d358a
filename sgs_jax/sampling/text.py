"""Text in, completions out: prompts as strings or chat messages, encoded with a tokenizer.

`generate_text` is the helper for library callers; `generate_records` serves the CLI: it
takes JSONL-style records, turns every bad one into an error entry (nothing is lost and
nothing raises) and generates the rest in one batched call.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, Union

from sgs_jax.models.tokenizer import TokenizerError, encode_chat, encode_text
from sgs_jax.sampling.params import Completions, SamplingParams
from sgs_jax.sampling.sampler import Sampler

Messages = Sequence[Mapping[str, str]]
TextPrompt = Union[str, Messages]


def encode_prompt(tokenizer, prompt: TextPrompt) -> list[int]:
    """Token ids of a plain prompt (`encode_text`, with BOS) or of chat messages (`encode_chat`)."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("empty prompt")
        return encode_text(tokenizer, prompt)
    messages = list(prompt)
    if not messages or not all(isinstance(m, Mapping) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str) for m in messages):
        raise ValueError("messages must be a non-empty list of {'role': str, 'content': str}")
    return encode_chat(tokenizer, messages)


def generate_text(sampler: Sampler, model_or_params, tokenizer, prompts: Sequence[TextPrompt], params: SamplingParams, **kwargs) -> Completions:
    """Encode `prompts` (strings or chat message lists) and generate; completions carry text."""
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    return sampler.generate(model_or_params, ids, params, tokenizer=tokenizer, **kwargs)


def record_prompt(record: Any) -> TextPrompt:
    """The prompt of one input record: {"prompt": str} or {"messages": [...]}; a record that
    is an exception (a line that could not be read) is raised as itself."""
    if isinstance(record, Exception):
        raise record
    if not isinstance(record, Mapping):
        raise ValueError("each line must be a JSON object")
    if "messages" in record:
        if not isinstance(record["messages"], list):
            raise ValueError('"messages" must be a list')
        return record["messages"]
    if isinstance(record.get("prompt"), str):
        return record["prompt"]
    raise ValueError('each line needs "prompt" (a string) or "messages" (a list)')


def _samples_json(out: Completions) -> list[dict[str, Any]]:
    """One JSON dict per row of `out` (token_ids, text, logprobs, finish_reason)."""
    return [
        {"token_ids": out.tokens(i).tolist(), "text": out.text(i), "logprobs": out.row_logprobs(i).tolist(), "finish_reason": reason}
        for i, reason in enumerate(out.finish_reasons)
    ]


def generate_records(
    sampler: Sampler,
    model_or_params,
    tokenizer,
    records: Sequence[Any],
    params: SamplingParams,
    progress: Callable[[int, int], None] | None = None,
    on_record: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """One result dict per input record, in order: {"samples": [...]} where each sample
    holds token_ids, text, logprobs, finish_reason; or {"error": reason}.

    on_record(position, result) is called once per record as soon as its result is known
    (errors first, then each prompt when all its samples finish), so callers can write
    results while the rest still generates.
    """
    results: list[dict[str, Any] | None] = [None] * len(records)

    def finish(position: int, result: dict[str, Any]) -> None:
        results[position] = result
        if on_record is not None:
            on_record(position, result)

    good: list[int] = []
    ids: list[list[int]] = []
    for i, record in enumerate(records):
        try:
            encoded = encode_prompt(tokenizer, record_prompt(record))
        except (ValueError, TokenizerError) as err:
            finish(i, {"error": str(err)})
            continue
        good.append(i)
        ids.append(encoded)
    problems = sampler.validate_prompts(ids, params)
    for j, why in problems.items():
        finish(good[j], {"error": why})
    keep = [j for j in range(len(ids)) if j not in problems]
    sampler.generate(
        model_or_params, [ids[j] for j in keep], params, tokenizer=tokenizer, progress=progress,
        on_prompt_done=lambda n, samples: finish(good[keep[n]], {"samples": _samples_json(samples)}),
    )
    return results  # type: ignore[return-value]  # every record was finished above
