"""`sgs-plan --aot`: the paper preset's real programs compiled deviceless for TPU v5p-8.

The 7B width with 3 layers and 1K-token sequences (the full depth takes minutes: see
benchmarks/aot_plan.py). Asserts: the training micro-step and the decode chunk compile;
no batch row runs on every chip (rows and slots split over the 8 chips, and the per-chip
FLOPs are an eighth of the work); the gradients are never all-reduced in full; each peak is
within the per-chip budget sgs-plan prints. Skipped without libtpu (the `tpu` extra).
The one compile (train + decode, shared by every test here) costs about 90 CPU seconds: it is the check that the
paper preset still compiles, shards and fits for real hardware, so it runs in CI.
"""

import contextlib
import io
import json
import re

import pytest

from sgs_jax.cli import plan as plan_cli
from sgs_jax.config import load_config
from sgs_jax.models.build import abstract_model
from sgs_jax.parallel.aot import CHIPS, parse_topology, topology
from sgs_jax.parallel.memory import kv_bytes, parameter_bytes
from sgs_jax.parallel.mesh import make_mesh
from sgs_jax.parallel.rules import layout_rules
from sgs_jax.rl.train_step import programs_for
from sgs_jax.sampling import Sampler
from sgs_jax.sgs.plan import non_embedding_params, plan_model_config, solver_train_config
from tests.parallel.tpu_support import tpu_devices

# 3 layers: no buffer of the programs but the layer stacks has that leading size (layers are
# scanned, so the compile costs no more than with 2).
LAYERS = 3
ARGS = ["--aot", "v5p:2x2x2", "--config", "configs/sgs.py:paper", "--num-layers", str(LAYERS), "--seq-len", "1024"]


@pytest.fixture(scope="module")
def hlo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hlo")


@pytest.fixture(scope="module")
def reports(hlo_dir):
    tpu_devices("v5p:2x2x2")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # sgs-plan itself, as a script would read its --json output
        assert plan_cli.main(ARGS + ["--programs", "train,decode", "--json", "--hlo-dir", str(hlo_dir)]) == 0
    return {r["name"]: r for r in map(json.loads, out.getvalue().splitlines())}


def test_programs_compile_and_fit_the_printed_budget(reports):
    assert set(reports) == {"train", "decode"}
    for r in reports.values():
        assert r["budget_bytes"] == CHIPS["v5p"].usable_hbm
        assert 0 < r["peak_bytes"] <= r["budget_bytes"] and r["fits"]
        assert r["roofline_s"] > 0 and r["compile_s"] > 0


def test_no_batch_replication():
    cfg = load_config("configs/sgs.py:paper", [])
    topo = topology("v5p:2x2x2")
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices=topo.devices)
    model, _ = plan_model_config(cfg, num_layers=2)
    graphdef, abstract = abstract_model(model)
    progs = programs_for(graphdef, abstract, solver_train_config(cfg), mesh)
    assert progs.batch_shardings.input_ids.shard_shape((8, 1024)) == (1, 1024)
    slots = cfg.sampling.max_batch
    sampler = Sampler.from_config(cfg, model, mesh)
    state = sampler.abstract_state(slots, 8 * 64)
    assert state.pending.sharding.shard_shape((slots,)) == (slots // 8,)
    # The pool [KV heads, layers, pages, page, head dim]: each chip holds its batch shard's pages.
    assert state.pool.keys.sharding.shard_shape(state.pool.keys.shape)[2] == 64


def test_per_chip_work_is_an_eighth_and_gradients_are_reduce_scattered(reports):
    train = reports["train"]
    model, _ = plan_model_config(load_config("configs/sgs.py:paper", []), num_layers=LAYERS)
    tokens_per_chip = 8 * 1024 / 8
    # fwd + remat fwd + bwd = 4 passes of 2 N FLOPs per token, plus attention: between 6 N and 12 N.
    assert 6 * non_embedding_params(model) * tokens_per_chip < train["flops"] < 12 * non_embedding_params(model) * tokens_per_chip
    # Parameter gradients (1.24B fp32) leave each chip reduce-scattered (windowed loops of
    # collective-permutes or reduce-scatters), never all-reduced: only norms and scalars are.
    assert train["collective_bytes"]["all-reduce"] < 1 << 20
    grad_shard = model.num_params() * 2 / 8  # bf16 gradients, one eighth per chip
    assert train["collective_bytes"]["reduce-scatter"] + train["collective_bytes"]["collective-permute"] > grad_shard


def test_topology_names():
    assert parse_topology("v5p:2x2x2") == ("v5p", "2x2x2", 8)
    assert parse_topology("v5e:4x4") == ("v5e", "4x4", 16)
    assert parse_topology("cpu:8") == ("cpu", "8", 8)
    assert parse_topology("v4:2x2x1")[2] == 8  # libtpu shows v4's two TensorCores as devices
    for bad in ("v5p", "v9:2x2", "v5p:2xx2", "v5p:0x2"):
        with pytest.raises(ValueError, match="topology"):
            parse_topology(bad)
    assert plan_cli.main(["--aot", "v9:2x2"]) == 2


def test_cpu_plan_of_the_testbed_and_bad_sizes(capsys):
    """cpu:8 runs everywhere (the 8 simulated devices): the testbed's programs, as JSON."""
    args = ["--aot", "cpu:8", "--config", "configs/sgs.py:testbed", "--programs", "train,apply", "--json"]
    assert plan_cli.main(args) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in reports] == ["train", "apply"]
    assert all(r["platform"] == "cpu" and r["chip"] == "h200" and r["fits"] for r in reports)
    longest = load_config("configs/sgs.py:testbed").sampling.solver_max_total_len  # the Solver's longest bucket
    assert reports[0]["per"] == f"micro-batch 32 x {longest} tokens" and reports[0]["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
    assert plan_cli.main(args[:4] + ["--programs", "train", "--micro-batch", "12"]) == 2
    assert "micro_batch_size=12 rows" in capsys.readouterr().err
    # A decode workload the KV pool cannot hold (128 rows x 1,024 tokens > 65,536) is refused.
    assert plan_cli.main(args[:4] + ["--programs", "decode", "--decode-tokens", "1024"]) == 2
    assert "the KV pool holds 4,096" in capsys.readouterr().err


def test_split_plan_compiles_the_solvers_sub_mesh():
    """roles.placement=split: the programs of the 4 devices the Guide (or the Guide and the
    Conjecturer) leave of cpu:8, and a role on its own devices is not among what the
    Solver's training phase holds."""
    from sgs_jax.sgs.plan import plan_programs

    cfg = load_config("configs/sgs.py:testbed", ["--config.roles.placement=split", "--config.roles.guide_devices=4"])
    plan = plan_programs(cfg, topology("cpu:8"), ("apply",))
    assert plan.mesh == {"data": 1, "fsdp": 4, "tensor": 1} and "Guide parameters" not in plan.held_besides
    shared = plan_programs(load_config("configs/sgs.py:testbed"), topology("cpu:8"), ("apply",))
    assert shared.mesh["fsdp"] == 8 and "Guide parameters" in shared.held_besides
    assert "Conjecturer parameters" in plan.held_besides and "Conjecturer Adam state" in shared.held_besides
    # The Conjecturer on 2 devices of its own as well: the Solver's programs get the other 4.
    apart = load_config("configs/sgs.py:testbed", ["--config.roles.placement=split", "--config.roles.guide_devices=2",
                                                   "--config.roles.conjecturer_devices=2"])
    plan = plan_programs(apart, topology("cpu:8"), ("apply",))
    assert plan.mesh == {"data": 1, "fsdp": 4, "tensor": 1}
    assert not {"Guide parameters", "Conjecturer parameters", "Conjecturer Adam state"} & set(plan.held_besides)


def test_decode_gathers_no_weights_and_reads_weights_plus_live_kv(reports):
    """The paper preset's decode chunk (256 slots, rows of 2,048 cached tokens on average in
    a 512K-token pool, bf16 weights in the inference layout): no all-gather at all, and HBM
    traffic per step (the paged kernel counted as reading the live pages: its operand is
    the whole pool, which the HLO walk would count in full) between weights + live KV less
    the embedding table (a gather of 256 rows) and 1.3x weights + live KV."""
    decode = reports["decode"]
    assert decode["collective_bytes"]["all-gather"] == 0
    assert decode["custom_calls"].get("tpu_custom_call") and decode["unestimated_kernel_bytes"] > 0
    cfg = load_config("configs/sgs.py:paper", [])
    model, _ = plan_model_config(cfg, num_layers=LAYERS)
    mesh = tuple(decode["mesh"][a] for a in ("data", "fsdp", "tensor"))  # (1, 8, 1)
    weights, _ = parameter_bytes(model, mesh, cfg.sampling.weights_dtype, layout_rules(cfg.sampling.weights_layout))
    live = kv_bytes(model, mesh, cfg.sampling.max_batch * 2048)
    embedding = model.vocab_size * model.hidden_size * 2  # bf16, replicated
    per_step = decode["hbm_bytes"] / 16
    assert weights - embedding + live <= per_step <= 1.3 * (weights + live), per_step / (weights + live)


def test_micro_step_keeps_no_bf16_weight_copy_and_its_layer_inputs_on_the_host(reports, hlo_dir):
    """The TPU compiler's bf16 propagation would cast the whole fp32 layer stack to bf16
    before the forward loop (a second copy of the weights through the step); the micro-step
    is compiled without it, so the only [layers, ...] weight buffers are the fp32 ones. The
    preset's `offload` remat keeps the stacked layer inputs in host memory (XLA's memory
    space 5), and the report counts that traffic at the host link's 15 GB/s."""
    model, _ = plan_model_config(load_config("configs/sgs.py:paper", []), num_layers=LAYERS)
    hlo = (hlo_dir / "train.hlo.txt").read_text()  # the fixture's micro-step, as compiled
    # A chip's shard of the stacked gate projection: [layers, 4096 / 8, intermediate]
    # (with the pass on, the compiled program has 30 bf16 values of that shape).
    shard = f"{LAYERS},{model.hidden_size // 8},{model.intermediate_size}]"
    assert f"f32[{shard}" in hlo and f"bf16[{shard}" not in hlo
    saved_inputs = re.findall(rf"bf16\[{LAYERS},1,1024,{model.hidden_size}\]{{[^}}]*}}", hlo)  # [layers, rows per chip, T, E]
    assert saved_inputs and all(layout.endswith("S(5)}") for layout in saved_inputs)
    # Each layer's input goes out to the host in the forward and comes back in the backward.
    train = reports["train"]
    assert train["host_bytes"] == 2 * LAYERS * 1024 * model.hidden_size * 2
    assert train["host_s"] == train["host_bytes"] / 15e9 and train["host_s"] < train["roofline_s"]
