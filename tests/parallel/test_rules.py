"""Batch axes never fall back to replication; parameter fallbacks are listed."""

import logging

import pytest
from flax import nnx

from sgs_jax.models import create_model, tiny
from sgs_jax.parallel import make_mesh
from jax.sharding import PartitionSpec

from sgs_jax.parallel.rules import batch_shards, batch_spec, check_batch, log_replicated_parameters, replicated_parameters


def test_batch_that_does_not_split_fails_with_the_numbers():
    mesh = make_mesh(data=2, fsdp=4, tensor=1)
    assert batch_shards(mesh) == 8
    check_batch(16, mesh, "micro_batch_size")
    with pytest.raises(ValueError, match=r"micro_batch_size=12 rows .*data=2 x fsdp=4 = 8 devices.*multiple of 8 \(e.g. 16\)"):
        check_batch(12, mesh, "micro_batch_size")
    assert batch_spec(("batch", "seq"), mesh, (8, 5), "rows") == PartitionSpec(("data", "fsdp"), None)
    with pytest.raises(ValueError, match="rows=4 rows"):
        batch_spec(("batch", "seq"), mesh, (4, 5), "rows")
    assert batch_shards(make_mesh(data=1, fsdp=1, tensor=8)) == 1  # tensor parallelism does not split rows


def test_parameter_fallbacks_are_listed_once(caplog):
    config = tiny(num_heads=8, num_kv_heads=2, head_dim=4, vocab_size=96, intermediate_size=64)
    state = nnx.state(create_model(config))
    mesh = make_mesh(data=1, fsdp=2, tensor=4)  # 2 KV heads cannot split 4 ways
    lines = replicated_parameters(state, mesh)
    assert len(lines) == 2  # k_proj and v_proj (stacked over layers)
    assert all("kv_heads, size 2" in line and "tensor=4" in line for line in lines)
    with caplog.at_level(logging.INFO):
        log_replicated_parameters(state, mesh, logging.getLogger("plan-test"))
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.WARNING
    assert replicated_parameters(state, make_mesh(data=2, fsdp=2, tensor=2)) == []
