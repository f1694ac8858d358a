"""Build the packaged testbed target set: candidates, the base model's calibration, selection.

    nice -n 5 python -m sgs_jax.sgs.testbed_targets    # rewrites sgs_jax/testbed/data/targets.json

1. `generator.candidate_pool()`: 1,200 provable multi-step statements (pruned proofs of 4+
   tactics) and 400 of two or three steps, 6% with a disjunctive conclusion, none of them
   in the warm-start corpus, kept when the Solver's prompt and the pruned proof fit the
   run's 512-token cap.
2. Calibration: the packaged base model writes `samples` Solver proofs of each candidate
   (the run's Solver prompt, length cap and temperature, sampling seed `--seed`, a dev
   seed that no reported run uses), checked by the `prop` backend. A candidate's
   `base_solve_rate` is its verified fraction; `hard` means none verified.
3. For hard candidates, `useful_lemmas`: derivation lemmas that the Guide teacher rates
   relevance >= 4, i.e. lemmas a Conjecturer could propose that shorten the proof by a
   quarter or more.
4. `generator.select_targets`: base-solvable candidates until the expected pass@8 at
   iteration 1 reaches 15%, the rest hard candidates with a useful lemma; disjunctive
   conclusions at 6%; strata interleaved so any prefix keeps the mix.

The records keep `difficulty`, `band`, `base_solve_rate`, `hard` and `useful_lemmas`, and
a run copies them into `targets_state.json`. The base model must exist first
(`python -m sgs_jax.sgs.testbed_pretrain`), and the corpus it was trained on excludes the
whole pool, so no target was seen in pretraining.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import time

import jax.numpy as jnp

from sgs_jax.models import load_hf
from sgs_jax.models.tokenizer import encode_chat
from sgs_jax.sampling import Sampler
from sgs_jax.sgs import prompts
from sgs_jax.sgs.phases import PhaseContext, prove_phase
from sgs_jax.sgs.testbed_pretrain import MODELS_DIR, testbed_templates
from sgs_jax.sgs.types import Problem, Target
from sgs_jax.testbed import generator, warmstart
from sgs_jax.testbed.backend import PropVerifier
from sgs_jax.testbed.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

CALIBRATION_SEED = 100  # a dev seed: reported runs use seeds below 100
SOLVER_MAX_TOTAL_LEN = 512  # calibration cap = the testbed preset's sampling.solver_max_total_len (configs/presets.py)


def solver_row_length(item: generator.Generated, tokenizer, templates: prompts.PromptTemplates) -> int:
    """Tokens of the Solver prompt plus the completion holding the pruned proof (and EOS)."""
    problem = Problem.from_target(Target(item.statement.name, "", item.statement.lean()))
    prompt = encode_chat(tokenizer, [m.as_dict() for m in prompts.solver_messages(problem, templates)])
    completion = tokenizer.encode(f"```lean4\n{item.statement.lean()}\n{item.proof}\n```", add_special_tokens=False)
    return len(prompt) + len(completion) + 1


def calibrate(items: list[generator.Generated], model_dir: pathlib.Path, samples: int, seed: int,
              max_batch: int = 128) -> list[float]:
    """The base model's verified fraction of `samples` proofs for each statement."""
    tokenizer = load_tokenizer(model_dir)
    model = load_hf(model_dir, dtype=jnp.float32)
    ctx = PhaseContext(Sampler(model.config, max_batch=max_batch), tokenizer, PropVerifier(), testbed_templates())
    problems = [Problem.from_target(Target(it.statement.name, "", it.statement.lean())) for it in items]
    proved = prove_phase(ctx, model, problems, samples, SOLVER_MAX_TOTAL_LEN, seed,
                         chunk_problems=max(1, 4 * max_batch // samples))
    return proved.solve_rates()


def useful_lemma_count(item: generator.Generated) -> int:
    """Derivation lemmas of `item` with teacher relevance >= 4."""
    from sgs_jax.testbed.teacher import score

    target = item.statement.lean()
    return sum(score(target, lemma.lean()).relevance >= 4 for lemma in warmstart.lemma_candidates(item.statement))


def build(model_dir: pathlib.Path, count: int, samples: int, seed: int, candidates: int = generator.POOL_SIZE,
          iteration1_solve_rate: float = 0.15) -> dict:
    """The target-set file (D3k format with the calibration fields), chosen from
    `candidate_pool(candidates)`: the first `candidates` multi-step statements and a third as
    many short ones (each a prefix of the full pool's strata)."""
    start = time.perf_counter()
    seen = {generator.statement_body(r["statement"]) for r in warmstart.load_corpus()}
    # The corpus was built to exclude the pool; this keeps that true whatever changed since.
    pool = [g for g in generator.candidate_pool(candidates) if generator.statement_body(g.statement.lean()) not in seen]
    tokenizer, templates = load_tokenizer(model_dir), testbed_templates()
    pool = [g for g in pool if solver_row_length(g, tokenizer, templates) <= SOLVER_MAX_TOTAL_LEN]
    log.info("pool of %d candidates in %.0fs", len(pool), time.perf_counter() - start)
    rates = calibrate(pool, model_dir, samples, seed)
    log.info("calibrated in %.0fs: %d of %d candidates base-solvable", time.perf_counter() - start,
             sum(r > 0 for r in rates), len(rates))
    candidates = [generator.Candidate(item, rate, useful_lemma_count(item) if rate == 0 else 0)
                  for item, rate in zip(pool, rates)]
    return generator.target_file(generator.select_targets(candidates, count, seed=0, iteration1_solve_rate=iteration1_solve_rate))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=generator.DEFAULT_PATH)
    ap.add_argument("--model", type=pathlib.Path, default=MODELS_DIR / "base")
    ap.add_argument("--count", type=int, default=192)
    ap.add_argument("--samples", type=int, default=16, help="calibration proofs per candidate")
    ap.add_argument("--seed", type=int, default=CALIBRATION_SEED, help="calibration sampling seed (a dev seed)")
    ap.add_argument("--candidates", type=int, default=generator.POOL_SIZE, help="multi-step pool statements to calibrate (a prefix; a third as many short ones join them)")
    args = ap.parse_args(argv)
    logging.basicConfig(level="INFO")
    data = build(args.model, args.count, args.samples, args.seed, args.candidates)
    args.out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(data['target_statements'])} targets to {args.out}")
    print(generator.describe(list(data["target_statements"].values())))


if __name__ == "__main__":
    main()
