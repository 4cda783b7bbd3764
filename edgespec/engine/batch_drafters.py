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

- the draft model: one ModelDrafter per slot, kept across the slot's requests (its cache, its
  calibration), drafting through the batched draft step (engine/draft_batch.py);
- `auto`'s acceptance evidence: a new request's auto starts from the last finished request's.

Modes: the rows drafters/modes.py marks batched, `auto` choosing among the batched sources it ranks.
The self-draft and the draft heads are refused before a request is admitted (modes.check_batched).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Sequence

from ..core.costmodel import CostModel
from ..core.runner import StepTimes
from ..drafters import AutoDrafter, Drafter, NgramDrafter, NoDrafter, modes
from ..drafters.grammar import GrammarDrafter
from ..drafters.model import ModelDrafter
from ..drafters.recycle import RecycleDrafter
from ..drafters.suffix import SuffixDrafter
from ..drafters.suffix_index import SuffixIndex
from ..limits import DEFAULT_K_CAP, DEFAULT_MAX_LEN, SUFFIX_CAPACITY


def request_index_capacity(max_len: int) -> int:
    """Tokens a batched request's own suffix index holds: its whole text (prompt and output fit the
    slot's cache of max_len tokens; one more for the token sampled last), at least the index's 16."""
    return max(16, max_len + 1)


@dataclass
class DraftModel:
    """The draft model of a batched engine: its slots (engine/draft_batch.py) and what a
    ModelDrafter needs beside them."""

    slots: list  # slot -> DraftSlot (ModelRunner's interface over one slot of the draft BatchRunner)
    times: StepTimes  # its one-row step times (the cost model's draft steps)
    vocab_map: object = None  # a pruned draft's logits row -> token id map
    prior: float | None = None  # the bundle's measured draft agreement
    drafters: dict = field(default_factory=dict)  # slot -> its ModelDrafter (kept across the slot's requests)


class BatchDrafters:
    def __init__(self, suffix_capacity: int = SUFFIX_CAPACITY, max_len: int = DEFAULT_MAX_LEN, *,
                 usable: int | None = None, draft: DraftModel | None = None):
        self.history = SuffixIndex(suffix_capacity)  # finished requests' text: read by all, written between rounds
        self.request_capacity = request_index_capacity(max_len)
        self.usable = usable
        self.draft = draft
        self._ngram = NgramDrafter(None)  # the last finished request's n-gram estimates
        self._suffix_acc = None  # ... and its suffix acceptance table
        self._auto_evidence: dict = {}  # ... and its auto's acceptance evidence (AutoDrafter.evidence)
        # the recycle table is shared by every request (as the serial engine's learns across requests);
        # each slot keeps its own drafter over it (its estimates, its last lookup)
        self._table = RecycleDrafter(usable).table if usable is not None else None
        self._recycle: dict[int, RecycleDrafter] = {}
        self._costs: dict[int, CostModel] = {}
        self._parts: dict[Drafter, dict[str, Drafter]] = {}  # a request's drafter -> what it was built of

    def costs(self, slot: int, target: StepTimes) -> CostModel:
        """The slot's cost model: the batch's target pass times (the engine points `target` at the
        batch's table each round) and the draft's step times. Kept per slot: its model drafter
        prices its proposals with it across requests."""
        c = self._costs.get(slot)
        if c is None:
            c = self._costs[slot] = CostModel(target, self.draft.times if self.draft is not None else None)
        return c

    def available(self, mode: str) -> bool:
        return mode != "model" or self.draft is not None

    def for_request(self, mode: str, k: int | None, costs: CostModel, slot: int = 0) -> tuple[Drafter, Drafter, int]:
        """The request's drafter, its free fallback (what a limit forbidding model steps drafts with)
        and per-round proposal cap (k=None: sized from measured costs). `mode` is one the table marks
        batched (drafters/modes.py; the request parser refused the others)."""
        if mode == "none":
            return NoDrafter(), NoDrafter(), 0
        adaptive = k is None
        parts: dict[str, Drafter] = {}
        if mode == "auto":  # its sources: the batched rows it ranks, as the serial engine's auto
            for row in sorted((r for r in modes.MODES if r.batched and r.auto_rank is not None),
                              key=lambda r: r.auto_rank):
                d = self._build(row.name, True, costs, slot)
                if d is not None:
                    parts[row.name] = d
            d = AutoDrafter(costs, list(parts.values()), evidence=copy.deepcopy(self._auto_evidence))
        else:
            d = parts[mode] = self._build(mode, adaptive, costs, slot)
        d.set_adaptive(adaptive)
        fallback = parts.get(modes.FALLBACK) or self._build(modes.FALLBACK, adaptive, costs, slot)
        if not d.uses_model:
            fallback = d
        self._parts[d] = parts
        return d, fallback, DEFAULT_K_CAP if k is None else k

    def _build(self, name: str, adaptive: bool, costs: CostModel, slot: int) -> Drafter | None:
        """One mode's drafter for a request in `slot` (None: not loaded here)."""
        if name == "grammar":
            return GrammarDrafter(costs)
        if name == "ngram":
            ng = NgramDrafter(costs, adaptive=adaptive)
            ev = self._ngram
            for n, beta in ev.first.items():
                ng.first[n].a, ng.first[n].b = beta.a, beta.b
            ng.next.a, ng.next.b = ev.next.a, ev.next.b
            ng.cont.a, ng.cont.b = ev.cont.a, ev.cont.b
            return ng
        if name == "suffix":
            own = SuffixIndex(self.request_capacity, self.history.max_match, self.history.max_chain)
            sx = SuffixDrafter(own, costs, adaptive=adaptive, shared=self.history)
            if self._suffix_acc is not None:
                sx.acc = copy.deepcopy(self._suffix_acc)
            return sx
        if name == "recycle":
            if self._table is None:
                return None
            r = self._recycle.get(slot)
            if r is None:
                r = self._recycle[slot] = RecycleDrafter(self.usable, costs, table=self._table)
            return r
        if name == "model":
            dm = self.draft
            if dm is None:
                return None
            m = dm.drafters.get(slot)
            if m is None:  # kept with the slot: its cache, its calibration and its rate carry over
                m = dm.drafters[slot] = ModelDrafter(dm.slots[slot], self.usable, costs, vocab_map=dm.vocab_map,
                                                     prior=dm.prior)
            return m
        raise ValueError(f"draft={name!r} has no batched drafter")

    def finished(self, drafter: Drafter, ctx: Sequence[int]) -> None:
        """A request ended (whatever its finish): its text joins the history, its estimates seed
        the next request's drafters."""
        self.history.start_doc()
        self.history.extend(ctx)
        parts = self._parts.pop(drafter, {})
        if "ngram" in parts:
            self._ngram = parts["ngram"]
        if "suffix" in parts:
            self._suffix_acc = parts["suffix"].acc
        if isinstance(drafter, AutoDrafter):
            self._auto_evidence = drafter.evidence

    def failed(self, slot: int, drafter: Drafter | None = None) -> None:
        """The slot's caches were reset (a failed pass): its draft model forgets what it held, and
        the failed request's drafter is dropped (its text does not join the history)."""
        self._parts.pop(drafter, None)
        m = self.draft.drafters.get(slot) if self.draft is not None else None
        if m is not None:
            m.reset()

    def forget(self) -> None:
        """reset_cache(): no history, no learned estimates."""
        self.history.clear()
        self._ngram = NgramDrafter(None)
        self._suffix_acc = None
        self._auto_evidence = {}
        if self._table is not None:
            self._table.fill(-1)
        for d in [*self._recycle.values(), *(self.draft.drafters.values() if self.draft is not None else ())]:
            d.forget()
            d.reset()
