"""What a round of speculation costs and buys, from step times measured on this device.

Speculation pays only when the tokens a round yields outweigh what it costs:

    rate(k) = E[tokens | k proposals] / (draft cost of k tokens + verify(k + 1))

against 1 / verify(1) for the target alone. On a compute-poor CPU verify(k+1) grows quickly with k
(on the 2-core dev machine verify(5) ~ 1.8 x verify(1)) while on a Jetson GPU it is expected to be
nearly flat (a model of its bandwidth and compute, projection.py: no Jetson figure here is a
measurement), so the numbers must come from the device itself: the runners record the wall time of every step
by its number of tokens (`StepTimes`), and this module turns those into estimates, falling back
to ratios measured on the dev machine (docs/speed.md, "Step costs") for sizes not seen yet.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from .runner import StepTimes

# Priors, relative to one 1-token target step, measured on the 2-core dev machine (docs/speed.md):
# a target step of s tokens (int4, accuracy level 4: the kernel works on pairs of rows, so 2 tokens
# cost barely more than 1), and a 0.5B draft step against a 1.5B target step. Used only until the
# device's own steps of that size have been timed.
PRIOR_VERIFY_RATIO = {1: 1.0, 2: 1.09, 3: 1.38, 4: 1.63, 5: 1.91, 6: 2.06, 7: 2.31, 8: 2.56, 9: 2.78}
PRIOR_VERIFY_SLOPE = 0.22  # per token past the table
PRIOR_DRAFT_RATIO = 0.35
_MAX_FIT = 17  # steps longer than this are prefills: not used to fill gaps in the verify curve


def expected_tokens(k: int, a: float) -> float:
    """Tokens a round yields with k proposals each accepted with probability a (given all before
    were): 1 + a + a^2 + ... + a^k (the last term is the target's own bonus/correction token)."""
    if k <= 0:
        return 1.0
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def chain_tokens(accs: Iterable[float]) -> float:
    """Tokens a round yields from a chain whose proposal j is accepted with probability accs[j]
    given all before it were: 1 + a0 + a0 a1 + ... (the 1 is the target's own bonus/correction)."""
    e, p = 1.0, 1.0
    for a in accs:
        p *= a
        e += p
    return e


def expected_tokens_chain(a_first: float, a_next: float, k: int) -> float:
    """Like expected_tokens, for proposals whose first token is the uncertain one and the rest are
    accepted with a_next once it is (n-gram copies: a span either is being copied or is not)."""
    if k <= 0:
        return 1.0
    return 1.0 + a_first * expected_tokens(k - 1, a_next)


@dataclass
class CostModel:
    """Seconds per step, estimated from the runners' recent step times."""

    target: StepTimes
    draft: StepTimes | None = None
    # the step tables and their versions it was filled at -> {(kind, size): value} (cached): a round reads
    # verify() and draft_step() some 30 times (quotes, chain plans, tree pruning) and the answers change
    # only when a step moves a median (or the batch engine points `target` at another table).
    # Recomputing them each time (a median dict, a least-squares slope) was measured, together with
    # TCONF_MAX: `auto`'s loop beyond the target alone's 0.83 -> 0.74 ms a token (docs/speed.md)
    _memo: tuple = field(default=(None, -1, None, -1, None), init=False, repr=False, compare=False)

    def cached(self, key: tuple[str, int], compute):
        """compute(key[1]), kept until a step moves a median of either table: for anything derived
        from the step costs alone (here and in the tree verifier's per-size row costs)."""
        t, d = self.target, self.draft
        m = self._memo
        if not (m[0] is t and m[1] == t.version and m[2] is d and m[3] == (-1 if d is None else d.version)):
            m = self._memo = (t, t.version, d, -1 if d is None else d.version, {})
        memo = m[4]
        if key not in memo:
            memo[key] = compute(key[1])
        return memo[key]

    def verify(self, s: int) -> float:
        """Seconds for a target step of s tokens (s = k + 1 for a verify of k proposals): the
        measured time when this size has run, else interpolated between measured sizes, else
        extrapolated from the measured slope, else the dev machine's ratios times t(1)."""
        return self.cached(("v", s), self._verify)

    def _verify(self, s: int) -> float:
        pts = self._points()
        if s in pts:
            return pts[s]
        sizes = sorted(pts)
        lo = [x for x in sizes if x < s]
        hi = [x for x in sizes if x > s]
        if lo and hi:
            a, b = lo[-1], hi[0]
            return pts[a] + (pts[b] - pts[a]) * (s - a) / (b - a)
        if len(sizes) >= 2 and lo:
            return pts[sizes[-1]] + self.cached(("slope", 0), lambda _: self._slope(pts)) * (s - sizes[-1])
        return self._t1() * _prior_ratio(s)

    @staticmethod
    def _slope(pts: dict[int, float]) -> float:
        """Seconds per extra token past the largest measured size: the least-squares slope of the three
        largest, at least 0. One fit per version of the medians, not one per size asked: a tree round
        prices up to 32 sizes past the measured ones (engine/tree_round.py)."""
        last = sorted(pts)[-3:]
        xs = np.array(last, dtype=float)
        ys = np.array([pts[x] for x in last])
        return max(0.0, float(np.polyfit(xs, ys, 1)[0]))

    def draft_step(self, s: int = 1) -> float:
        """Seconds for a draft step of s tokens (s > 1 when the draft catches up on the target's
        tokens after a round, or after rounds that did not use it): measured, else interpolated
        between measured sizes (the draft's prompt prefills give the long end), else the 1-token
        draft step scaled like the target's curve."""
        return self.cached(("d", s), self._draft_step)

    def _draft_step(self, s: int) -> float:
        one = self._draft_one()
        if s <= 1:
            return one
        if self.draft is not None:
            pts = {x: t for x, t in self.draft.recent_s.items() if x > 1}
            if s in pts:
                return pts[s]
            lo = max((x for x in pts if x < s), default=None)
            hi = min((x for x in pts if x > s), default=None)
            if hi is not None:
                a, ta = (lo, pts[lo]) if lo is not None else (1, one)
                return ta + (pts[hi] - ta) * (s - a) / (hi - a)
            if lo is not None and lo >= 8:  # past the longest step seen: its cost per token
                return pts[lo] * s / lo
        return one * _prior_ratio(s)

    def _draft_one(self) -> float:
        if self.draft is not None:
            t = self.draft.recent(1)
            if t is not None and self.draft.count.get(1, 0) >= 2:
                return t
        return PRIOR_DRAFT_RATIO * self._t1()

    def draft_steps(self, sizes) -> float:
        """Seconds for draft steps of these sizes (a round's catch-up and proposals)."""
        return sum(self.draft_step(s) for s in sizes)

    def target_alone_rate(self) -> float:
        return 1.0 / self.verify(1)

    def best_k(self, a: float, k_max: int, *, draft_cost: float | None = None, chain: float | None = None,
               min_gain: float = 0.0) -> tuple[int, float]:
        """The k in [0, k_max] with the highest expected tokens per second, and that rate.

        `draft_cost` is seconds per proposed token (None: the draft model's step; 0 for n-gram);
        `chain` switches to the n-gram model where a is the first token's acceptance and `chain`
        the acceptance of each following one. `min_gain`: a k > 0 must promise at least this much
        more than the target alone (0.1 = 10 %), else the answer is k = 0: estimates of acceptance
        and cost are noisy, and a round that drafts for a promised 2 % risks more than it wins."""
        d = self.draft_step() if draft_cost is None else draft_cost
        base = self.target_alone_rate()
        best_k, best = 0, base
        for k in range(1, max(0, k_max) + 1):
            e = expected_tokens(k, a) if chain is None else expected_tokens_chain(a, chain, k)
            r = e / (k * d + self.verify(k + 1))
            if r > best:
                best_k, best = k, r
        if best_k and best < base * (1.0 + min_gain):
            return 0, base
        return best_k, best

    def measured(self) -> dict[int, float]:
        """Seconds of a target step by size, for the sizes timed at least twice (recent medians).
        Shared until a median moves: read it, never change it."""
        return self._points()

    # -- internals --------------------------------------------------------------------------------
    def _points(self) -> dict[int, float]:
        """Sizes timed at least twice (the first run of a shape pays one-off allocations); read-only,
        kept per version: the medians also hold every prompt chunk's size, and a tree round asks for
        up to 32 sizes (measured: 25 us a size before, in `auto`'s loop)."""
        t = self.target
        return self.cached(("pts", 0), lambda _: {s: v for s, v in t.recent_s.items()
                                                  if s < _MAX_FIT and t.count.get(s, 0) >= 2})

    def _t1(self) -> float:
        pts = self._points()
        if 1 in pts:
            return pts[1]
        t = self.target.recent(1)
        if t is not None:
            return t
        # no 1-token step seen yet (right after a prefill): derive it from any small step we have
        for s in sorted(self.target.recent_s):
            if s < _MAX_FIT:
                return self.target.recent_s[s] / _prior_ratio(s)
        return 1.0  # nothing measured: relative units, the decisions only compare ratios


def _prior_ratio(s: int) -> float:
    top = max(PRIOR_VERIFY_RATIO)
    if s <= top:
        return PRIOR_VERIFY_RATIO[max(1, s)]
    return PRIOR_VERIFY_RATIO[top] + PRIOR_VERIFY_SLOPE * (s - top)
