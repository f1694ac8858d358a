"""The target-set builder end to end with a random model: pool, calibration, selection, file."""

import json

from sgs_jax.sgs import testbed_targets
from sgs_jax.sgs.target_set import TargetSet
from sgs_jax.testbed.generator import band_of, candidate_pool


def test_build_writes_a_calibrated_target_file(tmp_path, random_checkpoints):
    data = testbed_targets.build(random_checkpoints / "base", count=4, samples=2, seed=100, candidates=12,
                                iteration1_solve_rate=0.0)  # a random model solves nothing
    entries = list(data["target_statements"].values())
    assert [e["id"] for e in entries] == [f"prop_{i:04d}" for i in range(4)]
    pool = {" ".join(g.statement.lean().split()[2:]) for g in candidate_pool(12)}
    for e in entries:
        assert " ".join(e["theorem"].split()[2:]) in pool  # chosen from the pool, renamed
        assert e["base_solve_rate"] == 0.0 and e["hard"] and e["useful_lemmas"] >= 1  # a random model proves nothing
        assert e["band"] == band_of(e["difficulty"])
    path = tmp_path / "targets.json"
    path.write_text(json.dumps(data))
    ts = TargetSet.load(path)
    assert ts.groups()["hard"] == tuple(e["id"] for e in entries)
