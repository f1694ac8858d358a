"""The memory plan: parameter bytes agree with the exact parameter count and sharding; the
roles plan counts every role in its form, phase by phase, and sgs-plan says whether the
busiest phase fits a device's HBM."""

import contextlib
import io
import os

import pytest

from sgs_jax.cli import plan as plan_cli
from sgs_jax.config import load_config
from sgs_jax.models import deepseek_prover_v2_7b, preset, tiny
from sgs_jax.parallel.memory import GIB, plan_memory
from sgs_jax.sgs.roles import memory_plan


def test_7b_parameter_bytes_per_device():
    config = deepseek_prover_v2_7b()
    plan = plan_memory(config, (1, 8, 1), micro_batch=8, seq_len=8192, sample_batch=64)
    params = dict((name, b) for name, b, _ in plan.rows)["parameters"]
    # Every dimension sharded over fsdp divides by 8 except the norms (replicated, 4096 each).
    norms = (2 * config.num_layers + 1) * config.hidden_size * 2
    assert abs(params - ((config.num_params() * 2 - norms) / 8 + norms)) < 1
    assert 6.9e9 < config.num_params() < 7.0e9


def test_tensor_parallel_divides_heads_and_kv_cache():
    config = tiny(num_heads=8, num_kv_heads=4, head_dim=4)
    one = dict((n, b) for n, b, _ in plan_memory(config, (1, 1, 1), 1, 64, 8).rows)
    four = dict((n, b) for n, b, _ in plan_memory(config, (1, 1, 4), 1, 64, 8).rows)
    assert four["KV cache (sampling)"] == one["KV cache (sampling)"] / 4


def test_cli_prints_table(capsys):
    assert plan_cli.main(["--preset", "tiny", "--dtype", "float32", "--fsdp", "2", "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "parameters" in out and "total" in out
    assert plan_cli.main(["--fsdp", "0"]) == 2


# ---- the roles of a run ----------------------------------------------------------------------

PAPER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "sgs.py:paper")


def _paper_plan(*overrides, mesh=(1, 8, 1)):
    cfg = load_config(PAPER, list(overrides))
    model = preset("deepseek-prover-v2-7b", dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype)
    return memory_plan(cfg, model, mesh), model, cfg


def test_roles_plan_counts_every_role_in_its_form():
    plan, model, cfg = _paper_plan()
    n, norms = model.num_params(), (2 * model.num_layers + 1) * model.hidden_size
    sharded_fp32 = ((n - norms) * 4 / 8 + norms * 4)  # fsdp=8 splits all but the norms
    for role in ("Solver", "Conjecturer"):
        assert abs(plan.item_bytes(f"{role} master weights") - sharded_fp32) < 1
        assert abs(plan.item_bytes(f"{role} Adam moments") - 2 * sharded_fp32) < 1
        assert abs(plan.item_bytes(f"{role} gradient accumulator") - sharded_fp32) < 1
        assert plan.item_bytes(f"{role} inference weights") == n * 2  # bf16, replicated over fsdp
    assert plan.item_bytes("Guide weights") == n * 2  # frozen: only the inference form
    # The Sampler's paged pool: sampling.kv_pool_tokens (512K tokens: 256 rows of 2K on
    # average) in whole pages per batch shard, KV heads whole on fsdp=8.
    tokens = cfg.sampling.kv_pool_tokens
    assert tokens == 524_288 and tokens % (8 * cfg.sampling.page_size) == 0
    kv = tokens * 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2 / 8
    assert plan.item_bytes("KV pool") == kv and kv / GIB == 30.0
    phases = dict(plan.phases)
    assert [p for p, _ in plan.phases] == ["sample: Conjecturer", "sample: Solver", "sample: Guide", "train: Solver", "train: Conjecturer"]
    resident = ["Solver master weights", "Solver Adam moments", "Conjecturer master weights", "Conjecturer Adam moments", "Guide weights"]
    assert set(phases["sample: Solver"]) == {"KV pool", "Solver inference weights", *resident}
    assert "KV pool" not in phases["train: Solver"] and "Solver inference weights" not in phases["train: Solver"]
    assert plan.phase_bytes("sample: Solver") == kv + n * 2 + sum(plan.item_bytes(i) for i in resident)


def test_offload_keeps_only_what_each_phase_uses():
    plan, _, _ = _paper_plan("--config.roles.offload_idle=true")
    phases = dict(plan.phases)
    assert set(phases["sample: Solver"]) == {"KV pool", "Solver inference weights", "Solver master weights"}
    assert set(phases["sample: Guide"]) == {"KV pool", "Guide weights"}
    assert not any(i.startswith(("Conjecturer", "Guide")) for i in phases["train: Solver"])


def test_kept_copies_live_until_their_training_phase():
    plan, _, _ = _paper_plan("--config.sampling.keep_inference_weights=true")
    phases = dict(plan.phases)
    assert "Conjecturer inference weights" in phases["sample: Solver"]
    assert "Conjecturer inference weights" in phases["train: Solver"]
    assert "Conjecturer inference weights" not in phases["train: Conjecturer"]
    assert "Solver inference weights" not in phases["train: Solver"]


def test_master_form_has_no_copies():
    plan, _, _ = _paper_plan("--config.sampling.weights_dtype=float32", "--config.sampling.weights_layout=training")
    names = [name for name, _, _ in plan.rows]
    assert not any("inference weights" in name for name in names)
    assert "Solver master weights" in dict(plan.phases)["sample: Solver"]
    assert plan.item_bytes("Guide weights") == plan.item_bytes("Solver master weights")


# The paged pool of 512K tokens fits beside all three roles; a pool of 1M tokens (60 GiB per
# chip, what 128 slots x 8K reserved before paging) fits only with idle roles offloaded.
@pytest.mark.parametrize("extra, verdict", [
    ([], "fits"),
    (["--config.sampling.kv_pool_tokens=1048576"], "DOES NOT FIT"),
    (["--config.sampling.kv_pool_tokens=1048576", "--config.roles.offload_idle=true"], "fits"),
])
def test_cli_roles_says_whether_the_busiest_phase_fits(extra, verdict):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert plan_cli.main(["--roles", "--config", PAPER, "--hbm-gib", "95"] + extra) == 0
    text = out.getvalue()
    assert "sample: Conjecturer" in text and "KV pool" in text and "Guide weights" in text
    last = [line for line in text.splitlines() if line.startswith("peak")][0]
    assert f"of 95.0 GiB HBM: {verdict} (" in last


def test_cli_estimate_with_hbm_and_bad_values(capsys):
    assert plan_cli.main(["--preset", "tiny", "--dtype", "float32", "--fsdp", "2", "--seq-len", "64", "--hbm-gib", "1"]) == 0
    assert "GiB HBM: fits" in capsys.readouterr().out
    assert plan_cli.main(["--hbm-gib", "0"]) == 2
    assert plan_cli.main(["--roles", "--config", PAPER, "--config.sampling.weights_layout=fsdp"]) == 2
    assert "sampling.weights_layout must be one of" in capsys.readouterr().err


# ---- roles.placement=split: one plan per sub-mesh ------------------------------------------------

SPLIT = ["--config.roles.placement=split", "--config.roles.guide_devices=4"]


def test_split_plans_each_sub_mesh_with_its_own_roles():
    """Hand computation for the paper config with the Guide on 4 devices (data=4) and the
    trainers on fsdp=4: the Guide's devices hold its bf16 weights (replicated) and its own
    Sampler's KV pool (512K tokens over 4 row shards); the trainers' plan is the shared plan
    on fsdp=4 without the Guide."""
    from sgs_jax.sgs.roles import GUIDE, guide_mesh_shape, own_memory_plans

    plan, model, cfg = _paper_plan(*SPLIT, mesh=(1, 4, 1))
    shared, _, _ = _paper_plan(mesh=(1, 4, 1))
    assert guide_mesh_shape(cfg) == (4, 1, 1)
    (shape, guide), = own_memory_plans(cfg, model).values()
    assert shape == (4, 1, 1) and list(own_memory_plans(cfg, model)) == [GUIDE]
    n = model.num_params()
    per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2  # keys + values, bf16, all layers
    kv = 524_288 * per_token / 4  # 524,288 / (64-token pages x 4 shards) = 2048 whole pages per shard: no rounding
    assert guide.item_bytes("Guide weights") == n * 2 and guide.item_bytes("KV pool") == kv and kv / GIB == 60.0
    assert guide.phases == (("sample: Guide", ("KV pool", "Guide weights")),)
    assert guide.peak == ("sample: Guide", n * 2 + kv)
    assert "Guide weights" not in [name for name, _, _ in plan.rows]
    assert [p for p, _ in plan.phases] == ["sample: Conjecturer", "sample: Solver", "train: Solver", "train: Conjecturer"]
    for phase, items in plan.phases:  # each phase: the shared plan's phase less the Guide
        assert items == tuple(i for i in dict(shared.phases)[phase] if i != "Guide weights")
        assert plan.phase_bytes(phase) == shared.phase_bytes(phase) - shared.item_bytes("Guide weights")
    assert own_memory_plans(_paper_plan()[2], model) == {}  # shared: no sub-mesh of its own


def test_cli_roles_prints_each_sub_mesh_under_split():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert plan_cli.main(["--roles", "--config", PAPER, "--fsdp", "4", "--hbm-gib", "95"] + SPLIT) == 0
    text = out.getvalue()
    trainers, guide = text.split("== Guide's sub-mesh: data=4 fsdp=1 tensor=1 ==")
    assert "== Solver's sub-mesh: data=1 fsdp=4 tensor=1 ==" in trainers and "sample: Conjecturer" in trainers
    assert "Guide" not in trainers.split("==")[-1] and "sample: Guide" in guide
    peaks = [line for line in text.splitlines() if line.startswith("peak")]
    assert len(peaks) == 2 and peaks[1].startswith("peak 72.872 GiB per device (sample: Guide) of 95.0 GiB HBM: fits")
    shared = io.StringIO()
    with contextlib.redirect_stdout(shared):
        assert plan_cli.main(["--roles", "--config", PAPER, "--hbm-gib", "95"]) == 0
    assert "sub-mesh" not in shared.getvalue() and len([l for l in shared.getvalue().splitlines() if l.startswith("peak")]) == 1


def test_a_conjecturer_sub_mesh_plans_its_trainer_and_sampling_there():
    """The paper config with the Conjecturer on 8 devices of its own (fsdp=8) and the Solver
    on fsdp=8: the Conjecturer's devices hold exactly what the shared plan on the same mesh
    shape gives the Conjecturer (master weights, Adam, accumulator, its micro-step, its
    inference copy and its Sampler's KV pool), in its two phases; the Solver's plan has no
    Conjecturer item and no Conjecturer phase."""
    from sgs_jax.sgs.roles import CONJECTURER, own_memory_plans

    apart = ["--config.roles.placement=split", "--config.roles.conjecturer_devices=8"]
    plan, model, cfg = _paper_plan(*apart)
    shared, _, _ = _paper_plan()
    (shape, conj), = own_memory_plans(cfg, model).values()
    assert shape == (1, 8, 1) and list(own_memory_plans(cfg, model)) == [CONJECTURER]
    assert [p for p, _ in conj.phases] == ["sample: Conjecturer", "train: Conjecturer"]
    for phase, items in conj.phases:  # the shared phase less the other roles' items, each the same size
        assert items == tuple(i for i in dict(shared.phases)[phase] if "Solver" not in i and "Guide" not in i)
        assert all(conj.item_bytes(i) == shared.item_bytes(i) for i in items)
    assert not [name for name, _, _ in plan.rows if "Conjecturer" in name]
    assert [p for p, _ in plan.phases] == [p for p, _ in shared.phases if "Conjecturer" not in p]
    assert plan.phase_bytes("train: Solver") == shared.phase_bytes("train: Solver") - sum(
        shared.item_bytes(f"Conjecturer {item}") for item in ("master weights", "Adam moments"))
