import re

from sgs_jax.testbed.checker import check_proof
from sgs_jax.testbed.generator import Knobs, generate
from sgs_jax.testbed.parser import parse_statement
from sgs_jax.testbed.warmstart import build_sets


def test_warmstart_rows_are_well_formed():
    items = generate([Knobs(atoms=3, premises=2, depth=2)], 6, seed=11)
    sets = build_sets([("", g.statement.lean()) for g in items], seed=0)
    assert len(sets["solver"]) == 6 and sets["conjecturer"] and len(sets["guide"]) >= 18
    for row in sets["solver"]:
        prompt = row["messages"][0]["content"]
        assert prompt.startswith("Complete the following Lean 4 code:\n\n```lean4\n")
        m = re.fullmatch(r"```lean4\n(.*?:= by)\n(.*)\n```", row["completion"], re.S)
        assert m and check_proof(m.group(1), m.group(2)).ok
    for row in sets["conjecturer"]:
        m = re.fullmatch(r"```lean4\n(.*:= by) sorry\n```", row["completion"], re.S)
        assert m
        parse_statement(m.group(1))
    for row in sets["guide"]:
        assert row["completion"].rstrip().endswith("<end_conclusion_complexity_score>")
