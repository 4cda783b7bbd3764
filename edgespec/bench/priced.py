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

from dataclasses import replace

from .modework import decode_steps, mean_costs
from .run import BenchRun, Sample


def priced_sample(s: Sample, target: dict[int, float], draft: dict[int, float]) -> Sample:
    """The sample with its decode time rebuilt: its decode steps at the run's mean costs, plus its own
    time outside model steps."""
    ts, ds = decode_steps(s)
    own = sum(sec for _, sec in ts.values()) + sum(sec for _, sec in ds.values())
    priced = sum(c * target[n] for n, (c, _) in ts.items()) + sum(c * draft[n] for n, (c, _) in ds.items())
    return replace(s, decode_s=max(s.decode_s - own, 0.0) + priced)


def priced_run(run: BenchRun) -> BenchRun:
    t, d = mean_costs(run.samples)
    return BenchRun(meta=run.meta, modes=run.modes, prompts=run.prompts,
                    samples=[priced_sample(s, t, d) for s in run.samples])
