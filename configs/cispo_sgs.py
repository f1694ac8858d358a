"""SGS with a CISPO Solver (LR a third of REINFORCE½'s: 1e-6 in the paper preset; batch 64).

Use as `configs/cispo_sgs.py:testbed` or `configs/cispo_sgs.py:paper` (method.md §8)."""

from configs.presets import PRESETS, experiment  # noqa: F401  (PRESETS: listed by tests and tools)


def get_config(preset: str = "testbed"):
    return experiment(
        "cispo_sgs",
        preset,
        **{
            "sgs.solver_objective": 'cispo',
            "solver_train.lr": lambda lr: lr / 3,  # 1e-6 at the paper's 3e-6
            "solver_train.batch_size": 64,
        },
    )
