"""SGS, the main method: REINFORCE½ Solver, target-conditioned Conjecturer, Guide.

Use as `configs/sgs.py:testbed` or `configs/sgs.py:paper` (method.md §8)."""

from configs.presets import PRESETS, experiment  # noqa: F401  (PRESETS: listed by tests and tools)


def get_config(preset: str = "testbed"):
    return experiment("sgs", preset)
