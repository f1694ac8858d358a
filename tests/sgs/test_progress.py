"""The progress display: phase lines and bars, compile notices from JAX's own events, the
end-of-iteration summary, and silence when no display is asked for."""

import io

import jax
import jax.numpy as jnp
import pytest

from sgs_jax import metrics as M
from sgs_jax.sgs.progress import RunProgress, iteration_summary, phase, sampler_callback


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _lines(stream):
    return stream.getvalue().splitlines()


def test_auto_mode_follows_the_stream():
    for stream, mode in ((io.StringIO(), "lines"), (_Terminal(), "bar")):
        progress = RunProgress("auto", stream)
        assert progress.mode == mode
        progress.close()
    with pytest.raises(ValueError, match="progress mode"):
        RunProgress("loud")


def test_lines_mode_counts_phases_and_announces_compiles():
    out = io.StringIO()
    progress = RunProgress("lines", out)
    try:
        with phase(progress, "prove + verify", 10, "samples") as shown:
            callback = sampler_callback(progress)
            for finished in (2, 5, 5, 9):  # one generate call: cumulative finished rows
                callback(finished, 9)
            shown.advance(1)
            # A fresh program compiles inside the phase: announced once, timed.
            jax.jit(lambda x: jnp.sin(x) * 3.0 + jnp.float32(0.123456))(jnp.ones(7)).block_until_ready()
            jax.jit(lambda x: jnp.cos(x) * 5.0 + jnp.float32(0.654321))(jnp.ones(7)).block_until_ready()
        with phase(progress, "Guide", 0, "replies"):
            pass  # nothing to do: no line
    finally:
        progress.close()
    lines = _lines(out)
    assert lines[0].startswith("[sgs] compiling: each phase compiles its programs when it first runs")
    assert lines[1].startswith("[sgs]   prove + verify: compiling the sampler")
    assert lines[2].startswith("[sgs]   prove + verify: 10 samples in ") and "samples/s" in lines[2]
    assert len(lines) == 3
    assert progress.take_compile_seconds() > 0 and progress.take_compile_seconds() == 0


def test_off_and_none_show_nothing(capsys):
    out = io.StringIO()
    progress = RunProgress("off", out)
    with phase(progress, "conjecture", 3, "samples") as shown:
        shown.advance(3)
    progress.say("hello")
    progress.close()
    with phase(None, "conjecture", 3, "samples") as shown:
        shown.advance(3)
    assert sampler_callback(None) is None
    assert out.getvalue() == "" and capsys.readouterr().out == ""


def test_bar_mode_draws_a_bar_and_keeps_the_phase_line():
    out = _Terminal()
    progress = RunProgress("bar", out)
    with phase(progress, "train Solver", 4, "sequences") as shown:
        shown.advance(4)
    progress.close()
    text = out.getvalue()
    assert "  train Solver:   0%|" in text and "0/4" in text  # the bar, drawn in place (redrawn at most twice a second)
    assert "[sgs]   train Solver: 4 sequences in " in text


SCALARS = {
    M.CUMULATIVE_SOLVE_RATE: 0.25, M.ITERATION_SOLVE_RATE: 0.125, "targets/newly_solved": 3.0,
    "conjectures/generated": 12.0, M.CONJECTURE_MALFORMED: 2.0, "conjectures/duplicates": 1.0, M.CONJECTURE_KEPT: 4.0,
    M.GUIDE_PARSE_FAILURES: 1.0, "solver/train_sequences": 40.0, "solver/optimizer_steps": 2.0,
    M.SOLVER_SAMPLES_TARGETS: 30.0, M.SOLVER_SAMPLES_CONJECTURES: 10.0, M.SOLVER_ENTROPY: 0.5,
    M.GENERATIONS: 1234.0, M.GENERATIONS_PER_SECOND: 20.0,
}


def test_summary_says_what_it_counts():
    text = iteration_summary(3, 10, SCALARS, 6, 24, 41.0, 12.0, 8, "trained", True)
    assert text.splitlines() == [
        "iteration 3/10 done in 41 s (12 s of it compiling)",
        "  targets: 6/24 solved so far (25.0%), 3 new this iteration; pass@8 this iteration 12.5%",
        "  conjectures: 12 drawn, 9 well-formed and new (2 malformed, 1 duplicates), 4 rewarded (solve rate in (0, p70])",
        "  Guide: scored the 4 rewarded, 1 replies unparsable",
        "  Solver: trained on 40 samples (30 from targets, 10 from conjectures) in 2 optimizer steps; "
        "sample entropy 0.50 nats/token",
        "  generations: 1,234 so far (20.0/s this iteration)",
    ]
    frozen = iteration_summary(3, 10, SCALARS, 6, 24, 41.0, 0.0, 8, "frozen", False)
    assert "(frozen Conjecturer: not trained)" in frozen and "Guide" not in frozen and "compiling" not in frozen


def test_summary_of_a_run_without_a_conjecturer_has_no_conjecture_numbers():
    solver_only = {k: v for k, v in SCALARS.items() if not k.startswith(("conjectures/", "guide/"))}
    text = iteration_summary(1, 2, solver_only, 6, 24, 5.0, 0.0, 8, "none", False)
    assert "conjecture" not in text.split("Solver:")[0] and "Guide" not in text and "rewarded" not in text
