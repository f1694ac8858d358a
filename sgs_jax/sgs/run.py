"""A whole SGS run: set-up, resume, the iteration loop, metrics and checkpoints.

    run = SGSRun(cfg)          # validates, builds everything the config names, resumes
    summary = run.run()        # iterations until cfg.run.iterations

The run directory holds `config.json` (the resolved config), `metrics.jsonl` and
TensorBoard events (scalars, histograms, the config as hparams, the examples as text),
`checkpoints/` (role weights + loop state per iteration, verified on restore),
`targets_state.json` (the target set with every verified proof, D3k format),
`verify_cache.jsonl` (verdicts, so a resumed run never re-checks a proof),
`examples.jsonl` (a few conjectures with their Guide replies, and proofs, per iteration)
and, with `run.export_every`, `exports/solver_iteration_N/` (Hugging Face checkpoints).
Iteration N everywhere means "after N completed iterations" (the metrics' step).

On several processes (a multi-host job, docs/multihost.md) every process runs this same
loop over the same data and so makes the same decisions; the devices hold their shards,
verification is split over the processes (`verify.shared`), and process 0 alone writes the
run directory's files (metrics, TensorBoard, examples, targets_state.json, config records,
the verdict cache, exports' metadata) while every process takes part in each checkpoint.
Each commit checks that the processes still agree on the loop state.

A run stopped at any point (killed, out of disk, a damaged newest checkpoint) resumes from
its last good checkpoint with the same command and ends as the uninterrupted run would:
the checkpoint is the state of record, and at start-up every other file is made to agree
with it (logs lose the records of steps after it, TensorBoard is rebuilt from the kept
records, targets_state.json is rewritten from it). Each iteration's logs are written
before its checkpoint, inside one block that a stop signal does not cut. See docs/runs.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, Sequence

import jax
from flax import nnx

from sgs_jax import jsonl
from sgs_jax import metrics as M
from sgs_jax.checkpoint import RunCheckpointer
from sgs_jax.config import ConfigError, check_resume, config_hparams, record_config, validate
from sgs_jax.faults import fault_point
from sgs_jax.parallel.distributed import KeyValueExchange, check_agreement, is_writer, sync
from sgs_jax.parallel.compile_cache import compile_cache_dir, enable_compilation_cache
from sgs_jax.parallel.rules import log_replicated_parameters
from sgs_jax.sampling import Sampler
from sgs_jax.sgs import bootstrap, evaluation
from sgs_jax.sgs.iteration import IterationSettings, run_iteration
from sgs_jax.sgs.phases import PhaseContext
from sgs_jax.sgs.progress import RunProgress, iteration_summary, phase
from sgs_jax.sgs.rewards import ExpertIterationBuffer
from sgs_jax.sgs.roles import (CONJECTURER_FROZEN, CONJECTURER_NONE, SOLVER, Roles, build_roles, conjecturer_weights,
                                role_meshes)
from sgs_jax.sgs.saved_roles import export_record, write_export
from sgs_jax.sgs.stopping import GracefulStop
from sgs_jax.verify import make_backend
from sgs_jax.verify.cache import CachingVerifier, ResultCache
from sgs_jax.verify.shared import ShardedVerifier

log = logging.getLogger(__name__)

TARGETS_STATE_NAME = "targets_state.json"
EXAMPLES_NAME = "examples.jsonl"
CACHE_NAME = "verify_cache.jsonl"
EXPORTS_DIR = "exports"


class SGSRun:
    """Owns the roles, the sampler, the verifier, the target set and the run directory.

    cfg: a validated config. allow_config_change: SAFE_ON_RESUME fields that may differ
    from the run directory's recorded config. stop: the process's GracefulStop (signals
    then wait for the end-of-iteration commit); None runs without signal handling.
    progress: what to show while running (phase bars, compile notices, iteration
    summaries); None shows nothing but the resume line.
    Raises ConfigError before creating anything on disk when the config is bad or differs
    from the recorded one.
    """

    def __init__(self, cfg, allow_config_change: Sequence[str] = (), stop: GracefulStop | None = None,
                 progress: RunProgress | None = None):
        self.cfg = cfg
        self.stop = stop
        self.progress = progress
        validate(cfg)
        self.workdir = os.path.abspath(cfg.run.workdir)
        self.writer = is_writer()
        config_changes = check_resume(self.workdir, cfg, allow_config_change)
        sync("sgs-config-checked")  # every process has read the recorded config before process 0 writes
        self.iteration = 0  # iterations completed (in memory)
        self._total = cfg.run.iterations
        self._in_iteration = False
        self.checkpointed = 0  # iterations completed as of the newest checkpoint
        self.generations = 0
        self.tokens = 0
        self.verifier = self.metrics = self.checkpointer = self._examples = None
        try:
            self._build(cfg, config_changes)
        except BaseException:
            self.close()
            raise

    def _build(self, cfg, config_changes) -> None:
        # Everything that can fail on the config's account, before anything is written.
        try:
            verifier = make_backend(cfg.verify.backend, **cfg.verify.options.to_dict())
        except (TypeError, ValueError) as err:
            raise ConfigError(f"verify.options: {err}") from None
        self.verifier = verifier
        self.meshes = role_meshes(cfg)  # roles.placement: one mesh, or the Solver's and the Guide's / Conjecturer's own
        self.mesh = self.meshes.train
        self.tokenizer = bootstrap.load_role_tokenizer(cfg)
        self.target_set = bootstrap.load_target_set(cfg)
        self.settings = IterationSettings.from_config(cfg)
        self.ei_buffer = ExpertIterationBuffer(cfg.sgs.ei_buffer_iterations)
        templates = bootstrap.load_templates(cfg)

        os.makedirs(self.workdir, exist_ok=True)
        enable_compilation_cache(compile_cache_dir(cfg.run.compile_cache_dir, self.workdir))
        if self.writer:
            record_config(cfg, self.workdir)  # a new run's record; an existing one is never overwritten here
        self.verifier = self._verifier(self.verifier)
        self.checkpointer = RunCheckpointer(os.path.join(self.workdir, "checkpoints"), keep=cfg.run.keep_checkpoints)
        base, guide = bootstrap.initial_models(cfg, self.tokenizer, self.mesh, self.workdir, self.meshes.guide)
        log_replicated_parameters(nnx.state(base), self.mesh, log)
        conj_base = None if self.meshes.conjecturer is None else bootstrap.load_model(cfg, cfg.model.checkpoint, self.meshes.conjecturer)
        self.roles: Roles = build_roles(cfg, base, guide, self.meshes, conj_base)
        self.sampler = Sampler.from_config(cfg, base.config, self.mesh)
        role_samplers = {role: Sampler.from_config(cfg, base.config, mesh) for role, mesh in self.roles.own_meshes.items()}
        self.ctx = PhaseContext.from_config(cfg, self.sampler, self.tokenizer, self.verifier, templates, role_samplers)
        self.ctx.progress = self.progress
        resumed = self._resume()
        self._align_side_files(resumed)
        if config_changes:
            record_config(cfg, self.workdir, config_changes, from_iteration=self.iteration)
        if resumed:
            print(f"[sgs] resumed from iteration {self.iteration} of {cfg.run.iterations} ({self.workdir})", flush=True)
            sync("sgs-export-check")  # all look before process 0 could start writing one
            if self._export_due() and not os.path.isdir(self._export_path()):
                self._export()  # killed after the checkpoint, before (or during) the export
        else:
            self._log_baseline()

    def _verifier(self, backend):
        """The run's verifier over `backend`: the verdict cache (its file kept by process 0;
        the others load it and keep theirs in memory) and, on several processes, the split
        of the checking (each process its share, verdicts shared by all)."""
        cache = None
        if self.cfg.verify.cache:
            path = os.path.join(self.workdir, CACHE_NAME)
            if self.writer:
                cache = ResultCache(path)  # repairs a torn tail before the others read it
            sync("sgs-verdict-cache")
            if not self.writer:
                cache = ResultCache(path, writable=False)
            backend = CachingVerifier(backend, cache)
        if jax.process_count() == 1:
            return backend
        record = (lambda request, result: cache.put(request.key(), result)) if cache is not None else None
        return ShardedVerifier(backend, KeyValueExchange(), jax.process_index(), jax.process_count(), record=record)

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

    def _resume(self) -> bool:
        """Restore the newest good checkpoint; returns whether there was one."""
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self._trees()
        )
        restored = self.checkpointer.restore_latest(abstract)
        if restored is None:
            return False
        step, trees, meta = restored
        check_agreement(step, "the restored checkpoint step")
        for name, trainer in self.roles.trainable().items():
            trainer.params = trees[name]
            nnx.update(trainer.model, trainer.params)
            if f"{name}_opt" in trees:
                trainer.opt_state = trees[f"{name}_opt"]
        self.iteration = self.checkpointed = int(meta["iteration"])
        self.generations = int(meta["generations"])
        self.tokens = int(meta["tokens"])
        self.target_set = type(self.target_set).from_json(meta["target_set"], self.cfg.targets.max_proofs)
        self.ei_buffer.load_json(meta.get("ei_buffer", []))
        log.info("resumed from checkpoint step %d (iteration %d)", step, self.iteration)
        return True

    def _align_side_files(self, resumed: bool) -> None:
        """Make every file beside the checkpoint agree with the restored state: the logs
        lose the records of later steps (written before a kill, to be redone), and
        targets_state.json is rewritten from the checkpoint (a kill may have come between
        the checkpoint and its write)."""
        last = self.iteration if resumed else -1
        if not self.writer:
            self.metrics = M.DiscardingWriter(self.workdir)
            return
        self.metrics = M.MetricsWriter(self.workdir, truncate_after=last)
        self.metrics.write_hparams(config_hparams(self.cfg))
        examples = os.path.join(self.workdir, EXAMPLES_NAME)
        jsonl.truncate_records(examples, lambda r: isinstance(r.get("iteration"), int) and r["iteration"] <= last)
        for record in jsonl.read_records(examples)[0]:  # the event files were rebuilt without them
            self.metrics.write_text(record["iteration"], example_texts(record))
        if self.cfg.run.log_examples:
            self._examples = jsonl.Appender(examples)
        state = os.path.join(self.workdir, TARGETS_STATE_NAME)
        if resumed:
            self.target_set.save(state)
        elif os.path.exists(state):
            os.remove(state)

    def _save(self) -> None:
        """Checkpoint, then the side file derived from it."""
        self.roles.to_device()  # idle roles parked in host memory come back for the checkpoint
        self.checkpointer.save(self.iteration, self._trees(), self._meta())
        self.checkpointed = self.iteration
        path = os.path.join(self.workdir, TARGETS_STATE_NAME)
        fault_point("side_files", path)
        if self.writer:
            self.target_set.save(path)

    def _log_baseline(self) -> None:
        """Step 0: the targets' own statement statistics, the starting cumulative solve
        rate (0: nothing is solved yet) and, with `run.base_solve_rate`, the base
        Solver's pass@k on the targets."""
        from sgs_jax.analysis.statements import summarize_statements

        from sgs_jax.sgs.statement_facts import statement_fractions

        statements = [t.statement for t in self.target_set.targets]
        summary = summarize_statements(statements)
        scalars = {
            M.GENERATIONS: 0.0,
            M.CUMULATIVE_SOLVE_RATE: self.target_set.solved_fraction(),
            **{f"{M.CUMULATIVE_SOLVE_RATE}/{g}": self.target_set.solved_fraction(ids) for g, ids in self.target_set.groups().items()},
            M.TARGET_DISJUNCTIVE_FRACTION: summary.disjunctive_fraction,
            M.TARGET_MEAN_CONCLUSION_LENGTH: summary.mean_conclusion_length,
            **statement_fractions(statements, exact=self.settings.exact_statement_facts, of_targets=True),
        }
        if self.cfg.run.base_solve_rate:
            scalars[M.BASE_SOLVE_RATE] = self._base_solve_rate()
        self.metrics.write_scalars(0, scalars)

    def _base_solve_rate(self) -> float:
        """Targets the base Solver solves with k samples each / |D|: `sgs-eval`'s
        measurement (`evaluation.evaluate_solver`: the training prompt, sampling, extraction
        and verifier, on the evaluation seed stream). Nothing of it is kept: no proof enters
        the target set, no sample is trained on or counted as a generation."""
        k, targets = self.settings.k, self.target_set.targets
        with phase(self.progress, "base model", len(targets) * k, "samples"), self.roles.rollout_weights(SOLVER) as weights:
            result = evaluation.evaluate_solver(self.ctx, weights, targets, k,
                                                self.settings.solver_max_total_len, self.settings.seed,
                                                self.cfg.sampling.max_batch)
        rate = result.solved / len(targets)
        if self.progress is not None:
            self.progress.say(f"step 0: the base model solves {result.solved}/{len(targets)} targets ({rate:.1%}, "
                              f"pass@{k}; measured before training, not trained on, not counted as generations)")
        return rate

    # ---- loop ---------------------------------------------------------------------------
    def run(self, iterations: int | None = None) -> dict[str, Any]:
        """Run until `iterations` (default cfg.run.iterations) are complete; returns a summary."""
        total = self._total = self.cfg.run.iterations if iterations is None else iterations
        while self.iteration < total:
            it = self.iteration
            self._in_iteration = True
            if self.progress is not None:
                self.progress.take_compile_seconds()
                self.progress.say(f"iteration {it + 1}/{total}")
            start = time.perf_counter()
            result = run_iteration(it, self.ctx, self.roles, self.target_set, self.settings, self.ei_buffer)
            seconds = time.perf_counter() - start
            compile_seconds = self.progress.take_compile_seconds() if self.progress is not None else 0.0
            with self._commit_block():
                self._commit(it, total, result, seconds, compile_seconds)
                self._in_iteration = False
        return self.summary()

    def _commit_block(self):
        return self.stop.deferred() if self.stop is not None else contextlib.nullcontext()

    def _commit(self, it: int, total: int, result: dict[str, Any], seconds: float, compile_seconds: float = 0.0) -> None:
        """The end of iteration `it` (`seconds` long, `compile_seconds` of it compiling):
        counters, logs, then (when due) the checkpoint and the export."""
        self.iteration += 1
        if jax.process_count() > 1:  # (the state's JSON is only built where it is compared)
            check_agreement(self._meta(), f"the loop state after iteration {self.iteration}")
        new_generations = int(result.pop("iteration/generations"))
        self.generations += new_generations
        self.tokens += int(result.pop("iteration/tokens"))
        rates = result.pop("synthetic_solve_rates")
        examples = result.pop("examples")
        scalars = {k: float(v) for k, v in result.items()}
        scalars[M.GENERATIONS] = float(self.generations)
        scalars[M.TOKENS_GENERATED] = float(self.tokens)
        scalars[M.GENERATIONS_PER_SECOND] = new_generations / seconds
        fault_point("logs", self.metrics.run_dir / M.JSONL_NAME)
        self.metrics.write_scalars(self.iteration, scalars)
        if rates:
            self.metrics.write_histogram(self.iteration, M.SYNTHETIC_SOLVE_RATE, rates)
        self._write_examples(examples)
        # Numbered as the metrics' steps: the entry of iteration N is written after N iterations.
        self.target_set.iterations.append({"iteration": self.iteration,
                                           "cumulative_solve_rate": scalars[M.CUMULATIVE_SOLVE_RATE]})
        if self.iteration % self.cfg.run.checkpoint_every == 0 or self.iteration == total:
            self._save()
        if self._export_due():
            self._export()
        if isinstance(self.verifier, ShardedVerifier):
            sync(f"sgs-verdicts-taken-{self.iteration}")  # every process has every verdict so far
            self.verifier.release()
        log.info(
            "iteration %d: cumulative solve rate %.3f, generations %d, %.1fs",
            self.iteration, scalars[M.CUMULATIVE_SOLVE_RATE], self.generations, seconds,
        )
        if self.progress is not None:
            kind = conjecturer_weights(self.cfg)
            self.progress.say(iteration_summary(
                self.iteration, total, scalars, self.target_set.num_solved(), len(self.target_set), seconds,
                compile_seconds,
                self.settings.k, "none" if kind == CONJECTURER_NONE else "frozen" if kind == CONJECTURER_FROZEN else "trained",
                self.settings.use_guide))

    def _export_due(self) -> bool:
        every = self.cfg.run.export_every
        return bool(every) and self.iteration > 0 and self.iteration % every == 0

    def _export_path(self) -> str:
        return os.path.join(self.workdir, EXPORTS_DIR, f"solver_iteration_{self.iteration}")

    def _export(self) -> None:
        """The Solver's current weights as a Hugging Face checkpoint in exports/ (sgs-export's
        writer: atomic, with the tokenizer and an sgs_export.json)."""
        model = self.roles.solver.model
        record = export_record(self.cfg, self.workdir, "solver", self.iteration, model.config.param_dtype)
        path = write_export(model, self.tokenizer, self._export_path(), record, overwrite=True)
        if self.progress is not None:
            self.progress.say(f"  exported the Solver after iteration {self.iteration} to {path}")

    def position(self) -> str:
        """Where the run is ("in iteration 3 of 5"), for stop messages."""
        if self._in_iteration:
            return f"in iteration {self.iteration + 1} of {self._total}"
        return f"after iteration {self.iteration} of {self._total}"

    def resume_point(self) -> str:
        """Where the same command would resume, for stop and error messages."""
        return f"rerun the same command to resume from iteration {self.checkpointed}"

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
        """The first `run.log_examples` kept conjectures (with their solve rates and Guide
        replies) and verified proofs: to examples.jsonl and as TensorBoard text."""
        n = self.cfg.run.log_examples
        if self._examples is not None:
            record = {"iteration": self.iteration, **{kind: list(texts[:n]) for kind, texts in examples.items()}}
            self._examples.append(record)
            self.metrics.write_text(self.iteration, example_texts(record))

    def close(self) -> None:
        """Release workers (Lean REPLs included) and files. Idempotent."""
        for part in (self.verifier, self.metrics, self._examples, self.checkpointer):
            if part is not None:
                part.close()
        self.verifier = self.metrics = self._examples = self.checkpointer = None



def example_texts(record: dict) -> dict[str, str]:
    """The TensorBoard text summaries (Markdown, {tag: text}) of one examples.jsonl record:
    the conjectures with their solve rates and Guide replies, and the proofs."""
    texts = {}
    conjectures = record.get("conjectures") or []
    if conjectures:
        rates = record.get("conjecture_solve_rates") or [None] * len(conjectures)
        replies = record.get("guide_replies") or [None] * len(conjectures)
        parts = []
        for i, (statement, rate, reply) in enumerate(zip(conjectures, rates, replies), start=1):
            head = f"**Conjecture {i}**" + (f" (solve rate {rate:.2f})" if rate is not None else "")
            parts.append(f"{head}\n\n```lean\n{statement}\n```")
            parts.append(f"Guide reply:\n\n```\n{reply}\n```" if reply is not None else "_not scored by the Guide_")
        texts["examples/conjectures"] = "\n\n".join(parts)
    proofs = record.get("proofs") or []
    if proofs:
        texts["examples/proofs"] = "\n\n".join(f"**Proof {i}**\n\n```lean\n{p}\n```" for i, p in enumerate(proofs, 1))
    return texts
