"""Speed-ups at the run's own step costs: the same samples, each generation's decode time rebuilt from
the steps it ran, every step priced at the mean cost of its size over the whole run.

Why: modes run one after another, so a burst of load during one mode's generations (another process,
thermal throttling, the OS) lands on that mode alone, and on a 2-core board a category of three
prompts moves by +-0.05-0.1x from run to run for that reason. What a drafting policy decides (how
many steps of which sizes, how many draft steps and catch-ups) does not depend on the load; pricing
every mode's steps at the same per-size costs keeps that and takes the drift out. The loop's own
time (sampling, lookups, Python: the decode time outside any model step) stays as measured.
This is a second reading of the same run, printed beside the measured one, never instead of it.
"""
from __future__ import annotations

from .modework import mean_costs, priced_sample
from .run import BenchRun


def priced_run(run: BenchRun) -> BenchRun:
    t, d = mean_costs(run.samples)
    return BenchRun(meta=run.meta, modes=run.modes, prompts=run.prompts,
                    samples=[priced_sample(s, t, d) for s in run.samples])
