"""The engine's drafters: each request its own, all of them learning from the ones before.

Requests cannot share drafter objects: several run side by side (--parallel N), and a
drafter holds per-request state (its last lookup, the text it has indexed). So every request gets
fresh drafters, seeded from what finished requests left:

- the suffix index, in two levels (drafters/suffix.py): a shared history of finished requests'
  prompts and answers (bounded by --suffix-capacity, oldest evicted), which every request reads
  and none writes while it runs, and a small index of the request's own prompt and output (sized by
  the slot's max_len, not the history's capacity). A lookup takes the better of the two chains. So
  requests running together never see each other's text, admission copies nothing (the history is
  the same object for all: a copy of 1M tokens cost 50-100 MB and 60-170 ms on a loaded 2-core VM,
  docs/speed.md), and a running slot costs its own text's index only. When a request ends, its
  text joins the history, between rounds: requests still running draft from it from then on;
- acceptance estimates (n-gram per matched length, suffix per length and frequency bin): a new
  request starts from the last finished request's, faded at its begin.

- the documents (an engine opened with docs=INDEX): one index over them (drafters/docs.DocsStore,
  rebuilt when they are reloaded), read by every request's docs drafter and written by none;
- the draft model: one ModelDrafter per slot, kept across the slot's requests (its cache, its
  calibration), drafting through the batched draft step (engine/draft_batch.py);
- the self-draft (an engine opened with draft="self"): the target's layer-skipped graph as a runner
  over the target's cache, each slot's self-draft on that slot's own buffers (engine/selfdraft.py
  SelfPair.skip), a SelfDrafter per slot, kept across the slot's requests, drafting through one
  batched step of that runner for every slot drafting with it (engine/draft_batch.py);
- the draft heads: one session, a heads drafter per slot over that slot's view of the target (the
  hidden rows of its last verified pass, which the batched pass stores per slot: core/runner.py);
- `auto`'s evidence (acceptance, shares of rounds, the replies' mean length): a new request's auto
  starts from the last finished request's.

Pricing: each slot's cost model is pointed at the round's batch tables every round (`price`): the
verify at the batch's width, the draft model's step at the width of its batched step, and the
self-draft's (a cost model of its own, drafters/modes.py `_self`) at the width of its runner's batched
step, so adaptive rounds read what a batched step really costs.

What is learnt (`state` / `load_state`, the bench's lineages: bench/lineage.py): the evidence by mode,
the recycle table's contents and each slot's kept drafters' state(); not the shared history, which is
text, as every drafter's state() keeps its suffix indexes shared (drafters/base.py `shared`).

Every request's drafters are built by the mode table (drafters/modes.py `build_all` over the rows of
its mode): lent a Kit with the request's index size, the shared
history, the recycle table and the documents' index. What a request inherits from the last finished
one goes through the drafter interface (`evidence()` of the finished one's drafters, `seed` of the new
one's, by mode name); the rows marked `per_slot` (the draft model, recycle, the self-draft, the
heads) are built once per slot and kept.

Modes: every row of drafters/modes.py, `auto` choosing among the sources it ranks that are loaded.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

from ..core.costmodel import CostModel
from ..core.runner import StepTimes
from ..drafters import Drafter, modes
from ..drafters.auto import AutoEvidence
from ..drafters.docs import DocsStore
from ..drafters.recycle import RecycleDrafter
from ..drafters.suffix_index import SuffixIndex
from ..limits import DEFAULT_K_CAP, DEFAULT_MAX_LEN, SUFFIX_CAPACITY


def request_index_capacity(max_len: int) -> int:
    """Tokens a request's own suffix index holds: its whole text (prompt and output fit the
    slot's cache of max_len tokens; one more for the token sampled last), at least the index's 16."""
    return max(16, max_len + 1)


@dataclass
class DraftModel:
    """The engine's draft model: its slots (engine/draft_batch.py) and what a
    ModelDrafter needs beside them."""

    slots: list  # slot -> core/slot.Slot (one sequence's interface over one slot of the draft ModelRunner)
    times: StepTimes  # its one-row step times (the cost model's draft steps)
    vocab_map: object = None  # a pruned draft's logits row -> token id map
    bundle: object = None  # models.bundle.Bundle (its manifest's measured draft agreement)


@dataclass
class LearntState:
    """What a BatchDrafters has learnt (`state()`), deep-copied: loaded back by `load_state`."""

    learned: dict  # mode -> evidence() of the last finished request's drafter
    table: object  # the recycle table's contents (None: no table)
    kept: dict  # slot -> {mode: that slot's kept drafter's state()}


@dataclass
class TargetSlots:
    """The target's slots and the drafters' runners over them (batched: one per slot)."""

    slots: list  # slot -> core/slot.Slot of the target's ModelRunner (draft heads read its hidden rows)
    bundle: object = None  # models.bundle.Bundle (the heads' record, the draft's measured agreement)
    skips: list | None = None  # slot -> the self-draft on its buffers (engine/selfdraft.py SelfPair.skip)
    heads: object = None  # the draft heads' session (one for every slot: it keeps no state)


class BatchDrafters:
    def __init__(self, suffix_capacity: int = SUFFIX_CAPACITY, max_len: int = DEFAULT_MAX_LEN, *,
                 usable: int | None = None, draft: DraftModel | None = None, docs=None,
                 target: TargetSlots | None = None, times: StepTimes | None = None):
        """docs: the engine's docs.answer.Docs (None: no documents, no "docs" mode);
        target: the target's slots and what drafts on them (the self-draft, the draft heads);
        times: the target's one-row step times, which each slot's cost model starts from."""
        self.history = SuffixIndex(suffix_capacity)  # finished requests' text: read by all, written between rounds
        self.request_capacity = request_index_capacity(max_len)
        self.usable = usable
        self.draft = draft
        self.docs = docs
        self.target = target
        self.times = times
        self._docs_store = DocsStore(docs) if docs is not None else None  # built once, read by every request
        self._learned: dict[str, object] = {}  # mode -> evidence() of the last finished request's drafter
        # the recycle table is shared by every request (it learns across requests);
        # each slot keeps its own drafter over it (its estimates, its last lookup)
        self._table = RecycleDrafter(usable).table if usable is not None else None
        self._kept: dict[int, dict[str, Drafter]] = {}  # slot -> its per_slot rows' drafters
        self._costs: dict[int, CostModel] = {}
        self._parts: dict[Drafter, dict[str, Drafter]] = {}  # a request's drafter -> what it was built of

    def costs(self, slot: int) -> CostModel:
        """The slot's cost model: the target's pass times (`price` points it at the batch's table
        each round) and the draft's step times. Kept per slot: its model drafter prices its
        proposals with it across requests."""
        c = self._costs.get(slot)
        if c is None:
            c = self._costs[slot] = CostModel(self.times, self.draft.times if self.draft is not None else None)
        return c

    def price(self, slot: int, target: StepTimes, draft: StepTimes | None = None,
              self_draft: StepTimes | None = None) -> None:
        """Prices the slot's drafting at this round's batch: its cost model's verify at `target` (the
        batch's pass) and draft steps at `draft` (the draft model's batched step), its kept
        self-draft's cost model at `target` and `self_draft` (its runner's batched step). A table
        left None keeps what it was."""
        c = self._costs.get(slot)
        if c is not None:
            c.target = target
            if draft is not None:
                c.draft = draft
        sd = self._kept.get(slot, {}).get("self")
        if sd is not None and sd.costs is not None:
            sd.costs.target = target
            if self_draft is not None:
                sd.costs.draft = self_draft

    def kept(self, slot: int, build: bool = False) -> dict[str, Drafter]:
        """The slot's kept drafters (its per_slot rows), by mode: the ones built so far, or with
        `build` every one loadable here, built now where its first request has not built it yet."""
        if build:
            kit, make = self._kit(self.costs(slot), slot), self._make(slot)
            for row in modes.MODES:
                if row.per_slot and self.available(row.name):
                    make(row, kit)
        return dict(self._kept.get(slot, {}))

    def warmup(self, slots: int) -> None:
        """Builds each slot's kept drafters and runs their warmup() (the draft model's, the
        self-draft's, the heads' steps timed once at open), so the first requests price them from
        this device's costs; their caches are left reset."""
        for slot in range(slots):
            for d in self.kept(slot, build=True).values():
                d.warmup()
                d.reset()

    def reset(self) -> None:
        """Every slot's caches were reset (a warm-up's, between requests): the kept drafters forget
        what they held, and keep what they learnt."""
        for kept in self._kept.values():
            for d in kept.values():
                d.reset()

    def state(self) -> LearntState:
        """A deep copy of what the drafters have learnt (module docstring), for `load_state`; taken
        between requests (no request's drafters are in it)."""
        return LearntState(copy.deepcopy(self._learned), None if self._table is None else self._table.copy(),
                           {slot: {name: d.state() for name, d in kept.items()} for slot, kept in self._kept.items()})

    def load_state(self, state: LearntState) -> None:
        """Back to what `state()` returned (copied again: one state loads many times). A kept drafter
        the state does not hold (built after it was taken) is dropped: the slot builds it afresh."""
        self._learned = copy.deepcopy(state.learned)
        if self._table is not None and state.table is not None:
            self._table[...] = state.table  # in place: the slots' recycle drafters hold this table
        for slot, kept in self._kept.items():
            saved = state.kept.get(slot, {})
            for name in [n for n in kept if n not in saved]:
                del kept[name]
            for name, d in kept.items():
                d.load_state(saved[name])

    def available(self, mode: str) -> bool:
        """Whether what `mode` drafts with is here: the draft model, the documents, the self-draft, the heads."""
        runner = modes.get(mode).runner
        t = self.target
        return {"draft": self.draft is not None, "docs": self.docs is not None,
                "self": t is not None and t.skips is not None,
                "heads": t is not None and t.heads is not None}.get(runner, True)

    def for_request(self, mode: str, k: int | None, costs: CostModel, slot: int = 0) -> tuple[Drafter, Drafter, int]:
        """The request's drafter, its free fallback (what a limit forbidding model steps drafts with)
        and per-round proposal cap (k=None: sized from measured costs). `mode` is one the table marks
        batched (drafters/modes.py; the request parser refused the others)."""
        adaptive = k is None
        kit = self._kit(costs, slot)
        parts = modes.build_all(kit, modes.request_rows(mode), self._make(slot))
        d = parts.get(mode)
        if d is None:
            raise ValueError(f"draft={mode!r} has no batched drafter here")
        d.set_adaptive(adaptive)
        fallback = d
        if d.uses_model:
            fallback = parts.get(modes.FALLBACK)
            if fallback is None:
                fallback = modes.BY_NAME[modes.FALLBACK].build(kit)
                fallback.seed(self._learned.get(modes.FALLBACK))
                fallback.set_adaptive(adaptive)
        self._parts[d] = parts
        return d, fallback, 0 if mode == "none" else DEFAULT_K_CAP if k is None else k

    def _kit(self, costs: CostModel, slot: int) -> modes.Kit:
        dm, t = self.draft, self.target
        runners = {"draft": dm.slots[slot]} if dm is not None else {}
        target = None
        if t is not None:  # the drafters over the target's own slot: its hidden rows, its layer-skipped graph
            target = t.slots[slot]
            runners.update({"self": t.skips[slot] if t.skips is not None else None, "heads": t.heads})
        return modes.Kit(costs, self.usable, target=target, target_times=target.times if target is not None else None,
                         runners=runners, suffix_capacity=self.request_capacity,
                         vocab_map=dm.vocab_map if dm is not None else None,
                         bundle=t.bundle if t is not None else dm.bundle if dm is not None else None,
                         shared=self.history, recycle_table=self._table, docs=self.docs, docs_store=self._docs_store)

    def _make(self, slot: int):
        """How a request in `slot` gets a row's drafter: a per_slot row's is the slot's, built once
        (the draft model's cache, calibration and rate carry over); any other is built fresh and
        seeded with what the last finished request of its mode learned."""
        kept = self._kept.setdefault(slot, {})

        def make(row: modes.DraftMode, kit: modes.Kit):
            if row.per_slot:
                if row.name not in kept:
                    d = row.build(kit)
                    if d is None:
                        return None
                    kept[row.name] = d
                return kept[row.name]
            d = row.build(kit)
            if d is not None:
                d.seed(self._learned.get(row.name))
            return d

        return make

    def finished(self, drafter: Drafter, ctx: Sequence[int]) -> None:
        """A request ended (whatever its finish): its text joins the history, its drafters'
        evidence seeds the next request's of the same modes."""
        self.history.start_doc()
        self.history.extend(ctx)
        for name, d in self._parts.pop(drafter, {}).items():
            d.end(ctx)  # auto counts its reply's length
            ev = d.evidence()
            if ev is not None:
                self._learned[name] = ev

    def failed(self, slot: int, drafter: Drafter | None = None) -> None:
        """The slot's caches were reset (a failed pass): its kept drafters forget what they held,
        and the failed request's drafter is dropped (its text does not join the history)."""
        self._parts.pop(drafter, None)
        for d in self._kept.get(slot, {}).values():
            d.reset()

    def forget(self) -> None:
        """reset_cache(): no history, no learned estimates (auto keeps its replies' mean length)."""
        self.history.clear()
        # auto's replies' mean length describes the service, and survives
        self._learned = {n: ev.forgotten() for n, ev in self._learned.items() if isinstance(ev, AutoEvidence)}
        if self._table is not None:
            self._table.fill(-1)
        for kept in self._kept.values():
            for d in kept.values():
                d.forget()
                d.reset()
