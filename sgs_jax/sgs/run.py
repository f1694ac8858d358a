"""A whole SGS run: set-up, resume, the iteration loop, metrics and checkpoints.

    run = SGSRun(cfg)          # builds everything the config names; resumes if it can
    summary = run.run()        # iterations until cfg.run.iterations

The run directory holds `config.json` (the resolved config), `metrics.jsonl` and
TensorBoard events, `checkpoints/` (role weights + loop state per iteration),
`targets_state.json` (the target set with every verified proof, D3k format),
`verify_cache.jsonl` (verdicts, so a resumed run never re-checks a proof) and
`examples.jsonl` (a few conjectures and proofs per iteration). A run stopped at any point
resumes from its last completed iteration with the same command.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from sgs_jax import metrics as M
from sgs_jax.checkpoint import RunCheckpointer
from sgs_jax.config import save_resolved
from sgs_jax.parallel import make_mesh, state_shardings
from sgs_jax.sampling import Sampler
from sgs_jax.sgs import bootstrap
from sgs_jax.sgs.iteration import IterationSettings, run_iteration
from sgs_jax.sgs.phases import PhaseContext
from sgs_jax.sgs.rewards import ExpertIterationBuffer
from sgs_jax.sgs.roles import Roles, build_roles
from sgs_jax.verify import make_backend
from sgs_jax.verify.cache import CachingVerifier, ResultCache

log = logging.getLogger(__name__)


class SGSRun:
    """Owns the roles, the sampler, the verifier, the target set and the run directory."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.workdir = os.path.abspath(cfg.run.workdir)
        os.makedirs(self.workdir, exist_ok=True)
        save_resolved(cfg, self.workdir)
        self.mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
        self.tokenizer = bootstrap.load_role_tokenizer(cfg)
        self.target_set = bootstrap.load_target_set(cfg)
        self.settings = IterationSettings.from_config(cfg)
        self.ei_buffer = ExpertIterationBuffer(cfg.sgs.ei_buffer_iterations)
        self.checkpointer = RunCheckpointer(os.path.join(self.workdir, "checkpoints"), keep=cfg.run.keep_checkpoints)
        self.metrics = M.MetricsWriter(self.workdir)
        self.verifier = make_backend(cfg.verify.backend, **cfg.verify.options.to_dict())
        if cfg.verify.cache:
            self.verifier = CachingVerifier(self.verifier, ResultCache(os.path.join(self.workdir, "verify_cache.jsonl")))
        self.iteration = 0
        self.generations = 0
        self.tokens = 0
        base, guide = bootstrap.initial_models(cfg, self.tokenizer, self.mesh, self.workdir)
        self.roles: Roles = build_roles(cfg, base, guide, self.mesh)
        self.sampler = Sampler(base.config, mesh=self.mesh, max_batch=cfg.sampling.max_batch)
        self.ctx = PhaseContext.from_config(cfg, self.sampler, self.tokenizer, self.verifier, bootstrap.load_templates(cfg))
        self._resume()
        if self.iteration == 0 and self.checkpointer.latest_step() is None:
            self._log_baseline()

    # ---- state --------------------------------------------------------------------------
    def _trees(self) -> dict[str, Any]:
        trees = {}
        for name, trainer in self.roles.trainable().items():
            trees[name] = trainer.params
            if not self.cfg[f"{name}_train"].reset_optimizer:
                trees[f"{name}_opt"] = trainer.opt_state
        return trees

    def _meta(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "generations": self.generations,
            "tokens": self.tokens,
            "target_set": self.target_set.to_json(),
            "ei_buffer": self.ei_buffer.to_json(),
        }

    def _resume(self) -> None:
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self._trees()
        )
        restored = self.checkpointer.restore_latest(abstract)
        if restored is None:
            return
        step, trees, meta = restored
        for name, trainer in self.roles.trainable().items():
            trainer.params = trees[name]
            nnx.update(trainer.model, trainer.params)
            if f"{name}_opt" in trees:
                trainer.opt_state = trees[f"{name}_opt"]
        self.iteration = int(meta["iteration"])
        self.generations = int(meta["generations"])
        self.tokens = int(meta["tokens"])
        self.target_set = type(self.target_set).from_json(meta["target_set"], self.cfg.targets.max_proofs)
        self.ei_buffer.load_json(meta.get("ei_buffer", []))
        log.info("resumed from checkpoint step %d (iteration %d)", step, self.iteration)

    def _save(self) -> None:
        self.checkpointer.save(self.iteration, self._trees(), self._meta())
        self.target_set.save(os.path.join(self.workdir, "targets_state.json"))

    def _log_baseline(self) -> None:
        """Step 0: the targets' own statement statistics and the starting solve rate."""
        from sgs_jax.analysis.statements import summarize_statements

        from sgs_jax.sgs.statement_facts import statement_fractions

        statements = [t.statement for t in self.target_set.targets]
        summary = summarize_statements(statements)
        self.metrics.write_scalars(0, {
            M.GENERATIONS: 0.0,
            M.CUMULATIVE_SOLVE_RATE: self.target_set.solved_fraction(),
            **{f"{M.CUMULATIVE_SOLVE_RATE}/{g}": self.target_set.solved_fraction(ids) for g, ids in self.target_set.groups().items()},
            M.TARGET_DISJUNCTIVE_FRACTION: summary.disjunctive_fraction,
            M.TARGET_MEAN_CONCLUSION_LENGTH: summary.mean_conclusion_length,
            **statement_fractions(statements, exact=self.settings.exact_statement_facts, of_targets=True),
        })

    # ---- loop ---------------------------------------------------------------------------
    def run(self, iterations: int | None = None) -> dict[str, Any]:
        """Run until `iterations` (default cfg.run.iterations) are complete; returns a summary."""
        total = self.cfg.run.iterations if iterations is None else iterations
        while self.iteration < total:
            it = self.iteration
            start = time.perf_counter()
            result = run_iteration(it, self.ctx, self.roles, self.target_set, self.settings, self.ei_buffer)
            self.iteration += 1
            seconds = time.perf_counter() - start
            new_generations = int(result.pop("iteration/generations"))
            self.generations += new_generations
            self.tokens += int(result.pop("iteration/tokens"))
            rates = result.pop("synthetic_solve_rates")
            examples = result.pop("examples")
            scalars = {k: float(v) for k, v in result.items()}
            scalars[M.GENERATIONS] = float(self.generations)
            scalars[M.TOKENS_GENERATED] = float(self.tokens)
            scalars[M.GENERATIONS_PER_SECOND] = new_generations / seconds
            self.metrics.write_scalars(self.iteration, scalars)
            if rates:
                self.metrics.write_histogram(self.iteration, M.SYNTHETIC_SOLVE_RATE, rates)
            self._write_examples(examples)
            self.target_set.iterations.append({"iteration": it, "cumulative_solve_rate": scalars[M.CUMULATIVE_SOLVE_RATE]})
            if self.iteration % self.cfg.run.checkpoint_every == 0 or self.iteration == total:
                self._save()
            log.info(
                "iteration %d: cumulative solve rate %.3f, generations %d, %.1fs",
                it, scalars[M.CUMULATIVE_SOLVE_RATE], self.generations, seconds,
            )
            print(
                f"[sgs] iteration {self.iteration}/{total}: solved {self.target_set.num_solved()}/{len(self.target_set)} "
                f"({scalars[M.CUMULATIVE_SOLVE_RATE]:.1%}), pass@k this iteration {scalars[M.ITERATION_SOLVE_RATE]:.1%}, "
                f"conjectures kept {int(scalars.get(M.CONJECTURE_KEPT, 0))}, "
                f"solver samples {int(scalars.get('solver/train_sequences', 0))}, {seconds:.0f}s",
                flush=True,
            )
        return self.summary()

    def summary(self) -> dict[str, Any]:
        return {
            "iterations": self.iteration,
            "generations": self.generations,
            "tokens": self.tokens,
            "solved": self.target_set.num_solved(),
            "targets": len(self.target_set),
            "cumulative_solve_rate": self.target_set.solved_fraction(),
            "workdir": self.workdir,
        }

    def _write_examples(self, examples: dict) -> None:
        with open(os.path.join(self.workdir, "examples.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps({"iteration": self.iteration, **examples}, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.verifier.close()
        self.metrics.close()
        self.checkpointer.close()

