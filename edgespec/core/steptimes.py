"""StepTimes: what each step size costs on this device now, the cost model's input (core/costmodel.py);
BatchTimes: a StepTimes per batch size (core/runner.py's batched steps)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class StepTimes:
    """Wall time of steps by number of input tokens: the cost model the drafter's k choice reads.

    A step of n > 1 tokens is kept as its ratio to the 1-token step's median when it ran, and read
    back as that ratio times today's 1-token median. Why: decisions read these costs, and a cost
    only gets re-measured when a decision runs that step again. Kept as seconds, a burst of load
    from another process inflated the sizes measured during it (2-5 tokens: 2-3x); once it passed,
    1-token steps (which run every round) came back down but the inflated sizes priced every chain
    out, so no chain of those sizes ran again to correct them: on the dev CPU the draft model then
    proposed nothing for the rest of a bench run while still paying a draft step each round. Load
    slows a step of 2 tokens about as much as one of 1, so the ratio survives the burst."""

    total_s: dict[int, float] = field(default_factory=dict)
    count: dict[int, int] = field(default_factory=dict)
    # The last few times by tokens per step. The cost model wants today's cost (after warm-up,
    # under the current thermal state) and must not be thrown by a burst of interference from
    # other processes, hence a median of recent steps rather than an all-time or moving mean.
    window: int = 9
    _recent: dict[int, deque] = field(default_factory=dict, repr=False)
    _ratio: dict[int, deque] = field(default_factory=dict, repr=False)  # n > 1: seconds / the 1-token median then
    _medians: dict[int, float] | None = field(default=None, repr=False)
    # bumped whenever what the medians read changes: CostModel keys its memo on it (costs are read
    # some 30 times a round and change at most once a step)
    version: int = field(default=0, repr=False, compare=False)

    def add(self, n_tokens: int, seconds: float) -> None:
        c = self.count.get(n_tokens, 0)
        self.total_s[n_tokens] = self.total_s.get(n_tokens, 0.0) + seconds
        self.count[n_tokens] = c + 1
        q = self._recent.setdefault(n_tokens, deque(maxlen=self.window))
        if c == 1 and q and seconds < q[-1]:
            q.clear()  # the first run of a shape pays one-off allocations: drop it
            self._ratio.pop(n_tokens, None)
        q.append(seconds)
        one = self._median(1)
        if n_tokens != 1 and one:
            self._ratio.setdefault(n_tokens, deque(maxlen=self.window)).append(seconds / one)
        before = self._medians.get(n_tokens) if self._medians is not None else None
        if before is not None and c >= 2 and self._read(n_tokens, one) == before:
            return  # nothing a reader sees has changed (the 1-token median did not move: no size did)
        self._medians = None
        self.version += 1

    def _median(self, n: int) -> float | None:
        q = self._recent.get(n)
        return sorted(q)[len(q) // 2] if q else None

    def _read(self, n: int, one: float | None) -> float | None:
        r = self._ratio.get(n)
        if n != 1 and one and r:
            return sorted(r)[len(r) // 2] * one
        return self._median(n)

    def mean(self, n_tokens: int) -> float | None:
        c = self.count.get(n_tokens)
        return self.total_s[n_tokens] / c if c else None

    def recent(self, n_tokens: int) -> float | None:
        return self.recent_s.get(n_tokens)

    @property
    def recent_s(self) -> dict[int, float]:
        """Recent cost by tokens per step: the 1-token median, and each longer step's median ratio
        to it times it (seconds where no 1-token step ran before it); cached until one changes."""
        if self._medians is None:
            one = self._median(1)
            self._medians = {n: self._read(n, one) for n, q in self._recent.items() if q}
        return self._medians


@dataclass
class BatchTimes:
    """Step wall times by rows in the step (the batch size), each a StepTimes by tokens per row.
    The cost model of a request in a batch of B reads `by_rows[B]`: a verify of k+1 tokens there
    costs what a step of B rows x (k+1) tokens costs, which is what batching makes it cost."""

    by_rows: dict[int, StepTimes] = field(default_factory=dict)

    def table(self, rows: int) -> StepTimes:
        t = self.by_rows.get(rows)
        if t is None:
            t = self.by_rows[rows] = StepTimes()
        return t

    def pricing(self, rows: int) -> StepTimes:
        """The table a pass of `rows` rows is priced from: its own, or one row's until it has run."""
        t = self.table(rows)
        return t if t.count else self.table(1)
