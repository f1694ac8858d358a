"""Supervised fine-tuning on JSONL (prompt, completion) pairs: the Guide stage (method.md
§2) and warm starts of any role.

Each JSONL line is either {"messages": [{"role": "user", "content": ...}, ...],
"completion": ...} (the testbed's warm-start format) or {"prompt": ..., "completion": ...}
("reply" is accepted for "completion"). The prompt goes through the tokenizer's chat
template with the generation prompt; the completion is tokenised without special tokens
and ends with EOS; the loss is the NLL of the completion tokens only ("sft" objective).

The Guide stage reports the fraction of held-out prompts whose greedy reply
`sgs_jax.sgs.rewards.parse_guide_reply` accepts, before and after training (the paper:
54.7% -> over 99%). A released Guide checkpoint in Hugging Face format is evaluated the
same way with `--epochs 0`.

    python -m sgs_jax.rl.sft --data guide.jsonl --model CKPT_DIR --out OUT_DIR \
        --epochs 1 --lr 1e-5 --batch-size 32 --micro-batch-size 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
import random
from typing import Callable, Sequence

from sgs_jax.models.tokenizer import encode_chat
from sgs_jax.rl.batching import SequenceExample
from sgs_jax.rl.train_step import Trainer
from sgs_jax.sampling import Sampler, SamplingParams
from sgs_jax.sgs.rewards import parse_guide_reply
from sgs_jax.sgs.types import ChatMessage

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SftPair:
    """A chat prompt (one or more messages) and the completion to learn."""

    messages: tuple[ChatMessage, ...]
    completion: str


@dataclasses.dataclass(frozen=True)
class SftReport:
    """before / after: held-out well-formatted fraction in [0, 1] (None when not measured).
    losses: the loss of every optimiser step, in order."""

    before: float | None
    after: float | None
    num_train: int
    num_heldout: int
    losses: tuple[float, ...]


def parse_sft_line(line: str, where: str = "line") -> SftPair:
    """One JSONL line -> SftPair; ValueError naming `where` on anything malformed."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err})") from err
    return sft_pair_from_row(row, where)


def sft_pair_from_row(row, where: str = "row") -> SftPair:
    """A decoded JSONL row (see the module docstring) -> SftPair; ValueError naming `where`."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    completion = row.get("completion", row.get("reply"))
    if not isinstance(completion, str) or not completion:
        raise ValueError(f"{where}: needs a non-empty string 'completion' (or 'reply')")
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
        ):
            raise ValueError(f"{where}: 'messages' must be a non-empty list of {{'role': str, 'content': str}}")
        return SftPair(tuple(ChatMessage(m["role"], m["content"]) for m in messages), completion)
    if isinstance(row.get("prompt"), str) and row["prompt"]:
        return SftPair((ChatMessage("user", row["prompt"]),), completion)
    raise ValueError(f"{where}: needs 'messages' or a non-empty string 'prompt'")


def read_sft_jsonl(path: str | pathlib.Path) -> list[SftPair]:
    """All pairs of a JSONL file (blank lines skipped); ValueError with the line number."""
    path = pathlib.Path(path)
    pairs = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                pairs.append(parse_sft_line(line, f"{path}:{number}"))
    return pairs


def split_heldout(pairs: Sequence[SftPair], num_heldout: int, seed: int = 0) -> tuple[list[SftPair], list[SftPair]]:
    """(train, held-out) after a seeded shuffle; held-out gets `num_heldout` pairs."""
    if not 0 <= num_heldout <= len(pairs):
        raise ValueError(f"cannot hold out {num_heldout} of {len(pairs)} pairs")
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    held = [pairs[i] for i in order[:num_heldout]]
    return [pairs[i] for i in order[num_heldout:]], held


def prompt_ids(tokenizer, pair: SftPair) -> list[int]:
    return encode_chat(tokenizer, [m.as_dict() for m in pair.messages])


def sft_example(tokenizer, pair: SftPair) -> SequenceExample:
    """Chat-template prompt ids + completion ids + EOS, weight 1."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token; SFT completions must end with one")
    completion = list(tokenizer.encode(pair.completion, add_special_tokens=False)) + [tokenizer.eos_token_id]
    return SequenceExample(tuple(prompt_ids(tokenizer, pair)), tuple(completion))


def guide_format_rate(model, tokenizer, pairs: Sequence[SftPair], max_new_tokens: int, sampler: Sampler | None = None) -> float:
    """Fraction of `pairs` whose greedy reply (the `sgs_jax.sampling` engine at temperature
    0) `parse_guide_reply` accepts; 0 for no pairs."""
    if not pairs:
        return 0.0
    sampler = sampler or Sampler(model.config, max_batch=min(64, len(pairs)))
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    completions = sampler.generate(model, [prompt_ids(tokenizer, p) for p in pairs], params, tokenizer=tokenizer)
    return sum(parse_guide_reply(text) is not None for text in completions.texts) / len(pairs)


def run_sft(
    trainer: Trainer,
    tokenizer,
    train_pairs: Sequence[SftPair],
    epochs: int,
    heldout: Sequence[SftPair] = (),
    evaluate: Callable[[object, object, Sequence[SftPair]], float] | None = None,
    seed: int = 0,
) -> SftReport:
    """Train `trainer` (objective "sft") for `epochs` epochs over `train_pairs`, measuring
    `evaluate(model, tokenizer, heldout)` before and after when given. The optimiser
    state carries over between epochs (one fine-tuning run), unlike SGS iterations."""
    if trainer.config.objective != "sft":
        raise ValueError(f"run_sft needs a trainer with objective 'sft', got {trainer.config.objective!r}")
    eos = tokenizer.eos_token_id
    if eos not in trainer.model.config.eos_token_ids:
        raise ValueError(f"tokenizer EOS {eos} is not among the model's EOS ids {trainer.model.config.eos_token_ids}")
    examples = [sft_example(tokenizer, p) for p in train_pairs]
    measure = (lambda: evaluate(trainer.model, tokenizer, heldout)) if evaluate and heldout else (lambda: None)
    before = measure()
    losses = []
    trainer.reset_optimizer()
    for epoch in range(epochs):
        order = list(range(len(examples)))
        random.Random(seed + epoch).shuffle(order)
        size = trainer.config.batch_size
        for start in range(0, len(order), size):
            losses.append(trainer.step([examples[i] for i in order[start : start + size]])["loss"])
    return SftReport(before, measure(), len(train_pairs), len(heldout), tuple(losses))


def fine_tune(
    model,
    rows: Sequence,
    tokenizer,
    mesh=None,
    learning_rate: float = 1e-5,
    epochs: int = 1,
    batch_size: int = 32,
    micro_batch_size: int = 4,
    max_seq_len: int | None = None,
    seed: int = 0,
):
    """Fine-tune `model` in place on `rows` (dicts in a JSONL format of this module, or
    SftPair) with the "sft" objective and return it (its parameters now the trained ones).
    max_seq_len defaults to the longest example, so nothing is cut or rejected."""
    from sgs_jax.rl.optimizer import OptimizerConfig
    from sgs_jax.rl.train_step import TrainConfig

    pairs = [r if isinstance(r, SftPair) else sft_pair_from_row(r, f"row {i}") for i, r in enumerate(rows)]
    if not pairs:
        raise ValueError("fine_tune needs at least one (prompt, completion) row")
    longest = max(sft_example(tokenizer, p).num_inputs for p in pairs)
    config = TrainConfig(
        objective="sft", batch_size=batch_size, micro_batch_size=min(micro_batch_size, batch_size),
        max_seq_len=max_seq_len or longest, optimizer=OptimizerConfig(learning_rate=learning_rate),
    )
    trainer = Trainer(model, config, mesh)
    losses = run_sft(trainer, tokenizer, pairs, epochs, seed=seed).losses
    tenth = max(1, len(losses) // 10)  # the curve a long build shows in its log
    log.info("fine_tune: %d steps over %d rows, mean loss %.4f over the first tenth -> %.4f over the last",
             len(losses), len(pairs), sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth)
    return trainer.model


def main(argv: list[str] | None = None) -> None:
    import jax

    from sgs_jax.models import load_hf, save_hf
    from sgs_jax.models.tokenizer import load_tokenizer
    from sgs_jax.parallel import make_mesh
    from sgs_jax.rl.optimizer import OptimizerConfig
    from sgs_jax.rl.train_step import TrainConfig

    ap = argparse.ArgumentParser(description="Supervised fine-tuning (Guide stage, warm starts) on JSONL pairs.")
    ap.add_argument("--data", type=pathlib.Path, required=True, help="JSONL of (messages|prompt, completion) pairs")
    ap.add_argument("--model", type=pathlib.Path, required=True, help="Hugging Face checkpoint dir (with tokenizer)")
    ap.add_argument("--out", type=pathlib.Path, help="where to save the fine-tuned checkpoint (HF format)")
    ap.add_argument("--epochs", type=int, default=1, help="0: only evaluate (e.g. a released Guide)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--max-seq-len", type=int, default=8192)
    ap.add_argument("--pack-length", type=int, default=0,
                    help="0: one pair per row; > 0: rows of up to this many tokens (>= --max-seq-len) hold several pairs")
    ap.add_argument("--heldout", type=int, default=64, help="pairs held out for the format check")
    ap.add_argument("--max-new-tokens", type=int, default=2048)
    ap.add_argument("--no-format-check", action="store_true", help="skip the Guide format rate (non-Guide SFT)")
    ap.add_argument("--dtype", default="bfloat16", help="compute dtype")
    ap.add_argument("--param-dtype", default="float32", help="stored parameter dtype (fp32 = master weights)")
    ap.add_argument("--remat", default="full", choices=("none", "full", "dots"))
    ap.add_argument("--attention", default="auto", choices=("auto", "xla", "cudnn", "splash"), help="attention backend")
    ap.add_argument("--fsdp", type=int, default=-1)
    ap.add_argument("--tensor", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    mesh = make_mesh(data=1, fsdp=args.fsdp, tensor=args.tensor)
    model = load_hf(args.model, dtype=args.dtype, mesh=mesh, param_dtype=args.param_dtype, remat_policy=args.remat,
                    attention=args.attention)
    tokenizer = load_tokenizer(args.model)
    train, held = split_heldout(read_sft_jsonl(args.data), 0 if args.no_format_check else args.heldout, args.seed)
    config = TrainConfig(
        objective="sft", batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
        max_seq_len=args.max_seq_len, pack_length=args.pack_length, optimizer=OptimizerConfig(learning_rate=args.lr),
    )
    trainer = Trainer(model, config, mesh)
    evaluate = None if args.no_format_check else (lambda m, t, p: guide_format_rate(m, t, p, args.max_new_tokens))
    report = run_sft(trainer, tokenizer, train, args.epochs, held, evaluate, seed=args.seed)
    print(json.dumps(dataclasses.asdict(report) | {"losses": list(report.losses[-5:])}, indent=1))
    if args.out and args.epochs > 0:
        save_hf(trainer.model, args.out, tokenizer=tokenizer)  # every process calls; process 0 writes
        if jax.process_index() == 0:
            print(f"saved the fine-tuned checkpoint to {args.out}")


if __name__ == "__main__":
    main()
