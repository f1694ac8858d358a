"""The memory plan's parameter bytes agree with the exact parameter count and sharding."""

from sgs_jax.cli import plan as plan_cli
from sgs_jax.models import deepseek_prover_v2_7b, tiny
from sgs_jax.parallel.memory import plan_memory


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
