"""Drafters for batched requests: each request its own, all of them learning from the ones before.

A batched request cannot share the serial engine's drafter objects: several run side by side, and a
drafter holds per-request state (its last lookup, the text it has indexed). So every request gets
fresh drafters, seeded from what finished requests left:

- the suffix index, in two levels (drafters/suffix.py): a shared history of finished requests'
  prompts and answers (bounded like the serial engine's, oldest evicted), which every request reads
  and none writes while it runs, and a small index of the request's own prompt and output (sized by
  the slot's max_len, not the history's capacity). A lookup takes the better of the two chains. So
  requests running together never see each other's text, admission copies nothing (the history is
  the same object for all: a copy of 1M tokens cost 50-100 MB and 60-170 ms on a loaded 2-core VM,
  docs/speed.md), and a running slot costs its own text's index only. When a request ends, its
  text joins the history, between rounds: requests still running draft from it from then on;
- acceptance estimates (n-gram per matched length, suffix per length and frequency bin): a new
  request starts from the last finished request's, faded as the serial drafters fade them.

Modes (the rows drafters/modes.py marks batched): `none`, `ngram` (this request's text only), `suffix`
(the history and this request), and `auto` choosing per round between the suffix index and nothing.
The draft model, the self-draft and recycled candidates need one model cache or the verify rows of
one request at a time: refused when the request is parsed.
"""
from __future__ import annotations

import copy
from typing import Sequence

from ..core.costmodel import CostModel
from ..drafters import AutoDrafter, Drafter, NgramDrafter, NoDrafter
from ..drafters.grammar import GrammarDrafter
from ..drafters.suffix import SuffixDrafter
from ..drafters.suffix_index import SuffixIndex
from ..limits import DEFAULT_K_CAP, DEFAULT_MAX_LEN, SUFFIX_CAPACITY


def request_index_capacity(max_len: int) -> int:
    """Tokens a batched request's own suffix index holds: its whole text (prompt and output fit the
    slot's cache of max_len tokens; one more for the token sampled last), at least the index's 16."""
    return max(16, max_len + 1)


class BatchDrafters:
    def __init__(self, suffix_capacity: int = SUFFIX_CAPACITY, max_len: int = DEFAULT_MAX_LEN):
        self.history = SuffixIndex(suffix_capacity)  # finished requests' text: read by all, written between rounds
        self.request_capacity = request_index_capacity(max_len)
        self._ngram = NgramDrafter(None)  # the last finished request's n-gram estimates
        self._suffix_acc = None  # ... and its suffix acceptance table

    def for_request(self, mode: str, k: int | None, costs: CostModel) -> tuple[Drafter, Drafter, int]:
        """The request's drafter, its free fallback (what a limit forbidding model steps drafts with)
        and per-round proposal cap (k=None: sized from measured costs). `mode` is one the table marks
        batched (drafters/modes.py; the request parser refused the others)."""
        d, cap = self._drafter(mode, k, costs)
        return d, d if not d.uses_model else self._suffix(None, costs), cap

    def _drafter(self, mode: str, k: int | None, costs: CostModel) -> tuple[Drafter, int]:
        if mode == "none":
            return NoDrafter(), 0
        cap = DEFAULT_K_CAP if k is None else k
        adaptive = k is None
        if mode == "grammar":
            return GrammarDrafter(costs), cap
        if mode == "ngram":
            ng = NgramDrafter(costs, adaptive=adaptive)
            ev = self._ngram
            for n, beta in ev.first.items():
                ng.first[n].a, ng.first[n].b = beta.a, beta.b
            ng.next.a, ng.next.b = ev.next.a, ev.next.b
            ng.cont.a, ng.cont.b = ev.cont.a, ev.cont.b
            return ng, cap
        sx = self._suffix(k, costs)
        if mode == "suffix":
            return sx, cap
        return AutoDrafter(costs, [sx, GrammarDrafter(costs)]), cap

    def _suffix(self, k: int | None, costs: CostModel) -> SuffixDrafter:
        own = SuffixIndex(self.request_capacity, self.history.max_match, self.history.max_chain)
        sx = SuffixDrafter(own, costs, adaptive=k is None, shared=self.history)
        if self._suffix_acc is not None:
            sx.acc = copy.deepcopy(self._suffix_acc)
        return sx

    def finished(self, drafter: Drafter, ctx: Sequence[int]) -> None:
        """A request ended (whatever its finish): its text joins the history, its estimates seed
        the next request's drafters."""
        self.history.start_doc()
        self.history.extend(ctx)
        for d in (drafter, *getattr(drafter, "sources", ())):
            if isinstance(d, NgramDrafter):
                self._ngram = d
            elif isinstance(d, SuffixDrafter):
                self._suffix_acc = d.acc

    def forget(self) -> None:
        """reset_cache(): no history, no learned estimates."""
        self.history.clear()
        self._ngram = NgramDrafter(None)
        self._suffix_acc = None
