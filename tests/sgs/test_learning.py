"""The SGS loop really learns: two iterations on the testbed raise the Solver's pass rate.

Starts from the packaged testbed base and Guide models, runs the real loop (Conjecturer,
Solver, Guide, `prop` verification, REINFORCE½ and Conjecturer updates) on easy targets
(the packaged targets outside the hard split), and compares the Solver's verified fraction
on those targets before and after, measured with the same sampling seed.
"""

import json
import os

import pytest

from sgs_jax.config import load_config
from sgs_jax.sgs.phases import prove_phase
from sgs_jax.sgs.run import SGSRun
from sgs_jax.sgs.testbed_pretrain import MODELS_DIR
from sgs_jax.sgs.types import Problem
from sgs_jax.testbed.generator import DEFAULT_PATH
from tests.sgs.run_support import shared_compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(
    not (MODELS_DIR / "base" / "config.json").exists(), reason="packaged testbed models not built"
)


def _verified_fraction(run: SGSRun, seed: int) -> float:
    problems = [Problem.from_target(t) for t in run.target_set.targets]
    proved = prove_phase(run.ctx, run.roles.solver.model, problems, k=8,
                         max_total_len=run.settings.solver_max_total_len, seed=seed, chunk_problems=len(problems))
    attempts = [a for group in proved.attempts for a in group]
    return sum(a.verified for a in attempts) / len(attempts)


def test_two_iterations_raise_the_solver_pass_rate(tmp_path):
    data = json.loads(DEFAULT_PATH.read_text(encoding="utf-8"))
    easy = {k: e for k, e in data["target_statements"].items() if not e.get("hard", False)}  # the packaged set marks its hard split
    (tmp_path / "easy.json").write_text(json.dumps({"iterations": [], "target_statements": easy}), encoding="utf-8")
    cfg = load_config(
        os.path.join(ROOT, "configs/sgs.py:testbed"),
        [f"--config.run.workdir={tmp_path / 'run'}", "--config.targets.source=file", f"--config.targets.path={tmp_path / 'easy.json'}",
         "--config.targets.limit=24", "--config.run.iterations=2", "--config.sampling.max_batch=64", *shared_compile_cache()],
    )
    run = SGSRun(cfg)
    try:
        before = _verified_fraction(run, seed=123)
        run.run()
        after = _verified_fraction(run, seed=123)
    finally:
        run.close()
    print(f"verified fraction before {before:.3f}, after {after:.3f}")
    # The claim is the direction: two iterations raise the verified fraction of the same
    # samples' seed (measured on the calibrated target set: 0.052 -> 0.250).
    assert after > before
