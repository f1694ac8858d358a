"""Supervised fine-tuning: JSONL parsing, tokenisation and the Guide format stage."""

import json
import random

import numpy as np
import pytest

from sgs_jax.models import create_model, tiny
from sgs_jax.models.tokenizer import encode_chat
from sgs_jax.rl.batching import make_micro_batches
from sgs_jax.rl.optimizer import OptimizerConfig
from sgs_jax.rl.sft import (
    SftPair,
    fine_tune,
    guide_format_rate,
    parse_sft_line,
    read_sft_jsonl,
    run_sft,
    sft_example,
    split_heldout,
)
from sgs_jax.rl.train_step import TrainConfig, Trainer
from sgs_jax.sgs.rewards import parse_guide_reply
from sgs_jax.sgs.types import ChatMessage
from sgs_jax.testbed.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _reply(rng):
    r, d, c = rng.randint(0, 5), rng.randint(0, 1), rng.randint(0, 4)
    return (
        f"<begin_relevance_score> {r} <end_relevance_score>\n"
        f"<begin_redundancy_score> {d} <end_redundancy_score>\n"
        f"<begin_conclusion_complexity_score> {c} <end_conclusion_complexity_score>"
    )


def test_both_jsonl_formats_and_clear_errors(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "Q1"}], "completion": "A1"},
        {"prompt": "Q2", "reply": "A2"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert read_sft_jsonl(path) == [
        SftPair((ChatMessage("user", "Q1"),), "A1"),
        SftPair((ChatMessage("user", "Q2"),), "A2"),
    ]
    path.write_text(json.dumps(rows[0]) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: not valid JSON"):
        read_sft_jsonl(path)
    for bad, message in [
        ('{"prompt": "Q"}', "completion"),
        ('{"completion": "A"}', "'messages' or"),
        ('{"messages": [{"role": "user"}], "completion": "A"}', "messages"),
        ("[1, 2]", "JSON object"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_sft_line(bad)


def test_example_is_chat_prompt_then_completion_and_eos(tokenizer):
    pair = SftPair((ChatMessage("user", "Rate it."),), "<begin_relevance_score> 3 <end_relevance_score>")
    ex = sft_example(tokenizer, pair)
    assert list(ex.prompt_ids) == encode_chat(tokenizer, [{"role": "user", "content": "Rate it."}])
    assert ex.completion_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ex.completion_ids[:-1]) == pair.completion
    (batch,) = make_micro_batches([ex], [1.0], 1, (64,))
    # The loss covers exactly the completion and its EOS.
    assert batch.loss_mask.sum() == len(ex.completion_ids)
    assert list(batch.targets[0][batch.loss_mask[0] > 0]) == list(ex.completion_ids)


def test_split_heldout_is_disjoint_and_seeded():
    pairs = [SftPair((ChatMessage("user", str(i)),), "x") for i in range(10)]
    train, held = split_heldout(pairs, 3, seed=1)
    assert len(held) == 3 and len(train) == 7 and not set(train) & set(held)
    assert split_heldout(pairs, 3, seed=1) == (train, held)
    with pytest.raises(ValueError):
        split_heldout(pairs, 11)


def test_guide_sft_raises_the_well_formatted_fraction(tokenizer):
    """A random tiny model never writes a parsable Guide reply; after SFT on 32 replies
    with random scores in the exact Guide format it writes one for held-out prompts."""
    rng = random.Random(0)
    pairs = [SftPair((ChatMessage("user", f"Score the conjecture c{i} for target t{i}."),), _reply(rng)) for i in range(40)]
    assert all(parse_guide_reply(p.completion) is not None for p in pairs)
    train, held = split_heldout(pairs, 8)
    config = tiny(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, hidden_size=64, intermediate_size=128)
    trainer = Trainer(create_model(config, seed=0), TrainConfig(
        objective="sft", batch_size=16, micro_batch_size=16, max_seq_len=96, min_bucket=96,
        optimizer=OptimizerConfig(learning_rate=1e-2)))
    report = run_sft(trainer, tokenizer, train, 20, held, lambda m, t, p: guide_format_rate(m, t, p, 56))
    assert report.before == 0.0
    assert report.after >= 0.875  # 7 of 8 held-out prompts at least (8 of 8 observed)
    assert report.losses[-1] < report.losses[0] / 10
    assert (report.num_train, report.num_heldout, len(report.losses)) == (32, 8, 40)


def test_run_sft_rejects_mismatched_eos(tokenizer):
    trainer = Trainer(create_model(tiny(eos_token_id=99), seed=0), TrainConfig(objective="sft"))
    with pytest.raises(ValueError, match="EOS"):
        run_sft(trainer, tokenizer, [SftPair((ChatMessage("user", "q"),), "a")], 1)


def test_fine_tune_takes_rows_and_returns_the_trained_model(tokenizer):
    config = tiny(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    model = create_model(config, seed=0)
    before = np.asarray(model.lm_head.kernel[...]).copy()
    rows = [{"messages": [{"role": "user", "content": "q"}], "completion": "a b"}, {"prompt": "r", "reply": "c"}]
    out = fine_tune(model, rows, tokenizer, learning_rate=1e-2, epochs=1, batch_size=2)
    assert out is model and not np.array_equal(np.asarray(model.lm_head.kernel[...]), before)
    with pytest.raises(ValueError, match="row 0"):
        fine_tune(model, [{"prompt": "q"}], tokenizer)
