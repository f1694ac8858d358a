"""Pretrain the testbed's stand-ins for the prover and the Guide, as Hugging Face checkpoints.

Real SGS starts from a pretrained prover (DeepSeek-Prover-V2-7B) and a Guide fine-tuned from
it. The testbed builds both from scratch with supervised training on the packaged warm-start
corpus (statements disjoint from the target set):

  base   a tiny LLaMA trained on Solver rows (statement -> the prover's proof, in the real
         Solver format) and Conjecturer rows (target -> a useful lemma)
  guide  the base fine-tuned on the teacher's rubric replies (the paper's Guide stage)

Prompts come from the same templates the run uses, so the models see at run time what they
were trained on. The packaged checkpoints were made with

    python -m sgs_jax.sgs.testbed_pretrain --out sgs_jax/testbed/data/models

and a run points `model.checkpoint` / `model.guide_checkpoint` at them (the `testbed`
preset does), exactly as a real run points them at the prover and the released Guide.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pathlib
import time

from sgs_jax.models import ModelConfig, create_model, save_hf
from sgs_jax.rl.sft import fine_tune, sft_example, sft_pair_from_row
from sgs_jax.sgs import prompts
from sgs_jax.sgs.roles import copy_model
from sgs_jax.sgs.target_set import TargetSet
from sgs_jax.sgs.types import Problem, Target
from sgs_jax.testbed import warmstart
from sgs_jax.testbed.generator import DEFAULT_PATH
from sgs_jax.testbed.model_configs import llama_config
from sgs_jax.testbed.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

TESTBED_DIR = pathlib.Path(warmstart.__file__).resolve().parent
MODELS_DIR = TESTBED_DIR / "data" / "models"
TEMPLATES_DIR = TESTBED_DIR / "templates"


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """size: testbed model size; max_len: longest row in tokens (the Solver's cap);
    base_epochs / guide_epochs: passes over the rows; lr: Adam learning rate."""

    size: str = "nano"
    max_len: int = 320
    records: int = 1024
    guide_rows: int = 1024
    base_epochs: int = 24
    guide_epochs: int = 6
    lr: float = 2e-3
    batch_size: int = 32
    seed: int = 0


def testbed_templates() -> prompts.PromptTemplates:
    """The real Solver prompt, and the testbed's short Conjecturer and Guide prompts."""
    return prompts.PromptTemplates.load({role: TEMPLATES_DIR / f"{role}.txt" for role in ("conjecturer", "conjecturer_no_target", "guide")})


def warmstart_rows(templates: prompts.PromptTemplates, tokenizer, max_len: int, records: int, guide_rows: int) -> dict[str, list[dict]]:
    """Solver, Conjecturer and Guide rows in the run's prompt formats, at most `max_len`
    tokens each, from corpus statements that do not coincide with a target."""
    target_bodies = {_body(t.statement) for t in TargetSet.load(DEFAULT_PATH).targets}
    corpus = [r for r in warmstart.load_corpus() if _body(r["statement"]) not in target_bodies][:records]
    builders = (
        lambda header, statement: prompts.solver_messages(Problem("warm", header, statement, "target", "warm"), templates)[0].content,
        lambda header, statement: prompts.conjecturer_messages(Target("warm", header, statement), True, templates)[0].content,
        lambda target, conjecture: prompts.guide_messages(target, conjecture, templates)[0].content,
    )
    sets = warmstart.rows_from_records(corpus, builders=builders)
    fits = lambda row: sft_example(tokenizer, sft_pair_from_row(row)).num_inputs < max_len  # noqa: E731
    sets = {role: [r for r in rows if fits(r)] for role, rows in sets.items()}
    sets["guide"] = sets["guide"][:guide_rows]
    return sets


def pretrain(settings: PretrainSettings, out: pathlib.Path) -> dict[str, int]:
    """Train and save `out/base` and `out/guide` (HF checkpoints with the tokenizer)."""
    tokenizer = load_tokenizer()
    rows = warmstart_rows(testbed_templates(), tokenizer, settings.max_len, settings.records, settings.guide_rows)
    config = ModelConfig.from_hf_dict(llama_config(settings.size, max_position_embeddings=4 * settings.max_len))
    common = dict(learning_rate=settings.lr, batch_size=settings.batch_size, micro_batch_size=settings.batch_size,
                  max_seq_len=settings.max_len, seed=settings.seed)
    start = time.perf_counter()
    base = create_model(config, seed=settings.seed)
    base = fine_tune(base, rows["solver"] + rows["conjecturer"], tokenizer, epochs=settings.base_epochs, **common)
    save_hf(base, out / "base", tokenizer=tokenizer)
    log.info("base trained in %.0fs", time.perf_counter() - start)
    guide = fine_tune(copy_model(base), rows["guide"], tokenizer, epochs=settings.guide_epochs, **common)
    save_hf(guide, out / "guide", tokenizer=tokenizer)
    return {role: len(r) for role, r in rows.items()}


def _body(statement: str) -> str:
    """A statement without its `theorem NAME` head, whitespace collapsed."""
    parts = statement.split(None, 2)
    return " ".join(parts[2].split()) if len(parts) == 3 else statement


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=MODELS_DIR)
    for field in dataclasses.fields(PretrainSettings):
        ap.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    args = ap.parse_args(argv)
    logging.basicConfig(level="INFO")
    settings = PretrainSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PretrainSettings)})
    counts = pretrain(settings, args.out)
    print(f"rows {counts} -> {args.out}/base, {args.out}/guide")


if __name__ == "__main__":
    main()
