"""The target set: D3k-format loading, solved bookkeeping, proof cap, state round trip."""

import json

import pytest

from sgs_jax.sgs.target_set import TargetFileError, TargetSet


def _file(tmp_path, entries):
    path = tmp_path / "targets.json"
    path.write_text(json.dumps({"iterations": [], "target_statements": entries}))
    return path


def _entry(i, proofs=()):
    return {"id": f"t{i}", "header": "import Mathlib\n", "theorem": f"theorem t{i} : {i} = {i} := by", "tag": "", "source": "", "proofs": list(proofs)}


def test_load_record_and_round_trip(tmp_path):
    path = _file(tmp_path, {f"t{i}": _entry(i, ["rfl"] if i == 0 else []) for i in range(3)})
    ts = TargetSet.load(path, max_proofs=2)
    assert len(ts) == 3 and ts.num_solved() == 1
    assert [t.id for t in ts.unsolved()] == ["t1", "t2"]
    assert ts.record_proof("t1", "rfl") is True
    assert ts.record_proof("t1", "rfl") is False  # duplicate: stored once
    ts.record_proof("t1", "simp")
    ts.record_proof("t1", "norm_num")  # over the cap of 2
    assert ts.proofs["t1"] == ["rfl", "simp"]
    assert ts.solved_fraction() == pytest.approx(2 / 3)
    ts.iterations.append({"iteration": 0})
    ts.save(tmp_path / "state.json")
    again = TargetSet.load(tmp_path / "state.json", max_proofs=2)
    assert again.proofs == ts.proofs and again.iterations == [{"iteration": 0}]
    assert again.by_id["t0"].header == "import Mathlib\n"


@pytest.mark.parametrize(
    "content,match",
    [("{not json", "cannot read"), (json.dumps({"x": 1}), "D3k format"), (json.dumps({"target_statements": {}}), "no targets"),
     (json.dumps({"target_statements": {"a": {"theorem": "theorem a : True"}}}), "does not end")],
)
def test_bad_files_give_clear_errors(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TargetFileError, match=match):
        TargetSet.load(path)


def test_real_d3k_loads(d3k_path):
    ts = TargetSet.load(d3k_path)
    assert len(ts) == 3323 and ts.num_solved() == 0
    assert all(t.statement.endswith(":= by") for t in ts.targets)


def test_swallowed_assign_by_is_repaired():
    from sgs_jax.sgs.extraction import blank_lean_comments
    from sgs_jax.sgs.target_set import repair_statement

    fixed = repair_statement("theorem t (x : ℕ) : x = x  -- median formula := by")
    assert fixed == "theorem t (x : ℕ) : x = x  -- median formula\n:= by"
    assert blank_lean_comments(fixed).rstrip().endswith(":= by")
    assert repair_statement("theorem t : True := by") == "theorem t : True := by"


def test_all_d3k_statements_end_in_a_live_assign_by(d3k_path):
    from sgs_jax.sgs.extraction import blank_lean_comments

    ts = TargetSet.load(d3k_path)
    assert all(blank_lean_comments(t.statement).rstrip().endswith(":= by") for t in ts.targets)


@pytest.mark.parametrize("env", [
    {"HF_HUB_OFFLINE": "1"},  # offline mode (what launch/local.sh sets), empty cache
    # No server at all: the same error after huggingface_hub's retries (about 25 s of waiting).
    pytest.param({"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "2"}, marks=pytest.mark.slow),
])
def test_hub_targets_unreachable_is_a_clear_error(tmp_path, env):
    """targets.source=hub without the hub: one TargetFileError saying how to use a file."""
    import os
    import subprocess
    import sys

    script = (
        "from sgs_jax.sgs.target_set import TargetFileError, download_from_hub\n"
        "try:\n    download_from_hub()\nexcept TargetFileError as err:\n    print('ERR', err)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    full_env = {**os.environ, **env, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", script], env=full_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ERR cannot get D_3k_prover_dataset.json of the dataset 'LukeBailey181Pub/D_3k'")
    assert "hf download --repo-type dataset LukeBailey181Pub/D_3k" in out.stdout and "--config.targets.source=file" in out.stdout


def test_records_survive_the_state_file_and_name_groups(tmp_path):
    entries = {}
    for i in range(5):
        entry = _entry(i, ["rfl"] if i in (0, 3) else [])
        entry.update({"difficulty": 3 * i, "band": "low" if i < 3 else "high", "hard": i >= 2})
        entries[f"t{i}"] = entry
    ts = TargetSet.load(_file(tmp_path, entries))
    assert ts.records["t4"] == {"tag": "", "source": "", "difficulty": 12, "band": "high", "hard": True}
    groups = ts.groups()
    assert groups == {"hard": ("t2", "t3", "t4"), "band/low": ("t0", "t1", "t2"), "band/high": ("t3", "t4")}
    assert ts.solved_fraction(groups["hard"]) == pytest.approx(1 / 3)
    assert ts.solved_fraction(groups["band/high"]) == 0.5 and ts.solved_fraction(()) == 0.0
    ts.save(tmp_path / "state.json")
    again = TargetSet.load(tmp_path / "state.json")
    assert again.records == ts.records and again.groups() == groups
    head = ts.first(2)
    assert len(head) == 2 and head.records["t1"]["band"] == "low" and head.proofs["t0"] == ["rfl"]
    assert head.groups() == {"hard": (), "band/low": ("t0", "t1")}


def test_plain_d3k_entries_have_no_groups(tmp_path):
    ts = TargetSet.load(_file(tmp_path, {f"t{i}": _entry(i) for i in range(2)}))
    assert ts.groups() == {}
