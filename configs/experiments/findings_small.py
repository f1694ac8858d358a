"""The findings experiment again with the `small` pair (2.0M parameters) and its targets.

    sgs-experiments configs/experiments/findings_small.py --jobs 2 --report reports/findings_small

Same four configs and seeds (1-3) as `findings.py`; what changes is the pair and the target
set it was calibrated against (both packaged, built as docs/testbed.md "Building the small
pair" says): `sgs_jax/testbed/data/models_small/{base,guide}` and
`sgs_jax/testbed/data/targets_small.json` (the first 96 of its 192 targets, as the preset's
limit). 20 iterations, not 30: an iteration costs about 2.5 times nano's (the 12 runs
take about 3 h 20 min with --jobs 2 on 2 cores; docs/findings.md). The iteration count and the configs
were fixed before any seed of this report ran; the development runs (seed 0) are in
docs/testbed.md.
"""

import dataclasses

from configs.experiments.findings import get_experiment as findings_experiment
from sgs_jax.experiments import Experiment
from sgs_jax.sgs.testbed_pretrain import TESTBED_DIR

SMALL_MODELS = TESTBED_DIR / "data" / "models_small"
SMALL_TARGETS = TESTBED_DIR / "data" / "targets_small.json"


def get_experiment() -> Experiment:
    return dataclasses.replace(
        findings_experiment(),  # its configs and seeds
        name="findings_small",
        overrides={
            "run.iterations": 20,
            "model.checkpoint": str(SMALL_MODELS / "base"),
            "model.guide_checkpoint": str(SMALL_MODELS / "guide"),
            "targets.source": "file",
            "targets.path": str(SMALL_TARGETS),
        },
    )
