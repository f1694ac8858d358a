"""The run's metrics writer: TensorBoard event files plus a JSONL copy, and the canonical
metric names that the training loop writes and `sgs-report` reads.

Each write goes to both sinks and is flushed (and the JSONL line fsync'd) before the
call returns, so a preempted run loses at most the write in progress; a torn last line is
cut off when the file is next opened (`sgs_jax.jsonl`). `metrics.jsonl` is the record of
truth. A run resuming after step N opens the writer with `truncate_after=N`: records of
later steps (written before a kill, then redone) are dropped and the TensorBoard event
files are rebuilt from the kept records, so every reader sees each step exactly once.
(Readers still resolve a step written twice by keeping the later write.)

JSONL lines: {"step": int, "time": unix seconds, "scalars": {name: float}} or
{"step": int, "time": unix seconds, "histogram": name, "values": [float, ...]}.

Two kinds of TensorBoard data are derived from other records and written to the event
files only: the run's config as hparams (`write_hparams`, from config.json, at every start,
so runs line up in TensorBoard's HParams table) and text summaries (`write_text`: the run
writes its examples.jsonl records, and writes the kept ones again after a rebuild).
"""

from __future__ import annotations

import numbers
import os
import pathlib
import time
from collections.abc import Mapping, Sequence

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from sgs_jax import jsonl

# --- Canonical metric names (SPEC Section 9). Scalars unless marked histogram. ---
GENERATIONS = "generations"  # cumulative generation count (SPEC 4.10)
CUMULATIVE_SOLVE_RATE = "cumulative_solve_rate"  # solved targets / |D|, in [0, 1]
BASE_SOLVE_RATE = "base_solve_rate"  # step 0: targets the base Solver solves (pass@k) before training / |D|
ITERATION_SOLVE_RATE = "iteration_solve_rate"  # targets solved (pass@k) this iteration / |D|
# Per target group of the target records (`TargetSet.groups`): the same rates over the
# group's targets only. "hard" is the hard split; "band/<name>" a difficulty band.
HARD_GROUP = "hard"
BAND_GROUP_PREFIX = "band/"
CUMULATIVE_SOLVE_RATE_HARD = "cumulative_solve_rate/hard"
ITERATION_SOLVE_RATE_HARD = "iteration_solve_rate/hard"
CUMULATIVE_SOLVE_RATE_BAND = "cumulative_solve_rate/band/"  # + band name, e.g. .../band/high
TOKENS_GENERATED = "tokens_generated"  # cumulative generated tokens
CONJECTURE_DISJUNCTIVE_FRACTION = "conjectures/disjunctive_fraction"
CONJECTURE_MEAN_CONCLUSION_LENGTH = "conjectures/mean_conclusion_length"  # characters
CONJECTURE_MEAN_CLAUSES = "conjectures/mean_clauses"
CONJECTURE_MALFORMED = "conjectures/malformed"  # count this iteration
CONJECTURE_KEPT = "conjectures/kept"  # count rewarded (p70 rule: 0 < s <= p70): the Conjecturer's training samples
CONJECTURE_ILL_FORMED = "conjectures/ill_formed"  # count dropped by the statement check
CONJECTURE_STATEMENT_CHECK_ERRORS = "conjectures/statement_check_errors"  # checks that ended in a system error or timeout (kept)
# Exact statement facts (testbed only, `sgs_jax.testbed.hacks`) over this iteration's
# conjectures after extraction and dedup: well-formed over all, the rest over the
# well-formed ones. The hack fractions are what the Guide is meant to hold down.
CONJECTURE_WELL_FORMED_FRACTION = "conjectures/well_formed_fraction"
CONJECTURE_TRUE_FRACTION = "conjectures/true_fraction"
CONJECTURE_EASY_DISJUNCT_FRACTION = "conjectures/hack/easy_disjunct_fraction"  # a disjunct already follows
CONJECTURE_CONCLUSION_IN_PREMISES_FRACTION = "conjectures/hack/conclusion_in_premises_fraction"  # the claim is given
CONJECTURE_REDUNDANT_PREMISE_FRACTION = "conjectures/hack/redundant_premise_fraction"  # a hypothesis is not needed
# The same hack fractions of the target set itself (step 0): each one's baseline.
TARGET_EASY_DISJUNCT_FRACTION = "targets/hack/easy_disjunct_fraction"
TARGET_CONCLUSION_IN_PREMISES_FRACTION = "targets/hack/conclusion_in_premises_fraction"
TARGET_REDUNDANT_PREMISE_FRACTION = "targets/hack/redundant_premise_fraction"
TARGET_DISJUNCTIVE_FRACTION = "targets/disjunctive_fraction"  # baseline of the target set
TARGET_MEAN_CONCLUSION_LENGTH = "targets/mean_conclusion_length"  # characters
SYNTHETIC_SOLVE_RATE = "synthetic_solve_rate"  # histogram of conjectures' solve rates
SOLVER_ENTROPY = "solver/entropy"  # mean per-token entropy of Solver samples, nats
SOLVER_SAMPLES_TARGETS = "solver/train_samples_targets"
SOLVER_SAMPLES_CONJECTURES = "solver/train_samples_conjectures"
SOLVER_LOSS = "solver/loss"
CONJECTURER_LOSS = "conjecturer/loss"
# CISPO's clipped-token fraction and mean importance weight are written as
# solver/clip_fraction and solver/mean_importance_weight (the Trainer's metric names).
# The loop never writes this name; sgs-report accepts it for the fraction as well.
CISPO_CLIP_FRACTION = "cispo/clip_fraction"
GUIDE_PARSE_FAILURES = "guide/parse_failures"  # count this iteration
GUIDE_RELEVANCE = "guide/relevance"  # mean sub-scores over parsed outputs
GUIDE_REDUNDANCY = "guide/redundancy"
GUIDE_CONCLUSION_COMPLEXITY = "guide/conclusion_complexity"
GUIDE_SCORE = "guide/score"  # mean Eq. 3 raw score (0..8) over parsed outputs
# Shadow Guide (`guide.shadow_score`, runs without the Guide): the same means of the
# Guide's scores of the kept conjectures, logged and never rewarded.
GUIDE_SHADOW_PARSE_FAILURES = "guide_shadow/parse_failures"
GUIDE_SHADOW_RELEVANCE = "guide_shadow/relevance"
GUIDE_SHADOW_REDUNDANCY = "guide_shadow/redundancy"
GUIDE_SHADOW_CONCLUSION_COMPLEXITY = "guide_shadow/conclusion_complexity"
GUIDE_SHADOW_SCORE = "guide_shadow/score"
VERIFY_SYSTEM_ERROR_RATE = "verify/system_error_rate"  # system errors / verifications
VERIFY_TIMEOUTS = "verify/timeouts"  # count this iteration
VERIFY_SECONDS = "verify/seconds"  # wall-clock seconds spent verifying this iteration
GENERATIONS_PER_SECOND = "throughput/generations_per_second"

# The metrics TensorBoard's HParams table shows beside each run's config (the hard split
# where the target set has one).
HPARAMS_METRICS = (CUMULATIVE_SOLVE_RATE, f"{CUMULATIVE_SOLVE_RATE}/hard", ITERATION_SOLVE_RATE, BASE_SOLVE_RATE,
                   GENERATIONS, SOLVER_ENTROPY, CONJECTURE_DISJUNCTIVE_FRACTION)

JSONL_NAME = "metrics.jsonl"
EVENT_FILE_PREFIX = "events.out.tfevents."
EXACT_HISTOGRAM_MAX_DISTINCT = 64  # up to this many distinct values, one bucket each
HISTOGRAM_BINS = 30  # otherwise, equal-width bins


def histogram_buckets(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TensorBoard-style buckets of 1-D finite values: (upper limits [m], counts [m]).

    Bucket i holds values in (limits[i-1], limits[i]] (the first from the minimum).
    With at most EXACT_HISTOGRAM_MAX_DISTINCT distinct values (solve rates k/8, say)
    each distinct value is its own bucket, so the histogram is exact; otherwise
    HISTOGRAM_BINS equal-width bins over [min, max]. Empty input gives empty arrays.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        return np.zeros(0), np.zeros(0)
    distinct, counts = np.unique(v, return_counts=True)
    if distinct.size <= EXACT_HISTOGRAM_MAX_DISTINCT:
        return distinct, counts.astype(np.float64)
    limits = np.linspace(v.min(), v.max(), HISTOGRAM_BINS + 1)[1:]
    # First limit >= value: the (lower, upper] rule; the minimum joins the first bucket.
    bucket = np.minimum(np.searchsorted(limits, v, side="left"), limits.size - 1)
    return limits, np.bincount(bucket, minlength=limits.size).astype(np.float64)


def _checked_step(step) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return int(step)


def _scalar_event(step: int, wall_time: float, scalars: Mapping[str, float]):
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def _histogram_event(step: int, wall_time: float, name: str, v: np.ndarray):
    limits, counts = histogram_buckets(v)
    histo = summary_pb2.HistogramProto(
        min=float(v.min()) if v.size else 0.0, max=float(v.max()) if v.size else 0.0,
        num=float(v.size), sum=float(v.sum()), sum_squares=float(np.dot(v, v)),
        bucket_limit=limits.tolist(), bucket=counts.tolist())
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=name, histo=histo)])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def _record_event(record: dict):
    """The TensorBoard event of one JSONL record (None when the record is malformed)."""
    try:
        step, wall_time = _checked_step(record["step"]), float(record["time"])
        if "scalars" in record:
            return _scalar_event(step, wall_time, {str(k): float(v) for k, v in record["scalars"].items()})
        return _histogram_event(step, wall_time, str(record["histogram"]), np.asarray(record["values"], dtype=np.float64))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


class MetricsWriter:
    """Writes scalars and histograms of one run to `run_dir` (TensorBoard + JSONL).

    Usage: `w = MetricsWriter(run_dir); w.write_scalars(step, {...}); w.close()`, or as
    a context manager. Invalid input raises ValueError before anything is written.

    truncate_after: None appends to what is there. An int N (a run resuming after step
    N; -1 for a run starting over) first drops every record of a step > N and rebuilds
    the TensorBoard event files from the records kept.
    """

    def __init__(self, run_dir: str | os.PathLike, truncate_after: int | None = None):
        self.run_dir = pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / JSONL_NAME
        kept = []
        if truncate_after is not None:
            jsonl.truncate_records(path, lambda r: isinstance(r.get("step"), int) and r["step"] <= truncate_after)
            kept = jsonl.read_records(path)[0]
            for old in self.run_dir.glob(EVENT_FILE_PREFIX + "*"):
                old.unlink()
        self._jsonl = jsonl.Appender(path, sync=True)
        # One event file: the kept records first, then what this writer adds. (Two files made
        # in the same second sort by a per-process counter as text, "10" before "9", and
        # TensorBoard reads files in name order: a later file must not hold earlier steps.)
        self._events = EventFileWriter(str(self.run_dir))
        for record in kept:
            event = _record_event(record)
            if event is not None:
                self._events.add_event(event)
        self._events.flush()
        self._closed = False

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """Record named scalar values (any real numbers; NaN/inf are kept) at `step`."""
        step = _checked_step(step)
        if not isinstance(scalars, Mapping) or not scalars:
            raise ValueError("scalars must be a non-empty mapping of name to number")
        clean = {}
        for name, value in scalars.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"metric names must be non-empty strings, got {name!r}")
            if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.generic)) or np.ndim(value):
                raise ValueError(f"metric {name!r} must be a real number, got {value!r}")
            clean[name] = float(value)
        now = time.time()
        self._write({"step": step, "time": now, "scalars": clean}, _scalar_event(step, now, clean))

    def write_histogram(self, step: int, name: str, values: Sequence[float] | np.ndarray) -> None:
        """Record the distribution of `values` (1-D, finite; may be empty) at `step`."""
        step = _checked_step(step)
        if not isinstance(name, str) or not name:
            raise ValueError(f"histogram name must be a non-empty string, got {name!r}")
        try:
            v = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"histogram {name!r} values must be numbers: {err}") from err
        if v.ndim != 1 or not np.all(np.isfinite(v)):
            raise ValueError(f"histogram {name!r} values must be a finite 1-D sequence")
        now = time.time()
        self._write({"step": step, "time": now, "histogram": name, "values": v.tolist()},
                    _histogram_event(step, now, name, v))

    def write_hparams(self, hparams: Mapping[str, bool | int | float | str], metrics: Sequence[str] = HPARAMS_METRICS) -> None:
        """Record the run's settings as TensorBoard hparams (event files only) at step 0:
        the experiment's columns (every name in `hparams`, and `metrics`) and this run's values."""
        from tensorboard.plugins.hparams import summary_v2 as hp

        if self._closed:
            raise ValueError("MetricsWriter is closed")
        now = time.time()
        columns = hp.hparams_config_pb([hp.HParam(name) for name in sorted(hparams)], [hp.Metric(m) for m in metrics],
                                       time_created_secs=now)
        for summary in (columns, hp.hparams_pb(dict(hparams), start_time_secs=now)):
            self._events.add_event(event_pb2.Event(wall_time=now, step=0, summary=summary))
        self._events.flush()

    def write_text(self, step: int, texts: Mapping[str, str]) -> None:
        """Record Markdown texts ({tag: text}) at `step` as TensorBoard text summaries (event files only)."""
        from tensorboard.plugins.text import summary_v2 as text_summary

        step = _checked_step(step)
        if self._closed:
            raise ValueError("MetricsWriter is closed")
        now = time.time()
        for tag, text in texts.items():
            self._events.add_event(event_pb2.Event(wall_time=now, step=step, summary=text_summary.text_pb(tag, text)))
        self._events.flush()

    def _write(self, record: dict, event) -> None:
        if self._closed:
            raise ValueError("MetricsWriter is closed")
        self._jsonl.append(record)  # fsync'd: a preempted run keeps every completed write
        self._events.add_event(event)
        self._events.flush()

    def close(self) -> None:
        """Flush and close both sinks; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._jsonl.close()
        self._events.close()


class DiscardingWriter:
    """`MetricsWriter`'s interface, writing nothing: what the processes of a multi-host job
    other than process 0 (the one writer, `parallel.distributed.is_writer`) hold."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = pathlib.Path(run_dir)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        pass

    def write_histogram(self, step: int, name: str, values: Sequence[float] | np.ndarray) -> None:
        pass

    def write_hparams(self, hparams: Mapping[str, bool | int | float | str], metrics: Sequence[str] = HPARAMS_METRICS) -> None:
        pass

    def write_text(self, step: int, texts: Mapping[str, str]) -> None:
        pass

    def close(self) -> None:
        pass
