"""Step times for cost-model and drafter tests, from {"s<tokens>": seconds}."""
from __future__ import annotations

from edgespec.core.runner import StepTimes


def times(**by_size) -> StepTimes:
    t = StepTimes()
    for s, sec in by_size.items():
        for _ in range(3):
            t.add(int(s[1:]), sec)
    return t


def freeze(t: StepTimes, **by_size) -> None:
    """Pins a runner's live step times (in place: the engine's cost model and drafters hold this very
    object) to {"s<tokens>": seconds}, and makes later steps add nothing. Tests of what `auto` chooses
    then decide the same way on a quiet machine and a loaded one."""
    t.total_s.clear()
    t.count.clear()
    t._recent.clear()
    t._ratio.clear()
    t._medians = None
    t.version += 1
    for s, sec in by_size.items():
        for _ in range(3):
            StepTimes.add(t, int(s[1:]), sec)
    t.add = lambda n_tokens, seconds: None  # type: ignore[method-assign]
