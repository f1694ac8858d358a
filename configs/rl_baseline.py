"""REINFORCE½ Solver alone: no Conjecturer, no Guide.

Use as `configs/rl_baseline.py:testbed` or `configs/rl_baseline.py:paper` (method.md §8)."""

from configs.presets import PRESETS, experiment  # noqa: F401  (PRESETS: listed by tests and tools)


def get_config(preset: str = "testbed"):
    return experiment(
        "rl_baseline",
        preset,
        **{
            "sgs.use_conjecturer": False,
            "sgs.use_guide": False,
        },
    )
