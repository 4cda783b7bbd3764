"""The suffix drafter: proposals copied from everything the engine has seen recently.

It drafts from a SuffixIndex (suffix_index.py) holding the current request's prompt and output and
the engine's earlier requests and responses (bounded, oldest evicted, cleared by
Engine.reset_cache()). Per round it takes the most frequent continuation of the longest earlier
match of the context's suffix and proposes as much of it as pays: each token's acceptance is
estimated from how often tokens with the same (matched length, frequency) were right before, and
the chain length maximises expected tokens per measured verify second (lookup.plan_chain).

On one request's text alone it is the n-gram prompt lookup (NgramDrafter) with longer matches (up
to 32 tokens, not 5) and frequency among all earlier occurrences instead of the latest one; across
requests it also copies what earlier answers said (a visitor's follow-up quoting the last answer,
the same question asked again, a repeated system prompt).

Two levels (the engine's requests, engine/batch_drafters.py): `index` holds only this request's text and
`shared` the finished requests' history, read here and never written. A lookup asks both and keeps
the better chain: the longer match, then the more tokens expected accepted (the own text first on a
tie: it is the most recent). Requests running side by side so never see each other's text, and none
copies the history to start.
"""
from __future__ import annotations

import copy
from bisect import bisect_right
from typing import Sequence


from ..core.costmodel import CostModel
from ..core.proposal import EMPTY, Proposal
from .base import NEW_REQUEST_KEEP, Beta
from .lookup import FreeLookupDrafter, LookupScorer, plan_chain
from .ngram import NGRAM_MIN_GAIN
from .suffix_index import Chain, SuffixIndex

# acceptance estimates per (matched length bin, frequency bin)
_LEN_EDGES = (2, 3, 4, 5, 8, 12, 20)  # bins: 1 | 2 | 3 | 4 | 5-7 | 8-11 | 12-19 | 20+
_LEN_PRIOR = (0.2, 0.35, 0.45, 0.5, 0.6, 0.7, 0.8, 0.85)
# frequency bins: one occurrence | < 0.5 of occurrences | 0.5-0.8 | >= 0.8 (with >= 2 occurrences)
_FREQ_PRIOR = (1.0, 0.6, 0.85, 1.05)


def _len_bin(n: int) -> int:
    return bisect_right(_LEN_EDGES, n)  # a scalar: bisect, not a numpy call (read every lookup token)


def _freq_bin(freq: float, support: int) -> int:
    if support <= 1:
        return 0
    return 1 if freq < 0.5 else 2 if freq < 0.8 else 3


class SuffixDrafter(FreeLookupDrafter):
    """Free proposals from the suffix index; see the module docstring."""

    name = "suffix"

    def __init__(self, index: SuffixIndex, costs: CostModel | None = None, *, adaptive: bool = True,
                 shared: SuffixIndex | None = None):
        self.index = index  # the text this drafter appends to (in the engine: its request's own)
        self.shared = shared  # read-only earlier text (in the engine: the finished requests'), or None
        self.costs = costs
        self.adaptive = adaptive and costs is not None
        self.min_gain = NGRAM_MIN_GAIN
        self.acc = [[Beta(min(0.95, lp * fp)) for fp in _FREQ_PRIOR] for lp in _LEN_PRIOR]
        self._scorer = LookupScorer()
        self._open = False  # a request's document is being appended to
        self._indexed = 0  # tokens of the current request already in the index

    # -- the index follows the requests -----------------------------------------------------------
    def begin(self, ctx: Sequence[int]) -> None:
        self._scorer.forget()
        for row in self.acc:
            for b in row:
                b.fade(NEW_REQUEST_KEEP)
        self.index.start_doc()
        # the prompt is indexed at the first lookup (after the first token) or when the request ends,
        # not here: the automaton's insert (~10 us a token) stays out of the time to first token
        self._open, self._indexed = True, 0

    def sync(self, ctx: Sequence[int]) -> None:
        """Appends what the current request added since the last call (ctx only grows within a
        request: accepted tokens are final)."""
        if not self._open:
            self.index.start_doc()
            self._open, self._indexed = True, 0
        if len(ctx) > self._indexed:
            self.index.extend(ctx[self._indexed :])
            self._indexed = len(ctx)

    def record(self, ctx: Sequence[int]) -> None:
        """The request is over (whatever mode ran it): its full text joins the index, and the next
        request starts a new document."""
        self.sync(ctx)
        self._open = False

    def end(self, ctx: Sequence[int]) -> None:
        self.record(ctx)

    def alternatives(self, ctx: Sequence[int], k: int, width: int) -> list[tuple[list[int], str]]:
        """The index's other continuations of the context's longest earlier match (SuffixIndex.alternatives)."""
        idx = self.index
        return [(c, "suffix-alt") for c in idx.alternatives(ctx[-idx.max_match :], k, width)]

    def reset(self) -> None:
        """The engine's caches were invalidated (an error mid-request, a warm-up): the text indexed
        so far stays, but the next request starts a new document."""
        self._open = False
        self._scorer.forget()

    def forget(self) -> None:
        """Engine.reset_cache(): the index forgets every earlier request."""
        self.index.clear()
        self._open, self._indexed = False, 0
        self._scorer.forget()

    def set_adaptive(self, on: bool) -> None:
        self.adaptive = on and self.costs is not None

    def stats(self) -> dict:
        """Its index's figures (`index_figures`: /metrics' memory gauges) and its mean acceptance
        per matched-length bin (rows) and frequency bin (columns)."""
        return {**index_figures(self.index), "acceptance": [[b.mean for b in row] for row in self.acc]}

    def evidence(self) -> list[list[Beta]]:
        """Its acceptance table (per matched length and frequency bin)."""
        return self.acc

    def seed(self, evidence) -> None:
        """Starts from a finished request's table (a copy: requests never share it)."""
        if evidence is not None:
            self.acc = copy.deepcopy(evidence)

    # -- drafting ---------------------------------------------------------------------------------
    def betas(self, chain: Chain) -> list[Beta]:
        return [self.acc[_len_bin(chain.matched + j)][_freq_bin(f, s)]
                for j, (f, s) in enumerate(zip(chain.freqs, chain.supports))]

    def lookup(self, ctx: Sequence[int], k: int) -> Chain:
        """This round's chain; also scores the last round's against what the target verified."""
        self._scorer.score(ctx)
        self.sync(ctx)
        # the whole tail is in the index already (the current document's end): look it up there
        tail = ctx[-self.index.max_match :]
        chain = self.index.lookup(tail, k)
        if self.shared is not None:
            chain = max(chain, self.shared.lookup(tail, k), key=self._rank)
        self._scorer.remember(len(ctx), chain.tokens, self.betas(chain))
        return chain

    def _rank(self, chain: Chain) -> tuple[int, float]:
        """Which of two chains to take: the longer match, then the more tokens expected accepted."""
        expected, p = 0.0, 1.0
        for b in self.betas(chain):
            p *= b.mean
            expected += p
        return chain.matched, expected

    def plan(self, chain: Chain) -> tuple[int, float]:
        if not chain.tokens:
            return 0, self.costs.target_alone_rate() if self.costs else 0.0
        if not self.adaptive:
            return len(chain.tokens), 0.0
        return plan_chain(self.costs, [b.mean for b in self.betas(chain)], self.min_gain)

    def proposal(self, chain: Chain, k: int) -> Proposal:
        if not k:
            return EMPTY
        accept = [b.mean for b in self.betas(chain)[:k]]  # per token, given the ones before
        return Proposal(chain.tokens[:k], None, self.name, ngram=chain.matched, accept=accept)


def index_figures(index: SuffixIndex) -> dict[str, int]:
    """A suffix index's size as stats() reports it: tokens held, capacity, tokens evicted to stay
    within it, bytes of its buffers. Read without locks (plain integers)."""
    return {"index_tokens": len(index), "index_capacity": index.capacity, "index_evicted": index.evicted,
            "index_bytes": index.nbytes}
