"""What the free drafters (suffix index, recycled candidates) share: scoring their lookups against what
the target verified, choosing how many of a lookup's tokens pay, and proposing and quoting from a
lookup.

A free drafter's lookup costs no model step, so it can run every round whether or not its proposal
is used, and every lookup is scored against the tokens the target then produced: the acceptance
estimates stay current even while another source drafts.
"""
from __future__ import annotations

from typing import Sequence

from ..core.costmodel import CostModel
from ..core.proposal import EMPTY, Proposal
from .base import Beta, DrafterBase, Quote


def plan_chain(costs: CostModel | None, accs: Sequence[float], min_gain: float) -> tuple[int, float]:
    """How many tokens of a chain to propose, and the expected tokens per second.

    accs[j]: the probability that token j is accepted given tokens 0..j-1 were. A chain of k tokens
    yields 1 + sum_{j<k} prod_{i<=j} accs[i] tokens for one verify of k + 1 (no draft cost). k > 0
    only when it promises `min_gain` more than a plain target step (as CostModel.best_k)."""
    if costs is None:
        return len(accs), 0.0
    base = costs.target_alone_rate()
    best_k, best = 0, base
    e, p = 1.0, 1.0
    for j, a in enumerate(accs):
        p *= a
        e += p
        r = e / costs.verify(j + 2)
        if r > best:
            best_k, best = j + 1, r
    if best_k and best < base * (1.0 + min_gain):
        return 0, base
    return best_k, best


class LookupScorer:
    """Remembers the last lookup (where it was made, its tokens, the estimate each token was
    planned with) and, at the next lookup, scores it against what the target wrote since."""

    def __init__(self) -> None:
        self._pending: tuple[int, list[int], list[Beta]] | None = None

    def forget(self) -> None:
        self._pending = None

    def remember(self, pos: int, tokens: list[int], betas: list[Beta]) -> None:
        self._pending = (pos, list(tokens), list(betas)) if tokens else None

    def score(self, ctx: Sequence[int]) -> None:
        if self._pending is None:
            return
        pos, tokens, betas = self._pending
        self._pending = None
        seen = ctx[pos : pos + len(tokens)]
        for j, t in enumerate(seen):  # tokens past what was verified are unknown: not scored
            ok = t == tokens[j]
            betas[j].add(ok, not ok)
            if not ok:
                break


class FreeLookupDrafter(DrafterBase):
    """propose and quote for a drafter whose lookup is free. A subclass gives `lookup(ctx, k)` (what
    it found, scored next round), `plan(found)` ((tokens worth proposing, expected tokens per second);
    0 tokens when nothing was found), `proposal(found, n)` and `min_gain`."""

    min_gain: float

    def propose(self, ctx, k, params, rng) -> Proposal:
        if k <= 0:
            return EMPTY
        found = self.lookup(ctx, k)
        use, _ = self.plan(found)
        return self.proposal(found, use)

    def quote(self, ctx: Sequence[int], k: int) -> Quote | None:
        """The lookup is free, so the quote carries the proposal itself (None when nothing pays)."""
        found = self.lookup(ctx, k)
        use, rate = self.plan(found)
        return Quote(rate, self.proposal(found, use)) if use else None
