"""Drafters for batched requests: each request its own, all of them learning from the ones before.

A batched request cannot share the serial engine's drafter objects: several run side by side, and a
drafter holds per-request state (its last lookup, the text it has indexed). So every request gets
fresh drafters, seeded from what finished requests left:

- the suffix index: a shared history of finished requests' prompts and answers (bounded like the
  serial engine's, oldest evicted). A request drafts from its own copy of that history with its own
  text appended as it grows, so requests running together never interleave their text in one index;
  the copy costs one memcpy of the history (4 bytes a token) at admission, and a slot's copy lives
  as long as its request. When a request ends, its text joins the history;
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
from ..drafters.suffix import SuffixDrafter
from ..drafters.suffix_index import SuffixIndex
from ..limits import DEFAULT_K_CAP, SUFFIX_CAPACITY

class BatchDrafters:
    def __init__(self, suffix_capacity: int = SUFFIX_CAPACITY):
        self.history = SuffixIndex(suffix_capacity)
        self._ngram = NgramDrafter(None)  # the last finished request's n-gram estimates
        self._suffix_acc = None  # ... and its suffix acceptance table

    def for_request(self, mode: str, k: int | None, costs: CostModel) -> tuple[Drafter, int]:
        """The request's drafter and per-round proposal cap (k=None: sized from measured costs). `mode`
        is one the table marks batched (drafters/modes.py; the request parser refused the others)."""
        if mode == "none":
            return NoDrafter(), 0
        cap = DEFAULT_K_CAP if k is None else k
        adaptive = k is None
        if mode == "ngram":
            ng = NgramDrafter(costs, adaptive=adaptive)
            ev = self._ngram
            for n, beta in ev.first.items():
                ng.first[n].a, ng.first[n].b = beta.a, beta.b
            ng.next.a, ng.next.b = ev.next.a, ev.next.b
            ng.cont.a, ng.cont.b = ev.cont.a, ev.cont.b
            return ng, cap
        sx = SuffixDrafter(self.history.copy(), costs, adaptive=adaptive)
        if self._suffix_acc is not None:
            sx.acc = copy.deepcopy(self._suffix_acc)
        if mode == "suffix":
            return sx, cap
        return AutoDrafter(costs, [sx]), cap

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
