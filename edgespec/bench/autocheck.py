"""`auto` beside its own parts: per group, its speed-up against the best single mode the same run
measured there, the rule it is held to, and how finely the run can tell.

Why the resolution: on the 2-core dev VM the target alone's own two passes over a category of three
prompts differed by up to 28 % in one quiet run (2026-12-02, docs/speed.md "Round nine"), and each
mode's speed-up moved 3-10 % (one standard deviation) from one repeat to the next. A 2 % rule
read off such a run says "BELOW" about an `auto` exactly as fast as its best part in about half of
the categories. So each verdict carries two standard errors of auto / best, estimated from the same
run, and one inside them is printed as not resolved rather than as a finding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

SINGLE_MODES = ("model", "suffix", "recycle", "ngram", "self")  # one source each (adaptive k)
AUTO_VS_BEST = 0.98  # auto's floor: this share of the best single mode's speed-up in the group ...
AUTO_VS_TARGET = 0.95  # ... and this share of the target alone's
# The expected range of n draws from a normal distribution, in standard deviations (the d2 constant
# of quality-control charts): a mode's per-repeat range over d2 estimates one repeat's deviation.
_D2 = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326, 6: 2.534, 7: 2.704, 8: 2.847, 9: 2.970, 10: 3.078}


@dataclass
class AutoCheck:
    """One group's `auto` beside the best single mode the run measured there (the target alone
    counts: a source that never pays is "none")."""

    group: str
    mode: str  # "auto", or an auto variant ("auto+tree")
    speedup: float
    best_mode: str
    best_speedup: float
    resolution: float | None = None  # two standard errors of log(auto / best); None: one repeat

    @property
    def ratio(self) -> float:
        return self.speedup / self.best_speedup if self.best_speedup > 0 else 0.0

    @property
    def ok(self) -> bool:
        return self.ratio >= AUTO_VS_BEST and self.speedup >= AUTO_VS_TARGET

    @property
    def resolved(self) -> bool | None:
        """Whether auto / best lies outside two standard errors of the rule's AUTO_VS_BEST (None: the
        run has one repeat, so nothing says how far its figures move). The ratio decides the verdict
        alone: the target counts among the singles, so best >= 1 and a ratio over AUTO_VS_BEST is
        over AUTO_VS_TARGET too."""
        if self.resolution is None or self.ratio <= 0:
            return None
        return abs(math.log(self.ratio / AUTO_VS_BEST)) > self.resolution

    def verdict(self) -> str:
        word = "ok" if self.ok else "BELOW"
        return f"{word} (within noise)" if self.resolved is False else word


def ratio_resolution(rows: Sequence, repeats: int) -> float | None:
    """Two standard errors of log(auto / best) over `repeats` repeats, from how far the group's modes'
    speed-ups moved between repeats (their `speedup_range`): one repeat's standard deviation is the
    mean log range over d2, a pooled figure's that over sqrt(repeats), and a ratio of two pooled
    figures has sqrt(2) of that. None with one repeat or no ranges."""
    if repeats < 2:
        return None
    spans = [math.log(hi / lo) for r in rows
             if r.mode != "target" and r.speedup_range is not None and (lo := r.speedup_range[0]) > 0
             and (hi := r.speedup_range[1]) > 0]
    if not spans:
        return None
    # past 10 repeats the table's last d2 (smaller than the true one): the deviation comes out larger,
    # and a verdict is called resolved less often, never more
    sd = sum(spans) / len(spans) / _D2[min(repeats, max(_D2))]
    return 2.0 * math.sqrt(2.0) * sd / math.sqrt(repeats)


def auto_checks(rows: Sequence, repeats: int = 1) -> list[AutoCheck]:
    """Per group and auto mode: its speed-up, the best single mode's, whether the rule holds and the
    run's resolution there (`repeats`: the run's repeats). Empty when the run has no auto mode or no
    single mode to compare with. `rows`: report.Row, per group and mode."""
    out = []
    for g in dict.fromkeys(r.group for r in rows):
        in_g = [r for r in rows if r.group == g and r.speedup is not None]
        singles = [r for r in in_g if r.mode in SINGLE_MODES or r.mode == "target"]
        if not any(r.mode != "target" for r in singles):
            continue
        best = max(singles, key=lambda r: r.speedup)
        res = ratio_resolution(in_g, repeats)
        for r in in_g:
            if r.mode.startswith("auto") and " k=" not in r.mode:
                out.append(AutoCheck(g, r.mode, r.speedup, best.mode, best.speedup, res))
    return out
