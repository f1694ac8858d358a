"""Settings shared by the SGS loop tests."""

import pathlib


def small_run_overrides(models, workdir) -> list[str]:
    """`--config.FIELD=VALUE` flags that make a testbed run take seconds: the given nano
    models, 6 targets, k = 2."""
    return [
        f"--config.run.workdir={workdir}",
        f"--config.model.checkpoint={models / 'base'}",
        f"--config.model.guide_checkpoint={models / 'guide'}",
        "--config.targets.limit=6",
        "--config.sgs.proofs_per_problem=2",
        "--config.sampling.solver_max_total_len=192",
        "--config.sampling.conjecturer_max_new_tokens=48",
        "--config.sampling.guide_max_new_tokens=48",
        "--config.sampling.max_batch=16",
        "--config.solver_train.batch_size=16",
        "--config.solver_train.micro_batch_size=16",
        "--config.conjecturer_train.batch_size=16",
        "--config.conjecturer_train.micro_batch_size=16",
    ]


CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
