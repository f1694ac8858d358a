import dataclasses
import random
import statistics

import pytest

from sgs_jax.testbed.checker import check_proof
from sgs_jax.testbed.generator import (BANDS, Candidate, Knobs, band_of, difficulty_histogram, expected_pass_at, generate,
                                       load_targets, select_targets, target_file)
from sgs_jax.testbed.hacks import is_disjunctive
from sgs_jax.testbed.parser import parse_statement
from sgs_jax.testbed.prover import prove_statement
from sgs_jax.testbed.prune import proof_length, prune_proof


def _mean_length(knobs, n=25):
    return statistics.mean(g.difficulty for g in generate([knobs], n, seed=5))


def test_depth_and_premises_raise_proof_length():
    shallow = _mean_length(Knobs(atoms=3, premises=1, depth=1))
    deep = _mean_length(Knobs(atoms=3, premises=1, depth=3))
    more = _mean_length(Knobs(atoms=3, premises=3, depth=3))
    assert shallow < deep < more, (shallow, deep, more)


def test_generation_is_reproducible():
    a = [g.statement.lean() for g in generate([Knobs()], 5, seed=3)]
    b = [g.statement.lean() for g in generate([Knobs()], 5, seed=3)]
    assert a == b


def test_disjunctive_fraction_is_held():
    items = generate([Knobs(atoms=3, premises=2, depth=2)], 50, seed=8, disjunctive_fraction=0.1)
    share = sum(is_disjunctive(g.statement) for g in items) / len(items)
    assert 0.06 <= share <= 0.1
    natural = generate([Knobs(atoms=3, premises=2, depth=2)], 50, seed=8)
    assert sum(is_disjunctive(g.statement) for g in natural) / 50 > 0.25


def test_bands_cover_every_difficulty():
    assert [band_of(d) for d in (2, 8, 9, 16, 17, 60)] == ["low", "low", "mid", "mid", "high", "high"]
    assert BANDS[0][1] == 0
    with pytest.raises(ValueError):
        band_of(61)


# ---- selection ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def candidates():
    items = generate([Knobs(atoms=3, premises=2, depth=2, distractors=1)], 120, seed=12, disjunctive_fraction=0.2)
    rng = random.Random(0)
    out = []
    for item in items:
        rate = rng.choice([0.0, 0.0, 0.0, 0.0625, 0.25, 0.75])
        out.append(Candidate(item, rate, rng.choice([0, 1, 3]) if rate == 0 else 0))
    return out


def test_selection_is_stable_for_a_seed_and_composed_as_asked(candidates):
    chosen = select_targets(candidates, 40, seed=3)
    again = select_targets(candidates, 40, seed=3)
    other = select_targets(candidates, 40, seed=4)
    names = [c.item.statement.name for c in chosen]
    assert names == [c.item.statement.name for c in again]
    assert names != [c.item.statement.name for c in other]
    assert len(set(names)) == 40
    expected = sum(expected_pass_at(c.base_solve_rate, 8) for c in chosen) / 40
    biggest = max(expected_pass_at(c.base_solve_rate, 8) for c in chosen) / 40
    assert 0.15 <= expected < 0.15 + biggest  # base-solvable ones stop at the iteration-1 target
    assert all(c.useful_lemmas > 0 for c in chosen if c.hard)  # hard ones are within a lemma's reach
    assert sum(is_disjunctive(c.item.statement) for c in chosen) <= int(0.06 * 40)
    # The hard split is fixed by the candidates, not by the order.
    assert {c.item.statement.name for c in chosen if c.hard} == {c.item.statement.name for c in again if c.hard}


def test_selection_interleaves_strata(candidates):
    chosen = select_targets(candidates, 40, seed=3)
    hard_share = sum(c.hard for c in chosen) / 40
    assert abs(sum(c.hard for c in chosen[:20]) / 20 - hard_share) <= 0.1


def test_selection_needs_enough_candidates(candidates):
    with pytest.raises(ValueError, match="suitable candidates"):
        select_targets(candidates, 200, seed=0)


def test_selection_refuses_a_base_that_solves_too_little(candidates):
    weak = [dataclasses.replace(c, base_solve_rate=0.0, useful_lemmas=1) if i % 50 else c for i, c in enumerate(candidates)]
    with pytest.raises(ValueError, match="expected pass@8 of .* below 15%"):
        select_targets(weak, 40, seed=3)
    assert len(select_targets(weak, 40, seed=3, iteration1_solve_rate=0.0)) == 40


def test_target_file_renames_and_records_the_split(candidates):
    chosen = select_targets(candidates, 40, seed=3)
    data = target_file(chosen)["target_statements"]
    assert list(data) == [f"prop_{i:04d}" for i in range(40)]
    for (sid, entry), c in zip(data.items(), chosen):
        assert entry["theorem"].startswith(f"theorem {sid} ")
        assert parse_statement(entry["theorem"]).hypotheses == c.item.statement.hypotheses
        assert entry["hard"] == c.hard and entry["base_solve_rate"] == c.base_solve_rate
        assert entry["band"] == band_of(entry["difficulty"])


# ---- the packaged target set ---------------------------------------------------------------------


def test_default_target_set_format_and_spread():
    targets = list(load_targets().values())
    assert len(targets) == 192
    for e in targets:
        assert set(e) >= {"id", "header", "theorem", "tag", "source", "proofs", "difficulty", "band", "base_solve_rate",
                          "hard", "useful_lemmas"}
        assert e["header"] == "" and e["proofs"] == [] and e["theorem"].endswith(":= by")
        assert e["hard"] == (e["base_solve_rate"] == 0)
        assert not e["hard"] or e["useful_lemmas"] >= 1
    hist = difficulty_histogram(targets)
    assert min(hist) <= 6 and max(hist) >= 30 and len(hist) >= 20
    bands = {name: sum(e["band"] == name for e in targets) for name, _, _ in BANDS}
    assert all(n >= 0.1 * len(targets) for n in bands.values()), bands
    disjunctive = sum(is_disjunctive(parse_statement(e["theorem"])) for e in targets) / len(targets)
    assert disjunctive < 0.1  # D3k: about 4-8%
    expected = sum(expected_pass_at(e["base_solve_rate"], 8) for e in targets) / len(targets)
    assert 0.1 <= expected <= 0.2
    hard = sum(e["hard"] for e in targets) / len(targets)
    assert abs(sum(e["hard"] for e in targets[:96]) / 96 - hard) <= 0.05  # the testbed preset's prefix


def test_default_targets_difficulty_is_the_pruned_proof_length_and_proofs_check():
    targets = list(load_targets().values())
    for e in random.Random(0).sample(targets, 40):
        statement = parse_statement(e["theorem"])
        proof = prune_proof(statement, prove_statement(statement).proof_text())
        assert proof_length(proof) == e["difficulty"]
        assert check_proof(e["theorem"], proof).ok
