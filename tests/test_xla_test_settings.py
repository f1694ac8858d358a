"""The suite's XLA:CPU setting (tests/conftest.py: LLVM at -O0) leaves the programs alone.

Tests compile with `--xla_backend_optimization_level=0` to save compile time. That is only
sound while the level changes the machine code and not the optimised HLO that a test's
assertions are about: a model's gradient program, compiled here and in a subprocess at
the level a run uses, must be the same HLO text.
"""

import contextlib
import io
import os
import re
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from sgs_jax.models import create_model, tiny
    cfg = tiny(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
               head_dim=16, max_position_embeddings=128)
    graphdef, state = nnx.split(create_model(cfg, seed=0))
    loss = lambda state, ids: jnp.mean(nnx.merge(graphdef, state)(ids) ** 2)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 64)), jnp.int32)
    print(jax.jit(jax.grad(loss)).lower(state, ids).compile().as_text())
""")


def _without_metadata(hlo: str) -> str:
    """The program alone: source locations and the stack-frame tables dropped."""
    hlo = re.sub(r"^(?:FileNames|FunctionNames|FileLocations|StackFrames)\n.*?\n\n", "", hlo, flags=re.S | re.M)
    return re.sub(r", (?:metadata=\{[^}]*\}|stack_frame_id=\d+)", "", hlo)


def test_the_test_optimisation_level_compiles_the_same_hlo_as_a_run():
    assert "--xla_backend_optimization_level=0" in os.environ["XLA_FLAGS"]  # what conftest set
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(PROGRAM, {})  # here, at the tests' level
    tests = _without_metadata(out.getvalue())
    flags = [f for f in os.environ["XLA_FLAGS"].split() if not f.startswith("--xla_backend_optimization_level")]
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = _without_metadata(done.stdout)  # at XLA's default level, as a run compiles
    assert "fusion" in run and len(run) > 10_000
    assert tests == run
