"""SGS with the base model as a frozen Conjecturer and no Guide.

Use as `configs/frozen_conjecturer.py:testbed` or `configs/frozen_conjecturer.py:paper` (method.md §8)."""

from configs.presets import PRESETS, experiment  # noqa: F401  (PRESETS: listed by tests and tools)


def get_config(preset: str = "testbed"):
    return experiment(
        "frozen_conjecturer",
        preset,
        **{
            "sgs.train_conjecturer": False,
            "sgs.use_guide": False,
            # On the testbed the Guide still scores the kept conjectures (logged, never
            # rewarded), so this ablation can be compared with SGS on the Guide's scale.
            **({"guide.shadow_score": True} if preset == "testbed" else {}),
        },
    )
