"""One process of the 2-process checks of the multi-host pieces (tests/multihost/test_pieces.py).

    python -m tests.multihost.pieces_worker {quick|model} OUT_DIR --coordinator H:P --num-processes N --process-id I

On a mesh over every process's devices. quick: global arrays in and out of a jitted program
with explicit batch shardings, the agreement check, and a ShardedVerifier batch over JAX's
key-value store. model: one Trainer step (global micro-batches in, metrics out), a Sampler
call (global refills in, per-chunk read-back out) and the same verifier batch. Writes
OUT_DIR/process_I.npz (every process writes its own view).
"""

import json
import sys

import numpy as np


def main(argv):
    mode, out_dir, flags = argv[0], argv[1], dict(zip(argv[2::2], argv[3::2]))
    from sgs_jax.parallel.distributed import initialize_from_environment

    spec = initialize_from_environment(flags.get("--coordinator"), int(flags["--num-processes"]) if "--num-processes" in flags else None,
                                       int(flags["--process-id"]) if "--process-id" in flags else None)
    import jax

    result = {"quick": run_quick, "model": run_pieces}[mode]()
    np.savez(f"{out_dir}/process_{jax.process_index()}.npz", **result)
    print(json.dumps({"process": jax.process_index(), "mode": spec.mode}), flush=True)


STATEMENT = "theorem t (p q : Prop) (h : p ∧ q) : q ∧ p := by"
PROOFS = ("  exact ⟨h.2, h.1⟩", "  exact h", "  sorry", "  exact ⟨h.2, h.2⟩", "  constructor <;> simp_all")


def shared_verdicts() -> dict:
    """The prop backend's verdicts on PROOFS, each process checking its share."""
    import jax

    from sgs_jax.parallel.distributed import KeyValueExchange
    from sgs_jax.verify import VerifyRequest, make_backend
    from sgs_jax.verify.shared import ShardedVerifier

    backend = make_backend("prop")
    if jax.process_count() > 1:
        backend = ShardedVerifier(backend, KeyValueExchange(), jax.process_index(), jax.process_count())
    with backend:
        verdicts = backend.verify_batch([VerifyRequest("", STATEMENT, p) for p in PROOFS])
        checked_here = backend.stats().get("shared", {}).get("checked_here", len(PROOFS))
    return {"verdicts": np.asarray([v.status.value for v in verdicts]), "checked_here": np.asarray(checked_here)}


def run_quick() -> dict:
    """Rows in from each process's block, a jitted step with explicit batch shardings, rows and
    a replicated scalar out; the agreement check; shared verdicts."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from sgs_jax.parallel import make_mesh
    from sgs_jax.parallel.distributed import check_agreement
    from sgs_jax.parallel.global_arrays import host_read, process_block, to_global

    mesh = make_mesh(1, -1, 1)
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    whole = NamedSharding(mesh, PartitionSpec())
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    w = np.asarray([0.5, -1.0, 2.0], np.float32)
    step = jax.jit(lambda w, x: (x @ w, jnp.mean(jnp.tanh(x @ w))), in_shardings=(whole, rows), out_shardings=(rows, whole))
    gw, gx = to_global((w, x), (whole, rows))
    per_row, mean = host_read(step(gw, gx))
    check_agreement({"rows": per_row.tolist()}, "the rows")
    try:
        check_agreement(jax.process_index(), "the process index")
        disagreement = ""
    except RuntimeError as err:
        disagreement = str(err)
    block = process_block(rows, x.shape)
    return {"per_row": per_row, "mean": np.asarray(mean), "block": np.asarray([block[0].start, block[0].stop]),
            "disagreement": np.asarray(disagreement), **shared_verdicts()}


def run_pieces() -> dict:
    """The pieces on a mesh over all devices; returns named NumPy results (the same on every process)."""
    import jax
    from flax import nnx

    from sgs_jax.models import ModelConfig, create_model
    from sgs_jax.parallel import make_mesh
    from sgs_jax.parallel.global_arrays import host_read
    from sgs_jax.rl.batching import SequenceExample
    from sgs_jax.rl.train_step import TrainConfig, Trainer
    from sgs_jax.sampling import Sampler, SamplingParams
    from sgs_jax.testbed.model_configs import llama_config

    mesh = make_mesh(1, -1, 1)
    config = ModelConfig.from_hf_dict(llama_config("nano", 256))
    model = create_model(config, seed=0)
    rng = np.random.default_rng(0)
    examples = [SequenceExample(tuple(int(t) for t in rng.integers(3, 200, 5 + i % 3)),
                                tuple(int(t) for t in rng.integers(3, 200, 4 + i % 5)), weight=float(i % 3) - 0.5)
                for i in range(16)]
    trainer = Trainer(model, TrainConfig(batch_size=16, micro_batch_size=8, max_seq_len=32, min_bucket=16), mesh)
    metrics = trainer.step(examples)
    params = host_read(jax.tree_util.tree_leaves(nnx.state(trainer.model)))
    sampler = Sampler(config, mesh=mesh, max_batch=8, chunk_steps=4)
    prompts = [[1, 5, 9, 13], [1, 7], [1, 20, 30], [1, 3, 3, 3, 3]]
    out = sampler.generate(trainer.model, prompts, SamplingParams(num_samples=3, max_new_tokens=10, max_total_len=32, seed=7))
    tokens = np.full((len(prompts), 3, 10), -1, np.int64)
    logprobs = np.zeros((len(prompts), 3, 10), np.float64)
    for i, (p, s, n) in enumerate(zip(out.prompt_index, out.sample_index, out.lengths)):
        tokens[p, s, :n] = out.token_ids[i, :n]
        logprobs[p, s, :n] = out.logprobs[i, :n]
    return {
        "metric_names": np.asarray(sorted(metrics)), "metrics": np.asarray([metrics[k] for k in sorted(metrics)]),
        **{f"param_{i}": np.asarray(p) for i, p in enumerate(params)},
        "tokens": tokens, "logprobs": logprobs,
        **shared_verdicts(),
    }


if __name__ == "__main__":
    main(sys.argv[1:])
