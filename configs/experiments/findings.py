"""The paper's three findings in miniature, on the CPU testbed (issue 14, docs/analysis.md):

  1. SGS beats the REINFORCE½ baseline at equal generations, most on the hard split;
  2. without the Guide the Conjecturer drifts to hacked (e.g. disjunctive) conjectures;
  3. CISPO collapses Solver entropy and piles synthetic solve rates at 0 and 1.

    sgs-experiments configs/experiments/findings.py --jobs 2 --report reports/findings

Seeds 1-3: seed 0 (every config's default) is the development seed and never in this
report, so nothing is tuned on the seeds it shows. Targets: each config's `:testbed`
preset (the first 96 of the packaged set); 30 iterations instead of the preset's 10, as
drift and entropy collapse build up over tens of iterations (about an hour on 2 cores with
`--jobs 2`; docs/findings.md).
"""

from sgs_jax.experiments import Entry, Experiment


def get_experiment() -> Experiment:
    return Experiment(
        name="findings",
        entries=(
            Entry("sgs", "../sgs.py:testbed"),  # findings 1-3: the reference
            Entry("rl_baseline", "../rl_baseline.py:testbed"),  # finding 1
            Entry("no_guide", "../no_guide.py:testbed"),  # finding 2
            Entry("cispo_sgs", "../cispo_sgs.py:testbed"),  # finding 3
        ),
        seeds=(1, 2, 3),
        overrides={"run.iterations": 30},
    )
