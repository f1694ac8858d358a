"""What a run shows while it works: a bar (or line) per phase, compile notices and an
end-of-iteration summary a newcomer can read.

    progress = RunProgress("auto")              # bars on a terminal, plain lines otherwise
    with phase(progress, "prove + verify", 1024, "samples") as shown:
        ...  shown.advance(n)  (or the sampler's callback: progress.sampler_callback())
    progress.say(iteration_summary(...))
    progress.close()

Modes: `bar` (tqdm bars that update in place, plus one line per finished phase), `lines`
(one line per finished phase, and one every LINE_INTERVAL_S during a long phase: what CI
logs and `train.log` get), `off` (nothing), `auto` (`bar` when the stream is a terminal,
else `lines`). `phase(None, ...)` does nothing, so library callers (and tests) stay
quiet unless they pass a RunProgress.

Compilation is reported as it happens, from JAX's own monitoring events: the first compile
of a phase in this process prints what is compiling, and each phase line says how long its
compiles took (or how many programs came from the persistent compilation cache instead).
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Iterator, Mapping, TextIO

import jax
from jax import monitoring

from sgs_jax import metrics as M

MODES = ("auto", "bar", "lines", "off")
LINE_INTERVAL_S = 60.0  # lines mode: a phase running longer prints its count this often
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_SHOWN_COMPILE_S = 0.5  # a phase line mentions compiling when it took at least this long


def _what_compiles(phase_name: str) -> str:
    return "the training step" if phase_name.startswith("train") else "the sampler"


class _Phase:
    """One running phase: its count, rate, compile time, and its bar in `bar` mode."""

    def __init__(self, owner: "RunProgress", name: str, total: int, unit: str):
        self.owner, self.name, self.total, self.unit = owner, name, max(0, int(total)), unit
        self.count = 0
        self.compile_s = 0.0
        self.compiles = 0
        self.cache_hits = 0
        self.start = self._last_line = time.monotonic()
        self.bar = None
        if owner.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc=f"  {name}", unit=f" {unit}", file=owner.stream, leave=False,
                            dynamic_ncols=True, mininterval=0.5)

    def advance(self, n: int = 1) -> None:
        """Count `n` more units done."""
        if n <= 0:
            return
        self.count += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.owner.mode == "lines" and time.monotonic() - self._last_line >= LINE_INTERVAL_S:
            self._last_line = time.monotonic()
            share = f" ({self.count / self.total:.0%})" if self.total else ""
            self.owner.say(f"  {self.name}: {self.count:,}/{self.total:,} {self.unit}{share}, {self._rate()}")

    def _rate(self) -> str:
        seconds = max(time.monotonic() - self.start, 1e-9)
        return f"{self.count / seconds:,.1f} {self.unit}/s"

    def compile_started(self) -> None:
        if not self.owner.noticed:
            self.owner.say("compiling: each phase compiles its programs when it first runs (most of the first "
                           "iteration's time); later iterations compile only new shapes")
        if self.name not in self.owner.noticed:
            self.owner.noticed.add(self.name)
            cached = " (or loading it from the persistent compilation cache)" if jax.config.jax_compilation_cache_dir else ""
            self.owner.say(f"  {self.name}: compiling {_what_compiles(self.name)}{cached}")
        if self.bar is not None:
            self.bar.set_postfix_str("compiling", refresh=True)

    def compile_finished(self, seconds: float) -> None:
        self.compile_s += seconds
        self.compiles += 1
        if self.bar is not None:
            self.bar.set_postfix_str("", refresh=False)

    def close(self) -> float:
        """End the phase, print its line (none for a phase with nothing to do); returns its wall seconds."""
        seconds = time.monotonic() - self.start
        if self.bar is not None:
            self.bar.close()
        if not self.total and not self.count:
            return seconds
        parts = [f"{self.count:,} {self.unit} in {seconds:.1f} s ({self._rate()})"]
        if self.cache_hits:
            parts.append(f"{self.cache_hits} programs from the persistent compilation cache")
        if self.compile_s >= _SHOWN_COMPILE_S:
            parts.append(f"{self.compile_s:.1f} s of it compiling")
        self.owner.say(f"  {self.name}: " + ", ".join(parts))
        return seconds


class RunProgress:
    """The run's progress display (see the module docstring). stream: default stdout."""

    def __init__(self, mode: str = "auto", stream: TextIO | None = None):
        if mode not in MODES:
            raise ValueError(f"progress mode must be one of {MODES}, got {mode!r}")
        self.stream = stream if stream is not None else sys.stdout
        if mode == "auto":
            mode = "bar" if getattr(self.stream, "isatty", lambda: False)() else "lines"
        self.mode = mode
        self.noticed: set[str] = set()  # phases whose first compile was announced
        self.compile_s = 0.0  # compiling seconds since the last take_compile_seconds()
        self._phase: _Phase | None = None
        self._listening = mode != "off"
        if self._listening:
            monitoring.register_scalar_listener(self._on_scalar)
            monitoring.register_event_duration_secs_listener(self._on_duration)
            monitoring.register_event_listener(self._on_event)

    # ---- output ---------------------------------------------------------------------------
    def say(self, text: str) -> None:
        """Print `[sgs] text` (each line of it), above any live bar."""
        if self.mode == "off":
            return
        lines = "\n".join(f"[sgs] {line}" for line in text.splitlines())
        if self.mode == "bar":
            from tqdm import tqdm

            tqdm.write(lines, file=self.stream)
        else:
            print(lines, file=self.stream, flush=True)

    # ---- phases ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str, total: int, unit: str) -> Iterator[_Phase]:
        """A phase of `total` `unit`s; yields the object to `advance`."""
        shown = _Phase(self, name, total, unit)
        outer, self._phase = self._phase, shown
        try:
            yield shown
        finally:
            self._phase = outer
            shown.close()

    def sampler_callback(self) -> Callable[[int, int], None] | None:
        """A `Sampler.generate(progress=...)` callback advancing the current phase by the
        rows each call reports finished (one callback per generate call)."""
        current = self._phase
        if current is None:
            return None
        seen = [0]

        def on_rows(finished: int, total: int) -> None:
            current.advance(finished - seen[0])
            seen[0] = finished

        return on_rows

    def take_compile_seconds(self) -> float:
        """Seconds spent compiling since the last call (phases and the rest alike)."""
        seconds, self.compile_s = self.compile_s, 0.0
        return seconds

    # ---- JAX monitoring listeners ---------------------------------------------------------
    def _on_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        if event == _COMPILE_EVENT and self._phase is not None:  # recorded when a compile starts
            self._phase.compile_started()

    def _on_duration(self, event: str, seconds: float, **kwargs: Any) -> None:
        if event == _COMPILE_EVENT:
            self.compile_s += seconds
            if self._phase is not None:
                self._phase.compile_finished(seconds)

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if event == _CACHE_HIT_EVENT and self._phase is not None:
            self._phase.cache_hits += 1

    def close(self) -> None:
        """Stop listening to JAX's events. Idempotent."""
        if self._listening:
            self._listening = False
            monitoring.unregister_scalar_listener(self._on_scalar)
            monitoring.unregister_event_duration_listener(self._on_duration)
            monitoring.unregister_event_listener(self._on_event)


class _Quiet:
    """What `phase(None, ...)` yields: counts nothing, shows nothing."""

    def advance(self, n: int = 1) -> None:
        pass


def phase(progress: RunProgress | None, name: str, total: int, unit: str):
    """`progress.phase(...)`, or a context that does nothing when `progress` is None."""
    if progress is None:
        return contextlib.nullcontext(_Quiet())
    return progress.phase(name, total, unit)


def sampler_callback(progress: RunProgress | None) -> Callable[[int, int], None] | None:
    """`progress.sampler_callback()`, or None (no callback) when `progress` is None."""
    return None if progress is None else progress.sampler_callback()


# ---- the end-of-iteration summary -----------------------------------------------------------
def _count(scalars: Mapping[str, float], name: str) -> int:
    return int(round(scalars.get(name, 0.0)))


def iteration_summary(iteration: int, total: int, scalars: Mapping[str, float], solved: int, num_targets: int,
                      seconds: float, compile_seconds: float, k: int, conjecturer: str, guide: bool) -> str:
    """The lines printed after an iteration, from its logged scalars.

    iteration: iterations completed (the metrics' step). solved / num_targets: targets
    solved so far / |D|. seconds, compile_seconds: the iteration's wall time and the part
    of it spent compiling. k: Solver samples per problem. conjecturer: "trained", "frozen" or "none" (no Conjecturer: no
    conjecture numbers are shown). guide: whether the Guide scores conjectures.
    """
    head = f"iteration {iteration}/{total} done in {seconds:.0f} s"
    if compile_seconds >= _SHOWN_COMPILE_S:
        head += f" ({compile_seconds:.0f} s of it compiling)"
    lines = [
        head,
        f"  targets: {solved}/{num_targets} solved so far ({scalars[M.CUMULATIVE_SOLVE_RATE]:.1%}), "
        f"{_count(scalars, 'targets/newly_solved')} new this iteration; "
        f"pass@{k} this iteration {scalars[M.ITERATION_SOLVE_RATE]:.1%}",
    ]
    if conjecturer != "none" and "conjectures/generated" in scalars:
        drawn = _count(scalars, "conjectures/generated")
        malformed, duplicates = _count(scalars, M.CONJECTURE_MALFORMED), _count(scalars, "conjectures/duplicates")
        rewarded = _count(scalars, M.CONJECTURE_KEPT)
        trained = "" if conjecturer == "trained" else " (frozen Conjecturer: not trained)"
        lines.append(f"  conjectures: {drawn} drawn, {drawn - malformed - duplicates} well-formed and new "
                     f"({malformed} malformed, {duplicates} duplicates), {rewarded} rewarded "
                     f"(solve rate in (0, p70]){trained}")
        if guide and rewarded:
            lines.append(f"  Guide: scored the {rewarded} rewarded, "
                         f"{_count(scalars, M.GUIDE_PARSE_FAILURES)} replies unparsable")
    sequences = _count(scalars, "solver/train_sequences")
    steps = _count(scalars, "solver/optimizer_steps")
    lines.append(f"  Solver: trained on {sequences} samples ({_count(scalars, M.SOLVER_SAMPLES_TARGETS)} from targets, "
                 f"{_count(scalars, M.SOLVER_SAMPLES_CONJECTURES)} from conjectures) in {steps} optimizer steps; "
                 f"sample entropy {scalars.get(M.SOLVER_ENTROPY, 0.0):.2f} nats/token")
    lines.append(f"  generations: {_count(scalars, M.GENERATIONS):,} so far "
                 f"({scalars.get(M.GENERATIONS_PER_SECOND, 0.0):.1f}/s this iteration)")
    return "\n".join(lines)
