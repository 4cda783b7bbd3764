"""Step times for cost-model and drafter tests, from {"s<tokens>": seconds}."""
from __future__ import annotations

from edgespec.core.runner import StepTimes


def times(**by_size) -> StepTimes:
    t = StepTimes()
    for s, sec in by_size.items():
        for _ in range(3):
            t.add(int(s[1:]), sec)
    return t
