"""Multi-seed experiments: every (config, seed) of an experiment as one `sgs-train` run.

An experiment file (`configs/experiments/*.py`) defines `get_experiment()` returning an
`Experiment`: named entries (a config file and preset plus overrides) crossed with seeds.
Run (label, seed) lives in `ROOT/<experiment>/<label>_seed<seed>/`; the runner gives each
its own `run.workdir`, `run.seed` and `experiment` = label (so config.json records the
label and `sgs-report` groups the seeds of an entry). Runs go one after another or as N
parallel processes, each writing its output to `train.log` in its folder. Unless the
command sets `run.compile_cache_dir`, the runs share one compilation cache,
`ROOT/<experiment>/compile_cache`: the entries of an experiment mostly run the same
programs, so only the first runs compile them.

Rerunning the same command continues: a run that finished with this exact command is
skipped (its `experiment_run.json` says so); any other run is started again and
`sgs-train` resumes it from its last checkpoint.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from sgs_jax.config import ConfigError, definition_function, flag_args, load_config, override_names
from sgs_jax.metrics import JSONL_NAME

RUNNER_FIELDS = ("run.workdir", "run.seed", "experiment")  # set by the runner for each run
CACHE_FIELD = "run.compile_cache_dir"  # the runner's shared default, unless a flag sets it
CACHE_NAME = "compile_cache"
RECORD_NAME = "experiment_run.json"  # written into a run folder when its process succeeds
LOG_NAME = "train.log"  # the run's sgs-train output (appended on every start)
STOP_GRACE_S = 60.0  # after SIGTERM, how long a run may take to stop before SIGKILL
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One config of an experiment. label: its name in folders and reports; config:
    `FILE.py[:PRESET]`, a relative FILE being relative to the experiment file's folder;
    overrides: {dotted field: value}, applied after the experiment's own."""

    label: str
    config: str
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """Entries x seeds. overrides: {dotted field: value} for every entry."""

    name: str
    entries: tuple[Entry, ...]
    seeds: tuple[int, ...]
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        problems = []
        for kind, name in [("experiment", self.name)] + [("entry", e.label) for e in self.entries]:
            if not isinstance(name, str) or not _NAME.match(name):
                problems.append(f"{kind} name {name!r} must be letters, digits, _ . - (a folder name)")
        labels = [e.label for e in self.entries]
        if not labels or len(set(labels)) != len(labels):
            problems.append(f"entries need distinct labels, got {labels}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or any(
                not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds):
            problems.append(f"seeds must be distinct non-negative integers, got {self.seeds}")
        for where, overrides in [("experiment", self.overrides)] + [(e.label, e.overrides) for e in self.entries]:
            owned = sorted(set(overrides) & set(RUNNER_FIELDS))
            if owned:
                problems.append(f"{where}: {', '.join(owned)} is set by the runner for each run")
        if problems:
            raise ValueError(f"experiment {self.name!r}: " + "; ".join(problems))


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One (entry, seed) run: its config spec, its `--config.FIELD=VALUE` flags in order
    (the runner's last) and the iterations it will run (for progress)."""

    label: str
    seed: int
    config: str
    flags: tuple[str, ...]
    workdir: pathlib.Path
    iterations: int

    @property
    def name(self) -> str:
        return self.workdir.name


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a run ended: status "done" (ran and exited 0), "skipped" (finished before with
    the same command), "failed" (non-zero exit) or "interrupted" (the runner was stopped)."""

    run: PlannedRun
    status: str
    returncode: int | None
    seconds: float


def override_args(overrides: Sequence[tuple[str, Any]] | Mapping[str, Any]) -> list[str]:
    """sgs-train's `--config.FIELD=VALUE` flags for (dotted field, Python value) overrides
    (`config.flag_args`, the one writer of sgs-train's override syntax)."""
    return flag_args(overrides)


def train_command(run: PlannedRun) -> list[str]:
    """The sgs-train invocation of a run, with this interpreter."""
    return [sys.executable, "-m", "sgs_jax.cli.train", "--config", run.config, *run.flags]


def load_experiment(path: str | os.PathLike) -> Experiment:
    """The Experiment of an experiment file (its `get_experiment()`). Raises ValueError
    (ConfigError for a missing file or function) for a bad file or an invalid experiment."""
    experiment = definition_function(os.fspath(path), "get_experiment", "experiment file")()
    if not isinstance(experiment, Experiment):
        raise ValueError(f"{path}: get_experiment() returned {type(experiment).__name__}, not an Experiment")
    return experiment


def plan_runs(experiment: Experiment, experiment_dir: str | os.PathLike, root: str | os.PathLike,
              only: Sequence[str] = (), seeds: Sequence[int] = (),
              extra: Sequence[str] = ()) -> list[PlannedRun]:
    """Every (entry, seed) run: seeds in order, entries in definition order within each. only / seeds:
    subsets (empty = all); extra: `--config.FIELD=VALUE` flags after the experiment's
    overrides (the command line's, passed to sgs-train as written). Each run's config is
    parsed from exactly the flags sgs-train will get and validated here, before anything
    starts; raises ValueError (naming the run and the field) otherwise."""
    labels = [e.label for e in experiment.entries]
    unknown = sorted(set(only) - set(labels))
    if unknown:
        raise ValueError(f"unknown entries {unknown}; {experiment.name} has {labels}")
    not_flags = [arg for arg in extra if not override_names([arg])]
    if not_flags:
        raise ValueError(f"{not_flags[0]!r} is not a --config.FIELD=VALUE flag")
    owned = sorted(set(override_names(extra)) & set(RUNNER_FIELDS))
    if owned:
        raise ValueError(f"{', '.join(owned)} is set by the runner for each run")
    runs = []
    # Seeds outer: an experiment stopped part way holds every config for its first seeds,
    # and parallel jobs run different configs side by side.
    for seed in seeds or experiment.seeds:
        for entry in experiment.entries:
            if only and entry.label not in only:
                continue
            file, sep, preset = entry.config.partition(":")
            config = str(pathlib.Path(experiment_dir, file).resolve()) + sep + preset
            workdir = pathlib.Path(root, experiment.name, f"{entry.label}_seed{seed}").resolve()
            runner = (("run.workdir", str(workdir)), ("run.seed", int(seed)), ("experiment", entry.label))
            flags = (*override_args(experiment.overrides), *override_args(entry.overrides), *extra)
            if CACHE_FIELD not in override_names(flags):
                runner += ((CACHE_FIELD, str(pathlib.Path(root, experiment.name, CACHE_NAME).resolve())),)
            flags += tuple(override_args(runner))
            try:
                cfg = load_config(config, flags)
            except ConfigError as err:
                raise ValueError(f"{entry.label} seed {seed}: {err}") from None
            runs.append(PlannedRun(entry.label, int(seed), config, flags, workdir, int(cfg.run.iterations)))
    return runs


def _recorded_args(run: PlannedRun) -> list[str]:
    return train_command(run)[1:]  # without the interpreter: a moved venv is the same command


def is_finished(run: PlannedRun) -> bool:
    """Whether the run's process already exited 0 with exactly this command."""
    try:
        record = json.loads((run.workdir / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("args") == _recorded_args(run) and record.get("returncode") == 0


def completed_iterations(workdir: pathlib.Path) -> int:
    """The last step the run's metrics.jsonl records (0 when none): iterations completed."""
    try:
        with open(workdir / JSONL_NAME, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            tail = f.read().splitlines()
    except OSError:
        return 0
    for line in reversed(tail):
        try:
            return int(json.loads(line.decode("utf-8"))["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a torn or partial line
    return 0


def _write_record(run: PlannedRun, seconds: float) -> None:
    path = run.workdir / RECORD_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"args": _recorded_args(run), "returncode": 0, "seconds": round(seconds, 1),
                               "finished": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _log_tail(path: pathlib.Path, lines: int = 8) -> str:
    try:
        text = path.read_bytes()[-8192:].decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class _Stop(Exception):
    """SIGTERM or SIGINT reached the runner."""


def run_experiment(runs: Sequence[PlannedRun], jobs: int = 1, out: TextIO | None = None,
                   poll_s: float = 2.0, heartbeat_s: float = 60.0) -> list[RunOutcome]:
    """Run the planned runs, `jobs` processes at a time, printing a progress line whenever
    a run starts, ends or completes an iteration (and every `heartbeat_s`). A failed run
    does not stop the others. On SIGTERM or Ctrl-C the running processes get SIGTERM
    (SIGKILL after STOP_GRACE_S) and the rest are left for the next invocation.
    out: where progress goes (default: sys.stdout at call time)."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    start = time.monotonic()
    outcomes: list[RunOutcome] = []
    waiting = collections.deque()
    for run in runs:
        if is_finished(run):
            outcomes.append(RunOutcome(run, "skipped", 0, 0.0))
        else:
            waiting.append(run)
    running: dict[str, tuple[PlannedRun, subprocess.Popen, float]] = {}
    total = len(runs)

    def say(text: str) -> None:
        print(f"[experiments] {text}", file=out or sys.stdout, flush=True)

    def progress() -> str:
        done = sum(o.status in ("done", "skipped") for o in outcomes)
        failed = sum(o.status == "failed" for o in outcomes)
        live = ", ".join(f"{r.name} {completed_iterations(r.workdir)}/{r.iterations}" for r, _, _ in running.values())
        return (f"{done}/{total} done, {len(running)} running" + (f" ({live})" if live else "")
                + f", {len(waiting)} waiting, {failed} failed, {_clock(time.monotonic() - start)} elapsed")

    def on_signal(signum, frame):
        raise _Stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    skipped = [o.run.name for o in outcomes]
    if skipped:
        say(f"already finished with this command, skipped: {', '.join(skipped)}")
    last_line, last_print = "", 0.0
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                run = waiting.popleft()
                run.workdir.mkdir(parents=True, exist_ok=True)
                resumed = completed_iterations(run.workdir)
                command = train_command(run)
                with open(run.workdir / LOG_NAME, "a", encoding="utf-8") as log:
                    log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n")
                    log.flush()
                    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
                running[run.name] = (run, process, time.monotonic())
                say(f"start {run.name}" + (f" (resuming after iteration {resumed})" if resumed else "")
                    + f", log {run.workdir / LOG_NAME}")
            for name, (run, process, started) in list(running.items()):
                code = process.poll()
                if code is None:
                    continue
                del running[name]
                seconds = time.monotonic() - started
                if code == 0:
                    _write_record(run, seconds)
                    outcomes.append(RunOutcome(run, "done", 0, seconds))
                    say(f"finished {name} in {_clock(seconds)}")
                else:
                    outcomes.append(RunOutcome(run, "failed", code, seconds))
                    say(f"FAILED {name} (exit {code}) after {_clock(seconds)}; end of "
                        f"{run.workdir / LOG_NAME}:\n{_log_tail(run.workdir / LOG_NAME)}")
            line = progress()
            now = time.monotonic()
            if line.rsplit(",", 1)[0] != last_line.rsplit(",", 1)[0] or now - last_print >= heartbeat_s:
                say(line)
                last_line, last_print = line, now
            if running:
                time.sleep(poll_s)
    except _Stop:
        say(f"stopping: {len(running)} running runs get SIGTERM; rerun the same command to resume them")
        deadline = time.monotonic() + STOP_GRACE_S
        for run, process, _ in running.values():
            _signal_group(process, signal.SIGTERM)
        for run, process, started in running.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
            outcomes.append(RunOutcome(run, "interrupted", process.returncode, time.monotonic() - started))
        outcomes.extend(RunOutcome(run, "interrupted", None, 0.0) for run in waiting)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    order = {run.name: i for i, run in enumerate(runs)}
    return sorted(outcomes, key=lambda o: order[o.run.name])


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    """Signal the run's whole process group (sgs-train and any verifier it started)."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
