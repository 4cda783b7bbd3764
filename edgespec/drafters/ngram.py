"""N-gram prompt lookup: the longest suffix of the context (n = max_n .. 1) that occurred earlier in
prompt + output proposes what followed it then. Costs no model step at all."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.costmodel import CostModel
from ..core.proposal import EMPTY, Proposal
from .base import NEW_REQUEST_KEEP, Beta, DrafterBase, Quote

# An n-gram round must promise this much more than a plain target step before it drafts: the
# estimates are noisy, a wrong "yes" costs a longer verify, a wrong "no" costs nothing.
NGRAM_MIN_GAIN = 0.10


def ngram_lookup(ctx: Sequence[int] | np.ndarray, k: int, max_n: int = 5, min_n: int = 1) -> tuple[list[int], int]:
    """Finds the longest suffix of ctx (max_n down to min_n tokens) that occurred earlier and returns
    up to k tokens that followed its latest earlier occurrence, preferring one with k tokens after
    it, and the matched length n. ([], 0) when nothing matches."""
    tokens, n, _ = ngram_match(ctx, k, max_n, min_n)
    return tokens, n


def suffix_matches(a: np.ndarray, max_n: int) -> tuple[np.ndarray, np.ndarray]:
    """Where the suffix of `a` ([length] token ids) occurred earlier: (ends, matched), where an earlier
    occurrence ends at ends[i] (so what followed it starts at ends[i] + 1, ends ascending) and matches the
    last matched[i] tokens of `a` (1 .. max_n). The n-token matches are ends[matched >= n].

    One pass finds the earlier occurrences of the last token, and each is extended backward: a window scan
    per match length (n = max_n .. 1, each comparing every window) costs the context times max_n, every
    round of the lookups and the tree verifier's alternatives (0.15 ms at 400 tokens on the dev CPU,
    against 0.035). tests/core/test_tree.py checks the two against each other."""
    length = a.shape[0]
    ends = np.flatnonzero(a[: length - 1] == a[-1]) if length >= 2 else np.empty(0, dtype=np.int64)
    matched = np.ones(ends.shape[0], dtype=np.int64)
    for t in range(1, min(max_n, length - 1)):
        grow = (matched == t) & (ends >= t)
        grow[grow] = a[ends[grow] - t] == a[length - 1 - t]
        matched += grow
    return ends, matched


def ngram_alternatives(ctx: Sequence[int], k: int, width: int, max_n: int = 5) -> list[list[int]]:
    """Up to `width` distinct continuations of up to k tokens that followed earlier occurrences of
    the context's suffix (suffix_matches), longest match first, then latest occurrence first: what a
    tree round widens a chain with (engine/tree_round.py)."""
    a = np.asarray(ctx, dtype=np.int64)
    length = a.shape[0]
    out: list[list[int]] = []
    if k <= 0 or width <= 0 or length < 2:
        return out
    ends, matched = suffix_matches(a, max_n)
    seen: set[tuple[int, ...]] = set()
    for n in range(min(max_n, length - 1), 0, -1):
        for j in ends[matched >= n][::-1]:
            cont = tuple(a[j + 1 : j + 1 + k].tolist())
            if cont and cont not in seen:
                seen.add(cont)
                out.append(list(cont))
                if len(out) >= width:
                    return out
    return out


def ngram_match(ctx: Sequence[int] | np.ndarray, k: int, max_n: int = 5, min_n: int = 1
                ) -> tuple[list[int], int, int]:
    """ngram_lookup, plus where the proposal is copied from: the index in ctx of its first token
    (-1 when nothing matches). len(ctx) - that index is the copy's distance back, the same from
    round to round while the text keeps copying one span."""
    a = np.asarray(ctx, dtype=np.int64)
    length = a.shape[0]
    if k <= 0 or length < 2:
        return [], 0, -1
    ends, matched = suffix_matches(a, max_n)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        hits = ends[matched >= n]  # what followed each starts at hits + 1
        if hits.size == 0:
            continue
        full = hits[hits + 1 + k <= length]
        j = int(full[-1] if full.size else hits[-1])
        return a[j + 1 : j + 1 + k].tolist(), n, j + 1
    return [], 0, -1


class NgramDrafter(DrafterBase):
    """Proposes what followed the longest earlier match of the context's suffix.

    With `adaptive`, it proposes only as many tokens as pay off given how often matches of this
    length were right (an n-gram copy either is being copied or not: the first token is the
    uncertain one, hence separate first/next acceptance). Lookups cost nothing, so every round's
    lookup is scored against the text the target then verified, whether or not it was proposed:
    the estimates stay current even while another drafter is in use.

    A match that copies from the same distance back as the last round's match continues the span
    the text is copying (a refactor resuming after an edited name, a quoted block): its first token
    is far more likely right than a fresh match of the same length, so it has its own estimate."""

    name = "ngram"

    def __init__(self, costs: CostModel | None = None, *, adaptive: bool = True, max_n: int = 5):
        self.costs = costs
        self.adaptive = adaptive and costs is not None
        self.max_n = max_n
        self.min_gain = NGRAM_MIN_GAIN
        # priors: a one-token match is a weak hint, three or more tokens a strong one
        self.first = {n: Beta(m) for n, m in ((1, 0.2), (2, 0.35), (3, 0.45), (4, 0.5), (5, 0.55))}
        self.next = Beta(0.75)
        self.cont = Beta(0.7)  # first token of a match that continues the last match's span
        self.use_cont = True
        self._distance: int | None = None  # len(ctx) - source index of the last match
        self.last_cont = False  # the last lookup continued the span before it
        # (position, lookup, first-token estimate) of the last lookup, to score next round
        self._pending: tuple[int, list[int], Beta] | None = None

    def evidence(self) -> tuple[dict[int, Beta], Beta, Beta]:
        """Its estimates (first token by matched length, the span's next, a continued span's first)."""
        return self.first, self.next, self.cont

    def seed(self, evidence) -> None:
        """Starts from a finished request's estimates (their values: requests never share them)."""
        if evidence is None:
            return
        first, nxt, cont = evidence
        for n, beta in first.items():
            self.first[n].a, self.first[n].b = beta.a, beta.b
        self.next.a, self.next.b = nxt.a, nxt.b
        self.cont.a, self.cont.b = cont.a, cont.b

    def first_beta(self, n: int) -> Beta:
        return self.first[min(n, max(self.first))]

    def begin(self, ctx) -> None:
        # a new text copies more or less than the last one: start from the old estimates, but
        # let this request's own lookups take over quickly
        self._pending = None
        self._distance = None
        for b in (*self.first.values(), self.next, self.cont):
            b.fade(NEW_REQUEST_KEEP)

    def lookup(self, ctx: Sequence[int], k: int) -> tuple[list[int], int]:
        """The lookup for this round; also scores the previous round's lookup against what the
        target verified since (ctx[pos:])."""
        self._score(ctx)
        tokens, n, src = ngram_match(ctx, k, self.max_n)
        self.last_cont = False
        if tokens:
            d = len(ctx) - src
            self.last_cont = self.use_cont and d == self._distance
            self._distance = d
        self._pending = (len(ctx), tokens, self._first_estimate(n)) if tokens else None
        return tokens, n

    def _first_estimate(self, n: int) -> Beta:
        return self.cont if self.last_cont else self.first_beta(n)

    def _score(self, ctx: Sequence[int]) -> None:
        if self._pending is None:
            return
        pos, tokens, first = self._pending
        self._pending = None
        seen = ctx[pos : pos + len(tokens)]
        if not seen:
            return
        if seen[0] != tokens[0]:
            first.add(0, 1)
            return
        first.add(1, 0)
        hits = 1
        while hits < len(seen) and seen[hits] == tokens[hits]:
            hits += 1
        # tokens past what was verified are unknown: only a mismatch within it counts as a miss
        self.next.add(hits - 1, hits < len(seen))

    def plan(self, tokens: list[int], n: int) -> tuple[int, float]:
        """How many of a lookup's tokens to propose, and the expected tokens per second (right
        after the lookup: it reads whether that lookup continued a span)."""
        if not tokens:
            return 0, self.costs.target_alone_rate() if self.costs else 0.0
        if not self.adaptive:
            return len(tokens), 0.0
        return self.costs.best_k(self._first_estimate(n).mean, len(tokens), draft_cost=0.0, chain=self.next.mean,
                                 min_gain=self.min_gain)

    def propose(self, ctx, k, params, rng) -> Proposal:
        tokens, n = self.lookup(ctx, k)
        use, _ = self.plan(tokens, n)
        return self._proposal(tokens[:use], n) if use else EMPTY

    def _proposal(self, tokens: list[int], n: int) -> Proposal:
        """With the estimates it was sized by: the first token's, then the span's continuation."""
        accept = [self._first_estimate(n).mean] + [self.next.mean] * (len(tokens) - 1)
        return Proposal(tokens, None, "ngram", ngram=n, accept=accept)

    def set_adaptive(self, on: bool) -> None:
        self.adaptive = on and self.costs is not None

    def alternatives(self, ctx: Sequence[int], k: int, width: int) -> list[tuple[list[int], str]]:
        return [(c, "ngram") for c in ngram_alternatives(ctx, k, width, self.max_n)]

    def quote(self, ctx: Sequence[int], k: int) -> Quote | None:
        """The lookup is free, so the quote carries the proposal itself (None when nothing pays)."""
        tokens, n = self.lookup(ctx, k)
        use, rate = self.plan(tokens, n) if tokens else (0, 0.0)
        if not use:
            return None
        return Quote(rate, self._proposal(tokens[:use], n))


