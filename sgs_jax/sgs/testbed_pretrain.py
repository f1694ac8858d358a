"""Pretrain the testbed's stand-ins for the prover and the Guide, as Hugging Face checkpoints.

Real SGS starts from a pretrained prover (DeepSeek-Prover-V2-7B) and a Guide fine-tuned from
it. The testbed builds both from scratch with supervised training on the packaged warm-start
corpus (statements disjoint from the target set):

  base   a small LLaMA (`model_configs.SIZES["small"]`, 2M parameters) trained on Solver
         rows (statement -> the pruned prover proof, in the real Solver format) and
         Conjecturer rows (target -> one of its best lemmas, or now and then a hack)
  guide  the base fine-tuned on the teacher's rubric replies (the paper's Guide stage)

Prompts come from the same templates the run uses, so the models see at run time what they
were trained on. The learning rate is constant, then divided by 3 and by 10 for the last
two epochs of each stage (`epoch_learning_rates`); the base then gets a warm restart, more
epochs over the same rows from its stored first pass with fresh optimisers
(`base_restart_lrs`, 3 + 4 epochs in all by default: docs/testbed.md). Both checkpoints are stored in bfloat16 (4 MB each) and load as
float32. The build:

    nice -n 5 python -m sgs_jax.sgs.testbed_pretrain --out sgs_jax/testbed/data/models

(the packaged pair is still an earlier build's nano models: the small pair this makes is
not better yet, measured in docs/testbed.md)

and a run points `model.checkpoint` / `model.guide_checkpoint` at them (the `testbed`
preset does), exactly as a real run points them at the prover and the released Guide.

    python -m sgs_jax.sgs.testbed_pretrain --evaluate

measures the packaged models on fresh statements (`evaluate`): the Solver's pass@8, the
Conjecturer's well-formed, true and hack fractions, the Guide's parse rate and its scores
of useful lemmas against hacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import random
import shutil
import tempfile
import time

import jax.numpy as jnp

from sgs_jax.models import ModelConfig, create_model, load_hf, save_hf
from sgs_jax.rl.sft import fine_tune, sft_example, sft_pair_from_row
from sgs_jax.sgs import prompts
from sgs_jax.sgs.roles import copy_model
from sgs_jax.sgs.target_set import TargetSet
from sgs_jax.sgs.types import Problem, Target
from sgs_jax.testbed import warmstart
from sgs_jax.testbed.generator import CORPUS_DISJUNCTIVE_FRACTION, DEFAULT_MIX, DEFAULT_PATH, generate, statement_body
from sgs_jax.testbed.model_configs import llama_config
from sgs_jax.testbed.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

TESTBED_DIR = pathlib.Path(warmstart.__file__).resolve().parent
MODELS_DIR = TESTBED_DIR / "data" / "models"
TEMPLATES_DIR = TESTBED_DIR / "templates"


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    """size: testbed model size; max_len: longest row in tokens (the Solver's cap);
    records: corpus statements used; guide_rows: Guide rows used (of about 8 per statement);
    base_epochs / guide_epochs: passes over the rows; lr / guide_lr: Adam learning rates;
    base_restart_lrs: the learning rate of each epoch of the base's warm restart (a second
    pass over the same rows from the first pass's bf16 checkpoint; empty: none)."""

    size: str = "small"
    max_len: int = 512
    records: int = 4096
    guide_rows: int = 3072
    base_epochs: int = 3
    # 3 epochs left the small base proving 1.6% of fresh statements at 8 samples; the restart's
    # 4 more: 10.9% (nano 4.7%; docs/testbed.md)
    base_restart_lrs: tuple[float, ...] = (1e-3, 1e-3, 1e-3, 3e-4)
    guide_epochs: int = 4  # 2 left the small Guide parsing 54% of its replies and ranking hacks above lemmas; 4: 98% (docs/testbed.md)
    lr: float = 1e-3
    guide_lr: float = 5e-4
    batch_size: int = 32
    micro_batch_size: int = 8  # rows sorted by length per micro-batch: less padding than one of 32
    seed: int = 0


def testbed_templates() -> prompts.PromptTemplates:
    """The real Solver prompt, and the testbed's short Conjecturer and Guide prompts."""
    return prompts.PromptTemplates.load({role: TEMPLATES_DIR / f"{role}.txt" for role in ("conjecturer", "conjecturer_no_target", "guide")})


def warmstart_rows(templates: prompts.PromptTemplates, tokenizer, max_len: int, records: int, guide_rows: int) -> dict[str, list[dict]]:
    """Solver, Conjecturer and Guide rows in the run's prompt formats, at most `max_len`
    tokens each, from corpus statements that do not coincide with a target."""
    target_bodies = {statement_body(t.statement) for t in TargetSet.load(DEFAULT_PATH).targets}
    corpus = [r for r in warmstart.load_corpus() if statement_body(r["statement"]) not in target_bodies][:records]
    builders = (
        lambda header, statement: prompts.solver_messages(Problem("warm", header, statement, "target", "warm"), templates)[0].content,
        lambda header, statement: prompts.conjecturer_messages(Target("warm", header, statement), True, templates)[0].content,
        lambda target, conjecture: prompts.guide_messages(target, conjecture, templates)[0].content,
    )
    sets = warmstart.rows_from_records(corpus, builders=builders)
    fits = lambda row: sft_example(tokenizer, sft_pair_from_row(row)).num_inputs < max_len  # noqa: E731
    sets = {role: [r for r in rows if fits(r)] for role, rows in sets.items()}
    # A seeded sample, so every kind of Guide pair keeps its share.
    sets["guide"] = random.Random(0).sample(sets["guide"], min(guide_rows, len(sets["guide"])))
    return sets


def epoch_learning_rates(lr: float, epochs: int) -> list[float]:
    """Per epoch: `lr`, then lr/3 and lr/10 for the last two (lr/10 for the last of two)."""
    decay = [lr / 3, lr / 10][-(epochs - 1):] if epochs > 1 else []
    return [lr] * (epochs - len(decay)) + decay


def train_stage(model, rows: list[dict], tokenizer, settings: PretrainSettings, learning_rates: list[float], seed: int,
                epochs_dir: pathlib.Path | None = None):
    """One supervised epoch over `rows` per entry of `learning_rates`; returns the model.

    With `epochs_dir`, the model after each epoch is saved there (fp32, `epoch_N`) and a
    restarted stage continues after the newest saved epoch: each epoch starts a fresh
    optimiser with its own seed, so the result equals an uninterrupted stage's."""
    done = 0
    if epochs_dir is not None and epochs_dir.is_dir():
        saved = sorted(int(p.name.split("_")[1]) for p in epochs_dir.glob("epoch_*") if (p / "config.json").exists())
        if saved:
            done = min(saved[-1], len(learning_rates))
            model = load_hf(epochs_dir / f"epoch_{done}", dtype=jnp.float32)
            log.info("resumed after epoch %d/%d from %s", done, len(learning_rates), epochs_dir)
    for epoch, epoch_lr in enumerate(learning_rates):
        if epoch < done:
            continue
        start = time.perf_counter()
        model = fine_tune(model, rows, tokenizer, learning_rate=epoch_lr, batch_size=settings.batch_size,
                          micro_batch_size=settings.micro_batch_size, max_seq_len=settings.max_len, seed=seed + 1000 * epoch)
        log.info("epoch %d/%d (lr %.1e, %d rows): %.0fs", epoch + 1, len(learning_rates), epoch_lr, len(rows), time.perf_counter() - start)
        if epochs_dir is not None:
            tmp = epochs_dir / f".epoch_{epoch + 1}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            save_hf(model, tmp)
            os.replace(tmp, epochs_dir / f"epoch_{epoch + 1}")  # only whole epochs count
    return model


def save_bfloat16(model, path: pathlib.Path, tokenizer) -> None:
    """Save `model` as an HF checkpoint whose weights are stored in bfloat16."""
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(model, tmp)
        save_hf(load_hf(tmp, dtype=jnp.float32, param_dtype=jnp.bfloat16), path, tokenizer=tokenizer)


def pretrain(settings: PretrainSettings, out: pathlib.Path) -> dict[str, int]:
    """Train and save `out/base` and `out/guide` (HF checkpoints with the tokenizer)."""
    tokenizer = load_tokenizer()
    rows = warmstart_rows(testbed_templates(), tokenizer, settings.max_len, settings.records, settings.guide_rows)
    log.info("rows: %s", {role: len(r) for role, r in rows.items()})
    config = ModelConfig.from_hf_dict(llama_config(settings.size, max_position_embeddings=4 * settings.max_len))
    # Saved epochs of an interrupted build with these exact settings (a build takes hours on
    # 2 cores): `out/.pretrain_epochs/<settings digest>/<stage>/epoch_N`, removed at the end.
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(settings), sort_keys=True).encode()).hexdigest()[:12]
    epochs_root = out / ".pretrain_epochs" / digest
    for stage in ("base", "base_restart", "guide"):
        (epochs_root / stage).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    base_rows = rows["solver"] + rows["conjecturer"]
    base = train_stage(create_model(config, seed=settings.seed), base_rows, tokenizer, settings,
                       epoch_learning_rates(settings.lr, settings.base_epochs), settings.seed, epochs_root / "base")
    save_bfloat16(base, out / "base", tokenizer)
    if settings.base_restart_lrs:
        # A warm restart: fresh optimisers from the stored (bf16-rounded) first pass, own seeds.
        base = train_stage(load_hf(out / "base", dtype=jnp.float32), base_rows, tokenizer, settings,
                           list(settings.base_restart_lrs), settings.seed + 100, epochs_root / "base_restart")
        save_bfloat16(base, out / "base", tokenizer)
    log.info("base trained in %.0fs", time.perf_counter() - start)
    guide = train_stage(copy_model(base), rows["guide"], tokenizer, settings,
                        epoch_learning_rates(settings.guide_lr, settings.guide_epochs), settings.seed + 1, epochs_root / "guide")
    save_bfloat16(guide, out / "guide", tokenizer)
    shutil.rmtree(out / ".pretrain_epochs", ignore_errors=True)
    return {role: len(r) for role, r in rows.items()}


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The packaged roles on `statements` fresh statements of the corpus's mix (none in the corpus).

    solver_pass_at_8: statements with a verified proof among 8 samples; solver_verified:
    verified share of the samples. conjecture_facts: `hacks.fractions` of the extracted,
    de-duplicated conjectures (4 samples per statement); conjecture_malformed: samples
    that extraction rejects. guide_parse_rate: parsed replies (temperature 1, as in a run);
    guide_score / teacher_score: mean Eq. 3 score by the Guide and by its teacher, per
    kind of pair ("lemma": a useful lemma, "hack": one of the three hacks)."""

    statements: int
    solver_pass_at_8: float
    solver_verified: float
    conjectures: int
    conjecture_malformed: float
    conjecture_facts: dict[str, float]
    guide_pairs: int
    guide_parse_rate: float
    guide_score: dict[str, float]
    teacher_score: dict[str, float]


def evaluate(models_dir: pathlib.Path = MODELS_DIR, count: int = 64, seed: int = 2) -> Evaluation:
    """Sample every role of the packaged models on `count` fresh statements (seeded)."""
    import random as _random

    import numpy as np

    from sgs_jax.sampling import Sampler
    from sgs_jax.sgs.phases import PhaseContext, conjecture_phase, guide_phase, prove_phase
    from sgs_jax.sgs.rewards import guide_score
    from sgs_jax.testbed import hacks
    from sgs_jax.testbed.backend import PropVerifier

    tokenizer = load_tokenizer(models_dir / "base")
    base = load_hf(models_dir / "base", dtype=jnp.float32)
    guide = load_hf(models_dir / "guide", dtype=jnp.float32)
    ctx = PhaseContext(Sampler(base.config, max_batch=128), tokenizer, PropVerifier(), testbed_templates())
    seen = {statement_body(r["statement"]) for r in warmstart.load_corpus()}
    fresh = generate(DEFAULT_MIX, 2 * count, seed, prefix="eval", disjunctive_fraction=CORPUS_DISJUNCTIVE_FRACTION)
    texts = [t for t in (g.statement.lean() for g in fresh) if statement_body(t) not in seen][:count]
    targets = [Target(f"eval_{i}", "", t) for i, t in enumerate(texts)]
    proved = prove_phase(ctx, base, [Problem.from_target(t) for t in targets], 8, 512, seed, chunk_problems=64)
    rates = proved.solve_rates()
    conj = conjecture_phase(ctx, base, targets, texts, 4, True, 128, seed)
    rng = _random.Random(seed)
    pairs, kinds = [], []
    for text in texts:
        record = warmstart.corpus_record("", text, rng)
        if record and record["lemmas"]:
            pairs += [(text, record["lemmas"][0])] + [(text, h) for h in record["hacks"]]
            kinds += ["lemma"] + ["hack"] * len(record["hacks"])
    guided = guide_phase(ctx, guide, pairs, 128, seed)

    def mean_by_kind(values):
        return {k: float(np.mean([v for v, kk in zip(values, kinds) if kk == k and v is not None])) for k in ("lemma", "hack")}

    from sgs_jax.testbed.teacher import score

    return Evaluation(
        statements=len(texts),
        solver_pass_at_8=float(np.mean([r > 0 for r in rates])),
        solver_verified=float(np.mean(rates)),
        conjectures=len(conj.kept),
        conjecture_malformed=conj.malformed / conj.generated if conj.generated else 0.0,
        conjecture_facts=hacks.fractions([c.statement for c in conj.kept]),
        guide_pairs=len(pairs),
        guide_parse_rate=1.0 - guided.parse_failures / len(pairs) if pairs else 0.0,
        guide_score=mean_by_kind([guide_score(*s) if s is not None else None for s in guided.scores]),
        teacher_score=mean_by_kind([guide_score(s.relevance, s.redundancy, s.complexity) for s in (score(t, c) for t, c in pairs)]),
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=MODELS_DIR)
    ap.add_argument("--evaluate", action="store_true", help="measure the models in --out instead of training")
    floats = lambda text: tuple(float(x) for x in text.split(",") if x.strip())  # noqa: E731  "1e-3,3e-4"; "" for none
    for field in dataclasses.fields(PretrainSettings):
        kind = floats if isinstance(field.default, tuple) else type(field.default)
        ap.add_argument(f"--{field.name.replace('_', '-')}", type=kind, default=field.default)
    args = ap.parse_args(argv)
    logging.basicConfig(level="INFO")
    if args.evaluate:
        print(json.dumps(dataclasses.asdict(evaluate(args.out)), indent=1))
        return
    settings = PretrainSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PretrainSettings)})
    counts = pretrain(settings, args.out)
    print(f"rows {counts} -> {args.out}/base, {args.out}/guide")


if __name__ == "__main__":
    main()
