"""Settings shared by the SGS loop tests."""

import pathlib


def small_run_overrides(models, workdir) -> list[str]:
    """Overrides that make a testbed run take seconds: random nano models, 6 targets, k = 2."""
    return [
        f"run.workdir={str(workdir)!r}",
        f"model.checkpoint={str(models / 'base')!r}",
        f"model.guide_checkpoint={str(models / 'guide')!r}",
        "targets.limit=6",
        "sgs.proofs_per_problem=2",
        "sampling.solver_max_total_len=192",
        "sampling.conjecturer_max_new_tokens=48",
        "sampling.guide_max_new_tokens=48",
        "sampling.max_batch=16",
        "solver_train.batch_size=16",
        "solver_train.micro_batch_size=16",
        "conjecturer_train.batch_size=16",
        "conjecturer_train.micro_batch_size=16",
    ]


CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
