"""The loop's conjecture diagnostics: statement check, shadow Guide, hack and split metrics.

The roles' *text* comes from a scripted sampler (so that conjectures are kept and the
Guide's scores differ from one conjecture to the next, which random models never give);
everything else is the real loop: extraction, the `prop` verifier, rewards, training of
random nano models, metrics. "Never rewarded" is checked where it shows: the Conjecturer's
weights after the update are bit-identical with and without the shadow Guide, and differ
when the same Guide scores are rewarded.
"""

import contextlib
import json
import os
import re

import jax
import numpy as np
import pytest

from sgs_jax import metrics as M
from sgs_jax.config import load_config
from sgs_jax.sampling import Completions
from sgs_jax.sampling.shapes import DEFAULT_PROMPT_BUCKETS
from sgs_jax.sgs.run import SGSRun
from tests.sgs.run_support import small_run_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# One conjecture per target (6 targets): padded disjunctions (a hack), the last ill-formed.
CONCLUSIONS = ["p ∨ q", "p ∨ ¬q", "p ∨ (q → q)", "p ∨ q ∧ q", "p ∨ ¬¬q", "p ∨ r"]


class ScriptedSampler:
    """Stands in for the model's text: the conjecture of target i is `c{i}`; of its two
    Solver proofs the first is right and the second wrong (solve rate 1/2); the Guide's
    relevance for `c{i}` is i mod 6. Targets get a failing proof."""

    prompt_buckets = DEFAULT_PROMPT_BUCKETS  # the real Sampler's (phases bucket prompt lengths with it)

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.targets_seen: list[str] = []

    def validate_prompts(self, prompts, params):
        return {}

    def keep_pool(self):
        return contextlib.nullcontext(self)  # no KV pool to keep

    def _text(self, prompt: str, sample: int) -> str:
        if "Score the conjecture" in prompt:
            i = int(re.search(r"theorem c(\d)", prompt).group(1))
            return (f"Reasons.\n<begin_relevance_score> {i % 6} <end_relevance_score>\n<begin_redundancy_score> 0 "
                    "<end_redundancy_score>\n<begin_conclusion_complexity_score> 1 <end_conclusion_complexity_score>")
        if "Write one simpler related theorem" in prompt:
            target = re.search(r"theorem (prop_\d+)", prompt).group(1)
            if target not in self.targets_seen:
                self.targets_seen.append(target)
            i = self.targets_seen.index(target)
            return f"```lean4\ntheorem c{i} (p q : Prop) (h₀ : p) : {CONCLUSIONS[i]} := by sorry\n```"
        statement = re.search(r"```lean4\n(theorem .*:= by)\n```", prompt, re.S).group(1)
        proof = ("  left\n  exact h₀" if sample == 0 else "  right\n  exact h₀") if statement.startswith("theorem c") \
            else "  exact bogus"
        return f"```lean4\n{statement}\n{proof}\n```"

    def generate(self, model, prompts, params, tokenizer=None, **_):
        rows, texts = [], []
        for index, prompt in enumerate(prompts):
            text = self.tokenizer.decode(list(prompt))
            for sample in range(params.num_samples):
                texts.append(self._text(text, sample))
                rows.append(self.tokenizer.encode(texts[-1], add_special_tokens=False) + [self.tokenizer.eos_token_id])
        n, width = len(rows), max((len(r) for r in rows), default=0)
        ids = np.zeros((n, width), np.int32)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        lengths = np.array([len(r) for r in rows], np.int32)
        mask = np.arange(width)[None, :] < lengths[:, None]
        k = params.num_samples
        return Completions(np.arange(n) // k, np.arange(n) % k, lengths, ids, np.where(mask, -1.0, 0.0),
                           np.where(mask, 0.5, 0.0), np.ones(n, bool), tuple(texts))


def _one_iteration(tmp_path, random_checkpoints, experiment, *overrides):
    workdir = tmp_path / f"{experiment}{len(overrides)}"
    cfg = load_config(os.path.join(ROOT, f"configs/{experiment}.py:testbed"),
                      small_run_overrides(random_checkpoints, workdir) + list(overrides))
    run = SGSRun(cfg)
    try:
        run.ctx.sampler = ScriptedSampler(run.tokenizer)
        run.run(iterations=1)
        params = jax.tree_util.tree_leaves(jax.device_get(run.roles.conjecturer.params))
    finally:
        run.close()
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    scalars = [r["scalars"] for r in rows if "scalars" in r]
    return scalars[0], scalars[-1], params


def test_shadow_guide_is_logged_and_never_rewarded(tmp_path, random_checkpoints):
    _, shadow, shadow_params = _one_iteration(tmp_path, random_checkpoints, "no_guide")  # the testbed preset turns it on
    _, plain, plain_params = _one_iteration(tmp_path, random_checkpoints, "no_guide", "--config.guide.shadow_score=false")
    _, guided, guided_params = _one_iteration(tmp_path, random_checkpoints, "sgs")
    # Five well-formed conjectures at solve rate 1/2 are kept; the Guide scores them all.
    assert shadow[M.CONJECTURE_KEPT] == plain[M.CONJECTURE_KEPT] == guided[M.CONJECTURE_KEPT] == 5
    assert shadow[M.GUIDE_SHADOW_RELEVANCE] == pytest.approx(np.mean([0, 1, 2, 3, 4]))
    assert shadow[M.GUIDE_SHADOW_SCORE] == guided[M.GUIDE_SCORE]
    assert shadow[M.GUIDE_SHADOW_PARSE_FAILURES] == 0.0
    assert M.GUIDE_RELEVANCE not in shadow and M.GUIDE_SHADOW_RELEVANCE not in plain
    assert M.GUIDE_SHADOW_RELEVANCE not in guided
    for a, b in zip(shadow_params, plain_params):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(shadow_params, guided_params))


def test_statement_check_drops_ill_formed_conjectures(tmp_path, random_checkpoints):
    _, unchecked, _ = _one_iteration(tmp_path, random_checkpoints, "no_guide", "--config.guide.shadow_score=false")
    _, checked, _ = _one_iteration(tmp_path, random_checkpoints, "no_guide", "--config.guide.shadow_score=false",
                                   "--config.sgs.check_conjecture_statement=true")
    assert checked[M.CONJECTURE_ILL_FORMED] == 1.0 and checked[M.CONJECTURE_STATEMENT_CHECK_ERRORS] == 0.0
    assert M.CONJECTURE_ILL_FORMED not in unchecked
    # The dropped conjecture costs no Solver samples (k = 2).
    assert unchecked["generations"] - checked["generations"] == 2
    assert unchecked["verify/rejected"] - checked["verify/rejected"] == 2  # its statement no longer reaches the verifier
    # The shape metrics describe what the Conjecturer proposed, checked or not.
    for name in (M.CONJECTURE_WELL_FORMED_FRACTION, M.CONJECTURE_EASY_DISJUNCT_FRACTION, M.CONJECTURE_DISJUNCTIVE_FRACTION):
        assert checked[name] == unchecked[name]
    assert checked[M.CONJECTURE_WELL_FORMED_FRACTION] == pytest.approx(5 / 6)
    assert checked[M.CONJECTURE_TRUE_FRACTION] == 1.0
    assert checked[M.CONJECTURE_EASY_DISJUNCT_FRACTION] == 1.0  # every conjecture pads `p`
    assert checked[M.CONJECTURE_CONCLUSION_IN_PREMISES_FRACTION] == 0.0


def _calibrated_targets(tmp_path) -> str:
    """Six statements of today's generator in the target builder's file format (`band` from
    the difficulty; every other target `hard`, standing in for the base model's calibration):
    a target file with a hard split, built without a model."""
    from sgs_jax.testbed.generator import DEFAULT_MIX, generate, to_d3k_json

    items = generate(DEFAULT_MIX, 6, seed=3, prefix="prop", disjunctive_fraction=0.0)  # the ScriptedSampler reads prop_N
    data = to_d3k_json(items, extra=[{"base_solve_rate": 0.0 if i % 2 else 0.5, "hard": i % 2 == 1} for i in range(6)])
    path = tmp_path / "calibrated_targets.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_split_and_baseline_metrics(tmp_path, random_checkpoints):
    targets = ["--config.targets.source=file", f"--config.targets.path={_calibrated_targets(tmp_path)}"]
    first, last, _ = _one_iteration(tmp_path, random_checkpoints, "no_guide", "--config.guide.shadow_score=false", *targets)
    from sgs_jax.sgs.bootstrap import load_target_set

    cfg = load_config(os.path.join(ROOT, "configs/no_guide.py:testbed"), small_run_overrides(random_checkpoints, tmp_path) + targets)
    groups = load_target_set(cfg).groups()
    assert "hard" in groups and any(g.startswith("band/") for g in groups)
    for group in groups:
        assert last[f"{M.CUMULATIVE_SOLVE_RATE}/{group}"] == 0.0  # the scripted Solver never proves a target
        assert f"{M.ITERATION_SOLVE_RATE}/{group}" in last
        assert first[f"{M.CUMULATIVE_SOLVE_RATE}/{group}"] == 0.0
    assert M.CUMULATIVE_SOLVE_RATE_HARD in last
    for name in (M.TARGET_EASY_DISJUNCT_FRACTION, M.TARGET_CONCLUSION_IN_PREMISES_FRACTION, M.TARGET_REDUNDANT_PREMISE_FRACTION):
        assert 0.0 <= first[name] <= 1.0
    assert first[M.TARGET_CONCLUSION_IN_PREMISES_FRACTION] == 0.0  # the generator rejects given claims
