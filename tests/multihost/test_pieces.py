"""The multi-host pieces on 2 local processes x 4 CPU devices equal one process on 8.

quick (default suite): rows placed from each process's block into a jitted program with
explicit batch shardings (what failed with NumPy inputs), sharded rows and a replicated
scalar read back, the agreement check, and ShardedVerifier over JAX's key-value store.
model (slow): a Trainer step (micro-batches placed from each process's rows, metrics read
back), a Sampler call (refills from process-local slot rows, one read-back per chunk).
Sampling and verdicts are exact; the training step's loss and updated weights agree within
1e-6 (the cross-process gradient all-reduce sums in another order than the in-process one).
"""

import numpy as np
import pytest

from sgs_jax.verify import VerifyRequest, make_backend
from tests.multihost import pieces_worker
from tests.multihost.processes import log_tail, run_job


def _two_processes(tmp_path, mode):
    codes = run_job(["-m", "tests.multihost.pieces_worker", mode, str(tmp_path)], processes=2, devices=4,
                    logs=tmp_path / "logs", timeout=300)
    assert codes == [0, 0], log_tail(tmp_path / "logs")
    views = [dict(np.load(tmp_path / f"process_{i}.npz")) for i in range(2)]
    for key in views[0]:  # both processes hold the same results
        if key not in ("checked_here", "block"):
            np.testing.assert_array_equal(views[0][key], views[1][key], err_msg=key)
    assert [int(v["checked_here"]) for v in views] == [3, 2]  # each checked its share of the 5
    with make_backend("prop") as backend:
        local = [v.status.value for v in backend.verify_batch([VerifyRequest("", pieces_worker.STATEMENT, p) for p in pieces_worker.PROOFS])]
    assert list(views[0]["verdicts"]) == local
    return views


def test_global_rows_in_results_out_and_shared_verdicts(tmp_path):
    views = _two_processes(tmp_path, "quick")
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    expected = x @ np.asarray([0.5, -1.0, 2.0], np.float32)
    np.testing.assert_allclose(views[0]["per_row"], expected, rtol=1e-6)
    np.testing.assert_allclose(views[0]["mean"], np.mean(np.tanh(expected)), rtol=1e-6)
    assert [list(v["block"]) for v in views] == [[0, 8], [8, 16]]  # process p owns rows [8p, 8p + 8)
    assert "processes disagree on the process index: processes [1] differ from process 0" in str(views[0]["disagreement"])


@pytest.mark.slow
def test_model_pieces_two_processes_equal_one(tmp_path):
    views = _two_processes(tmp_path, "model")
    single = pieces_worker.run_pieces()  # this process: 8 devices, one process
    view = views[0]
    assert list(view["metric_names"]) == list(single["metric_names"])
    np.testing.assert_allclose(view["metrics"], single["metrics"], rtol=1e-6, atol=1e-7)
    for key in (k for k in single if k.startswith("param_")):
        np.testing.assert_allclose(view[key], single[key], rtol=0, atol=1e-6, err_msg=key)
    np.testing.assert_array_equal(view["tokens"], single["tokens"])
    np.testing.assert_allclose(view["logprobs"], single["logprobs"], rtol=0, atol=1e-6)
