"""The main job (`sgs-train`, what `bash launch/local.sh sgs` runs) needs no PyTorch.

PyTorch is only the test extra's reference. A subprocess makes torch unimportable the way
an environment without it looks to importlib (`sys.modules["torch"] = None`: `import
torch` raises ImportError and `importlib.util.find_spec("torch")` is None, so
`transformers` takes its torch-less path), then runs one tiny SGS iteration through the
`sgs-train` entry point. Anything on the main job's path that needs torch fails the run.
"""

import os
import subprocess
import sys
import textwrap

from sgs_jax.sgs.testbed_pretrain import MODELS_DIR
from tests.sgs.run_support import CONFIGS, small_run_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_one_iteration_of_the_main_job_without_torch(tmp_path):
    overrides = small_run_overrides(MODELS_DIR, tmp_path / "run") + ["--config.targets.limit=2", "--config.run.iterations=1"]
    argv = ["--config", str(CONFIGS / "sgs.py:testbed"), *overrides]
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # what a missing package looks like to importlib
        from sgs_jax.cli import train
        code = train.main({argv!r})
        import transformers
        assert sys.modules["torch"] is None, "something replaced the torch blocker"
        assert not transformers.is_torch_available()
        print("EXIT", code)
        sys.exit(code)
    """)
    env = dict(os.environ)  # the same 8 CPU devices as the other runs: their compiled programs are cached
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[sgs] iteration 1/1" in result.stdout and "EXIT 0" in result.stdout
    assert (tmp_path / "run" / "checkpoints").is_dir()
