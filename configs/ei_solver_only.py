"""Expert Iteration Solver alone (batch 64).

Use as `configs/ei_solver_only.py:testbed` or `configs/ei_solver_only.py:paper` (method.md §8)."""

from configs.presets import PRESETS, experiment  # noqa: F401  (PRESETS: listed by tests and tools)


def get_config(preset: str = "testbed"):
    return experiment(
        "ei_solver_only",
        preset,
        **{
            "sgs.solver_objective": 'expert_iteration',
            "sgs.use_conjecturer": False,
            "sgs.use_guide": False,
            "solver_train.batch_size": 64,
        },
    )
