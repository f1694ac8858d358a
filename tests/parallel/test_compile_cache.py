"""The persistent compilation cache: a second process start loads the training programs
from disk instead of compiling them (counted with jax's own cache events).

Two fresh Python processes (the cache is per process; ~10 s each on 2 cores)."""

import json
import os
import subprocess
import sys
import textwrap

from sgs_jax.parallel.compile_cache import OFF, compile_cache_dir

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax
    from sgs_jax.parallel.compile_cache import compile_cache_dir, enable_compilation_cache

    counts = {"hits": 0, "misses": 0}
    names = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}
    jax.monitoring.register_event_listener(lambda event, **_: names.get(event) and counts.__setitem__(names[event], counts[names[event]] + 1))
    enable_compilation_cache(compile_cache_dir("", sys.argv[1]), min_compile_secs=0)

    from sgs_jax.models import create_model, tiny
    from sgs_jax.rl.train_step import TrainConfig, Trainer
    from tests.rl.train_support import random_examples

    trainer = Trainer(create_model(tiny(), seed=0), TrainConfig(micro_batch_size=2, max_seq_len=16, min_bucket=16))
    loss = trainer.step(random_examples(4, 97, seed=1))["loss"]
    print(json.dumps(dict(counts, loss=loss)))
    """
)


def _run(workdir):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(workdir)], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_compiled_programs(tmp_path):
    first = _run(tmp_path)
    assert first["misses"] >= 3 and first["hits"] == 0  # init_opt, start, accumulate, apply, ...
    entries = os.listdir(tmp_path / "compile_cache")
    assert len(entries) >= first["misses"]
    second = _run(tmp_path)
    assert second["misses"] == 0 and second["hits"] == first["misses"]
    assert second["loss"] == first["loss"]  # the loaded programs compute the same


def test_cache_directory_setting():
    assert compile_cache_dir("", "/runs/x") == "/runs/x/compile_cache"
    assert compile_cache_dir(OFF, "/runs/x") is None
    assert compile_cache_dir("~/cache", "/runs/x") == os.path.expanduser("~/cache")
