"""Settings shared by the SGS loop tests."""

import hashlib
import json
import os
import pathlib
import tempfile

from sgs_jax.testbed.generator import DEFAULT_PATH


def easy_targets_file() -> pathlib.Path:
    """The packaged targets that the packaged base proves most often, highest calibration
    rate first (D3k format): a short run's Solver then gets verified proofs to train on (the
    packaged set's own order is mostly hard targets). One path per packaged file, outside
    any run directory, so a run copied elsewhere resumes with the same config."""
    raw = DEFAULT_PATH.read_bytes()
    path = pathlib.Path(tempfile.gettempdir()) / f"sgs_jax_easy_targets_{hashlib.sha256(raw).hexdigest()[:16]}.json"
    if not path.exists():
        data = json.loads(raw)["target_statements"]
        easy = sorted((k for k, e in data.items() if not e["hard"]), key=lambda k: -data[k]["base_solve_rate"])
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"iterations": [], "target_statements": {k: data[k] for k in easy}}), encoding="utf-8")
        os.replace(partial, path)  # atomic: parallel test workers write the same bytes
    return path


def shared_compile_cache() -> list[str]:
    """The flag that points a run at the test worker's compilation cache
    (`tests/conftest.py:shared_compile_cache`), or none outside pytest."""
    directory = os.environ.get("SGS_TEST_COMPILE_CACHE")
    return [f"--config.run.compile_cache_dir={directory}"] if directory else []


def small_run_overrides(models, workdir) -> list[str]:
    """`--config.FIELD=VALUE` flags that make a testbed run take seconds: the given nano
    models, the 6 easiest packaged targets (`easy_targets_file`), k = 2, the test worker's
    compilation cache."""
    return shared_compile_cache() + [
        f"--config.run.workdir={workdir}",
        "--config.targets.source=file",
        f"--config.targets.path={easy_targets_file()}",
        f"--config.model.checkpoint={models / 'base'}",
        f"--config.model.guide_checkpoint={models / 'guide'}",
        "--config.targets.limit=6",
        "--config.sgs.proofs_per_problem=2",
        "--config.sampling.solver_max_total_len=192",
        "--config.sampling.conjecturer_max_new_tokens=48",
        "--config.sampling.guide_max_new_tokens=48",
        "--config.sampling.max_batch=16",
        "--config.solver_train.batch_size=16",
        "--config.solver_train.micro_batch_size=16",
        "--config.conjecturer_train.batch_size=16",
        "--config.conjecturer_train.micro_batch_size=16",
    ]


CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
