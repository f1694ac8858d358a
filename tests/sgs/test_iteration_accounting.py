"""One real iteration's accounting (SPEC Sections 4.10 and 5): which targets Expert
Iteration samples, the generation counter with a prompt that is too long (and every
Solver objective going on past it), buffered
proofs of targets that are no longer sampled still training with their own prompts, and
a verification server that refuses the API key stopping the run.

Random nano models (they verify nothing), 6 testbed targets, k = 2, the `prop` verifier.
"""

import dataclasses
import os

import pytest

from sgs_jax.config import load_config
from sgs_jax.sgs.iteration import run_iteration
from sgs_jax.sgs.run import SGSRun
from sgs_jax.sgs.target_set import TargetSet
from sgs_jax.sgs.testbed_pretrain import MODELS_DIR
from sgs_jax.sgs.types import Rollout, StoredProofSample
from sgs_jax.verify import VerifierUnavailable
from tests.sgs.run_support import small_run_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_expert_iteration_sampling_counting_and_buffer(tmp_path, random_checkpoints):
    cfg = load_config(os.path.join(ROOT, "configs/ei_solver_only.py:testbed"),
                      small_run_overrides(random_checkpoints, tmp_path / "run"))
    run = SGSRun(cfg)
    try:
        targets = list(run.target_set.targets)
        # Target 1's statement is far too long for the 192-token prompt + generation cap.
        targets[1] = dataclasses.replace(targets[1], statement=targets[1].statement.replace(":= by", "∧ True " * 300 + ":= by"))
        full = [f"\n  exact h{i}" for i in range(cfg.targets.max_proofs)]  # target 0's store is full
        target_set = TargetSet(targets, {targets[0].id: full}, cfg.targets.max_proofs)
        # A proof of target 0 stored by an earlier iteration, with the prompt it was sampled from.
        rollout = Rollout(targets[0].id, (5, 6, 7), "x", (-1.0, -1.0, -1.0), "stop")
        run.ei_buffer.add_iteration([StoredProofSample(rollout, 1.0, 0, full[0], (1, 9, 9))])
        out = run_iteration(0, run.ctx, run.roles, target_set, run.settings, run.ei_buffer)
    finally:
        run.close()
    assert out["targets/sampled"] == 5  # target 0 holds max_proofs proofs: not sampled at all
    assert out["solver/skipped_prompts"] == 1  # target 1 does not fit
    assert out["iteration/generations"] == 2 * 4  # k x the four prompts really sampled
    attempts = sum(out[f"verify/{s}"] for s in ("verified", "rejected", "lean_error", "timeout", "system_error"))
    assert attempts + out["solver/extraction_failures"] == 2 * 4
    # The buffer's stored proof of the unsampled target 0 is trained on (plus whatever this
    # iteration stored: random models verify nothing, so nothing).
    assert out["solver/train_sequences"] == 1 + out["verify/verified"]
    assert out["solver/train_samples_targets"] == out["solver/train_sequences"]


@pytest.mark.parametrize("config", ["sgs.py:testbed", "cispo_solver_only.py:testbed"], ids=["reinforce_half", "cispo"])
def test_a_prompt_too_long_is_skipped_by_every_solver_objective(tmp_path, random_checkpoints, config):
    """REINFORCE½ and CISPO select from solve rates, and a target whose prompt does not fit
    has no attempts: the iteration skips it and goes on (it raised before)."""
    cfg = load_config(os.path.join(ROOT, "configs", config), small_run_overrides(random_checkpoints, tmp_path / "run"))
    run = SGSRun(cfg)
    try:
        targets = list(run.target_set.targets)
        targets[1] = dataclasses.replace(targets[1], statement=targets[1].statement.replace(":= by", "∧ True " * 300 + ":= by"))
        out = run_iteration(0, run.ctx, run.roles, TargetSet(targets, {}, cfg.targets.max_proofs), run.settings, run.ei_buffer)
    finally:
        run.close()
    assert out["solver/skipped_prompts"] == 1  # target 1; the other five were attempted
    assert out["iteration/generations"] >= 2 * 5


@pytest.mark.skipif(not (MODELS_DIR / "base" / "config.json").exists(), reason="packaged testbed models not built")
def test_refused_api_key_stops_the_run_with_the_servers_message(tmp_path, monkeypatch):
    """A Kimina server that refuses the key stops the iteration at its first verification
    (no proof is recorded as a system error); the error carries the server's own message.
    The packaged testbed Solver writes real proofs, so verification requests are made."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "tests", "verify"))  # the fake server lives with the verify tests
    from fake_kimina import FakeKimina

    server = FakeKimina(api_key="right")
    monkeypatch.setenv("LEAN_SERVER_API_KEY", "wrong")
    overrides = [
        f"--config.run.workdir={tmp_path / 'run'}", "--config.targets.limit=4", "--config.sgs.proofs_per_problem=2",
        "--config.sgs.use_conjecturer=False", "--config.sgs.use_guide=False", "--config.verify.backend=remote",
        f"--config.verify.options.url={server.url}", "--config.verify.options.retries=0", "--config.verify.cache=False",
        "--config.run.base_solve_rate=false",  # else step 0's measurement meets the refusal first, in SGSRun()
    ]
    run = SGSRun(load_config(os.path.join(ROOT, "configs/sgs.py:testbed"), overrides))
    try:
        with pytest.raises(VerifierUnavailable, match="HTTP 401 Invalid API key"):
            run.run(1)
    finally:
        run.close()
        server.stop()
    assert run.iteration == 0 and 1 <= len(server.requests) <= 4  # at most one per sender thread, none after
