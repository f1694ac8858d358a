"""SGS without the Guide: R_guide = 1.

Use as `configs/no_guide.py:testbed` or `configs/no_guide.py:paper` (method.md §8)."""

from configs.presets import PRESETS, experiment  # noqa: F401  (PRESETS: listed by tests and tools)


def get_config(preset: str = "testbed"):
    return experiment(
        "no_guide",
        preset,
        **{
            "sgs.use_guide": False,
            # On the testbed the Guide still scores the kept conjectures (logged, never
            # rewarded), so this ablation can be compared with SGS on the Guide's scale.
            **({"guide.shadow_score": True} if preset == "testbed" else {}),
        },
    )
