import random
import statistics

from sgs_jax.testbed.checker import check_proof
from sgs_jax.testbed.generator import Knobs, difficulty_histogram, generate, load_targets
from sgs_jax.testbed.parser import parse_statement
from sgs_jax.testbed.prover import prove_statement


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


def test_default_target_set_format_and_spread():
    targets = load_targets()
    assert 200 <= len(targets) <= 500
    for sid, e in targets.items():
        assert set(e) >= {"id", "header", "theorem", "tag", "source", "proofs", "difficulty"}
        assert e["id"] == sid and e["header"] == "" and e["proofs"] == [] and e["theorem"].endswith(":= by")
    hist = difficulty_histogram(targets.values())
    assert min(hist) <= 3 and max(hist) >= 30 and len(hist) >= 20


def test_default_targets_difficulty_matches_prover_and_proofs_check():
    targets = list(load_targets().values())
    for e in random.Random(0).sample(targets, 40):
        result = prove_statement(parse_statement(e["theorem"]))
        assert result.length == e["difficulty"]
        assert check_proof(e["theorem"], result.proof_text()).ok
