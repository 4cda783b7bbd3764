"""The engine's core: continuous batching with speculation over one ModelRunner with a slot per
request (`parallel` slots, 1 by default). Engine (engine.py) opens it and is its synchronous face;
a server's worker drives it directly.

    eng = Engine.open("bundles/qwen-coder", parallel=4)         # any Settings field (engine/settings.py)
    t1 = eng.submit("def fib(n):", max_new_tokens=64)           # validated and tokenized now
    t2 = eng.submit(messages=[...], temperature=0.7, seed=1)
    while eng.round(): pass                                     # a server's worker: round() in its thread
    t1.result, t2.result                                        # GenerationResult, as Engine.generate's

A round (one call of `round()`):
1. admit: waiting requests take free slots, preferring the slot whose cache holds the longest
   prefix of the prompt (a returning conversation); the slot is rewound to that prefix;
2. cancelled requests (client gone, timeout, shutdown) leave and free their slot;
3. prefill: one chunk of the oldest request still reading its prompt: at most `prefill_chunk`
   tokens (BATCH_PREFILL_CHUNK) while other requests are generating, so they keep streaming while a
   long prompt is read; the plan's chunk (`plan_chunk`) while none is, and then the whole prompt in
   this round, which ends with its first token (a caller waiting on the round streams it before any
   decode pass);
4. decode: every generating request proposes (its own drafter, its own k from the cost model
   priced at this batch size), the round's width is chosen for the batch as a whole (round_shape.py:
   the pass is as wide as its longest row; adaptive rows are cut to the width with the most expected
   tokens per second, which is no drafting when drafting does not pay), one target pass verifies all
   their chains (a tree, below, alone on its slot), and each request accepts (speculative.py's accept functions, its own RNG) and rewinds
   its own slot.
Requests join and leave between rounds. Every request in the batch gets the tokens it would get
alone: greedy rows are the target's argmax whatever their neighbours, and a sampled request draws
from its own seeded RNG in the same order as it would alone when its drafter proposes the same
tokens (a fixed k, or no drafting; not "suffix", whose batch keeps the finished requests' history
apart from the request's own text, so its proposals, and with them a sampled reply, may differ:
each is an exact sample all the same); bitwise with `deterministic=True` (without, a padded 1-token
row may flip a near-tie).

Drafting in a batch: every mode of drafters/modes.py, each request with drafters of its own
(batch_drafters.py: what they share, what a slot keeps); the draft model's steps run batched
(draft_batch.py), the self-draft's too; each slot's drafting is priced every round at the round's
batch width (batch_drafters.price: the verify, the draft model's step, the self-draft's step).

Trees: with one slot, every request gets the slot's TreeVerifier, priced by the slot's cost model
(the target's and the draft's step times), so tree="auto" trees when the cost model says a tree
pays. With several, a tree="on" request's rounds are
trees, each verified alone on its slot by the slot's TreeVerifier (priced at the slot's one-row
steps), beside the round's one batched pass of the other requests' chains (round.py); tree="auto"
there runs chains (a tree's pass of its own is not priced beside the other rows).

warmup() (from_plan, when settings.warmup) times the target's steps up to k_max + 1 tokens at every
batch width, the draft model's and the self-draft's batched steps, and every slot's kept drafters'
(their warmup()), then forgets every cache. cached() is slot 0's tokens, and
drafter_state() / load_drafter_state() what the drafters have learnt (the bench's lineages).

Documents (docs=INDEX): a chat turn gets its passages through prepare.read_documents, a declined one is answered at submit, without a slot. A pinned system prompt
and the cached reading go through the pin flow (pinned.pin_system_prompt; pin() here):
the prompt's rows are computed once, kept as one snapshot and copied into every free slot
(`hold`); a request admitted to a slot that lost them (another request overwrote it) and that starts
with the prompt gets them back by a memory copy. The cached
reading's passages' rows (venue_rows.py) are computed once in one slot (`compute_venue_rows`: a
block's positions are the same in every slot) and a turn that qualifies (venue_rows.turn_ids) has its passages copied into its slot at admission and prefills only its
question; the others are quoted and prefilled. `hold` and `compute_venue_rows` (also a reload's
re-pin, while requests run) take a slot no request holds, between rounds: admission leaves one free
for them while they wait.

Requests are parsed once, by the RequestParser (requests.py), and each lives its life in its slot
(sequence.py: prefix reuse, prefill, first token, next k, the stop/emit step, final stats); what is
the engine's own is here: slots, admission, chunk order.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from ..core.runner import ModelRunner
from ..core.costmodel import CostModel
from ..core.proposal import common_prefix
from ..drafters import Drafter
from ..drafters.grammar import with_grammar
from ..errors import InvalidRequest
from ..docs.answer import Turn, declined, sourced
from ..limits import PREFILL_CHUNK
from . import build, selfdraft
from .build import Plan
from .prepare import open_docs, prepare_request
from .pinned import PinnedPrefix, hold_slot, pin_system_prompt
from .requests import Options, Prepared, Request, RequestParser, Vocabulary, as_prepared, not_loaded
from .results import GenerationResult, GenerationStats, Stream, Ticket
from .batch_drafters import BatchDrafters, DraftModel, TargetSlots
from .draft_batch import DraftBatch
from .round import Conditions, run_round
from .sequence import Drafting, PrefixCache, Sequence, unstarted
from .tree_round import TreeVerifier, check_tree_possible
from .venue_rows import VenueRows, turn_ids

log = logging.getLogger("edgespec.batch")

BATCH_PREFILL_CHUNK = 128  # prompt tokens per round while other requests are generating


@dataclass
class _Active:
    ticket: Ticket
    req: Request
    t0: float  # when it was submitted
    slot: int = -1
    seq: Sequence | None = None  # its life in the slot (engine/sequence.py), from admission on
    built: Drafter | None = None  # the drafter batch_drafters built for it (before a grammar wraps it)
    costs: CostModel | None = None
    turn: Turn | None = None  # the documents' turn it answers (its result carries the sources)
    tree: TreeVerifier | None = None  # its slot's verifier (tree_round.py): one slot's, or tree="on"
    blocks: tuple[int, ...] = ()  # a turn of the cached reading: its passages, copied in at admission ...
    rows: VenueRows | None = None  # ... from these rows (the engine's when it was submitted)


class BatchEngine:
    def __init__(self, plan: Plan, runner: ModelRunner, *, governor=None, draft: ModelRunner | None = None,
                 prefill_chunk: int = BATCH_PREFILL_CHUNK, self_pair=None, heads=None):
        """The engine over ModelRunners already loaded for `plan` (Engine.open loads
        them): the target's, and the draft model's (as many slots) when the plan loads it;
        self_pair: the target's runner's self-draft (engine/selfdraft.SelfPair), heads: the draft
        heads' session, when loaded."""
        self.settings = plan.settings
        self.bundle = plan.bundle
        self.runner = runner
        self.slots = runner.slots
        self.governor = governor
        self.memory_plan = plan.memory
        self.model_name = plan.bundle.name
        self.plan_chunk = max(1, plan.memory.prefill_chunk or PREFILL_CHUNK)
        self.prefill_chunk = min(max(1, prefill_chunk), self.plan_chunk)  # while other requests are generating
        self.vocab = Vocabulary.of(plan.bundle, plan.bundle.load_tokenizer(), runner.vocab_size)
        self.docs = open_docs(plan.settings, plan.bundle, self.vocab.tokenizer, runner.max_len)  # docs=INDEX
        self.pinned: PinnedPrefix | None = None  # serve --system-prompt (pinned.py): its rows kept once
        self.venue_rows: VenueRows | None = None  # the cached reading's passages (venue_rows.py), copied in per turn
        self.repins_on_reload = False  # pinned.py hooked a re-pin to the documents' reloads
        self._parse = RequestParser(self.vocab, runner.max_len, plan.settings, unavailable=self._unavailable,
                                    tree_check=self._check_tree)
        self._cached = [PrefixCache() for _ in range(self.slots)]  # what each slot's cache holds
        self._slots = [runner.slot(i) for i in range(self.slots)]  # each slot as one sequence (core/slot.py)
        self._work = threading.Lock()  # a round, or hold / compute_venue_rows on free slots: one at a time
        self._reserved = 0  # slots admission leaves free for a hold or compute_venue_rows waiting for one
        # a verifier per slot, made at the slot's first request that gets one and kept (what it learnt of
        # runners-up): one slot's every request (see _verifier), several slots' tree="on" requests
        self._trees: dict[int, TreeVerifier] = {}
        self._waiting: deque[_Active] = deque()
        self._active: dict[int, _Active] = {}  # slot -> request
        self._cv = threading.Condition()
        self._ids = 0
        self.rounds = 0
        self.last_batch = 0  # rows in the last decode round (for /metrics)
        # each request's drafters, and what they share; the draft model's steps batched across requests
        self._draft_batch = DraftBatch(draft) if draft is not None else None
        dm = None
        if draft is not None:
            dm = DraftModel([self._draft_batch.slot(i) for i in range(self.slots)], draft.times.table(1),
                            build.draft_vocab_map(plan.bundle), plan.bundle)
        self.self_pair = self_pair  # keeps the shared weights alive as long as the engine
        skips = [self_pair.skip(i) for i in range(self.slots)] if self_pair is not None else None
        target = TargetSlots(self._slots, plan.bundle, skips, heads)
        self._drafters = BatchDrafters(plan.settings.suffix_capacity, runner.max_len, usable=self.vocab.usable,
                                       draft=dm, docs=self.docs, target=target,
                                       times=runner.times.table(1))

    # -- opening --------------------------------------------------------------------------------
    @classmethod
    def from_plan(cls, p: Plan) -> "BatchEngine":
        s, b = p.settings, p.bundle
        runner, pair = selfdraft.open_target(p, s.parallel)  # with the self-draft where the mode loads it
        heads = None
        if "heads" in p.runners and runner.has_hidden:  # read each slot's hidden rows (batch_drafters.py)
            heads = build.load_heads_session(b.root / b.manifest.heads["path"])
        draft = None
        if "draft" in p.runners:  # a cache slot per request slot; proposals only: the target decides
            draft = build.load_model(b.model_path("draft"), b.draft, p.max_len, slots=s.parallel,
                                     providers=p.draft_providers if p.draft_providers is not None
                                     else p.providers, threads=p.threads, profile=p.profile, shared_threads=True,
                                     deterministic=s.deterministic)
        governor = build.governor(p, spinning=build.sessions_spin("draft" in p.runners))
        be = cls(p, runner, governor=governor, draft=draft, self_pair=pair, heads=heads)
        be._check_tree(s.tree)
        if s.warmup:
            be.warmup()
        return be

    @property
    def max_len(self) -> int:
        return self.runner.max_len

    @property
    def target(self):
        """Slot 0 of the target's runner (core/slot.Slot): what the pin flow (pinned.py) reads the
        graph's facts and the cache's row shapes from, the same in every slot. Steps run on the slots
        the rounds choose, never through this."""
        return self._slots[0]

    def cached(self) -> list[int]:
        """The tokens whose K/V slot 0 holds now (with one slot: what the next request can reuse)."""
        with self._work:
            return list(self._cached[0].tokens[: self._slots[0].length])

    def warmup(self, k_max: int = 4) -> None:
        """Times the target's steps of 1..k_max + 1 tokens twice at every batch
        width (the first run of a shape pays one-off allocations, the second is what the cost model
        keeps; one slot: slot 0's), the draft model's and the self-draft's
        batched steps at every width (several slots), every slot's kept drafters' warmup(); then every
        cache is forgotten (each slot empty, the drafters' caches reset). Only between requests."""
        with self._work, self._cv:
            if self._active or self._waiting:
                raise InvalidRequest("warmup() while requests are running: wait for them to end", param=None)
            self.runner.warmup(max_s=min(k_max + 1, self.max_len - 1))
            if self.slots > 1:  # one slot: its drafters' own warmup() below times the same steps
                if self._draft_batch is not None:
                    self._draft_batch.runner.warmup(max_s=2)  # a draft step is 1 token, 2 with a catch-up
                if self.self_pair is not None:
                    self.self_pair.skips.warmup(max_s=1)  # it never catches up
            self._drafters.warmup(self.slots)
            self._forget_caches()

    def _forget_caches(self) -> None:
        """Every slot empty, and what the drafters held of it forgotten (their learning kept)."""
        self.runner.reset()
        if self._draft_batch is not None:
            self._draft_batch.runner.reset()
        for c in self._cached:
            c.clear()
        self._drafters.reset()

    def drafter_state(self):
        """What the drafters have learnt (batch_drafters.BatchDrafters.state: the evidence by mode, the
        recycle table, each slot's kept drafters'), for load_drafter_state: the bench's lineages
        (bench/lineage.py) let each mode learn as if it were the engine's only one."""
        with self._work:
            return self._drafters.state()

    def load_drafter_state(self, state) -> None:
        """Back to what drafter_state() returned (the shared history of finished requests is not in it)."""
        with self._work:
            self._drafters.load_state(state)

    def draft_slot(self, i: int):
        """Slot i of the draft model's runner (core/slot.Slot), None when the draft is not loaded."""
        return self._draft_batch.slot(i) if self._draft_batch is not None else None

    def count_tokens(self, prompt=None, *, messages=None) -> int:
        return len(self.vocab.encode(prompt, messages))

    def encode(self, prompt=None, *, messages=None) -> list[int]:
        """The token ids a request with this prompt or these messages starts from (as Engine.encode)."""
        return self.vocab.encode(prompt, messages)

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def drafter_stats(self) -> dict[str, dict]:
        """The shared history's index figures and each active request's drafter's stats() (as
        Engine.drafter_stats: /metrics sums the suffix indexes' figures); read without the lock."""
        from ..drafters.suffix import index_figures

        out: dict[str, dict] = {"history": index_figures(self._drafters.history)}
        for slot, a in list(self._active.items()):
            if a.built is not None:
                out[f"slot {slot}"] = a.built.stats()
        return out

    # -- requests ---------------------------------------------------------------------------------
    def prepare(self, prompt: str | None = None, **options) -> Prepared:
        """Everything a request needs before it runs, on the caller's thread (bad input raises here):
        the options (requests.Options: messages, max_new_tokens, temperature, top_p, top_k, seed,
        stop, draft, k, cancel, tree, json_schema, grammar, tools, tool_choice, strict) checked and
        the prompt tokenized; tree "on" verifies that request's rounds as trees on its slot; "auto"
        trees when the cost model says a tree pays with one slot, and runs chains with several. With
        documents (docs=INDEX) a chat turn reads its passages first (prepare.prepare_request)."""
        return prepare_request(self.docs, Options(prompt=prompt, **options), self._parse, self.count_tokens,
                               self.max_len)

    def submit(self, prompt: str | Prepared | None = None, *, on_delta: Callable[[str], None] | None = None,
               on_start: Callable[[], None] | None = None, **options) -> Ticket:
        """A request prepared (prepare()), or prepared now from the prompt and options (bad input
        raises here); it joins at the next round. on_delta(text) is called from the batch thread for
        each text delta, on_start() when the request takes a slot. A turn the documents declined is
        done on return, without the model; the others' results carry their sources."""
        p = as_prepared(prompt, options, self.prepare)
        turn, req = p.turn, p.request
        if req is None:
            return self._declined(turn, on_delta)
        rows = self.venue_rows  # what turn_ids reads: a reload may replace it meanwhile (see _start)
        reading = turn_ids(self, p)  # the cached reading (venue_rows.py)
        blocks = ()
        if reading is not None:
            blocks, ids = reading
            req = dataclasses.replace(req, ids=ids)
        else:
            rows = None
        with self._cv:
            self._ids += 1
            t = Ticket(self._ids, len(req.ids), on_delta, on_start)
            self._waiting.append(_Active(t, req, time.perf_counter(), turn=turn, blocks=blocks, rows=rows))
            self._cv.notify_all()
        return t

    def _declined(self, turn: Turn, on_delta) -> Ticket:
        """A turn the documents decline: its answer streamed and its ticket done now (docs/answer.py)."""
        s = Stream(declined(turn, self.vocab.tokenizer, GenerationResult, GenerationStats), 0)
        for delta in s:
            if on_delta is not None:
                on_delta(delta)
        with self._cv:
            self._ids += 1
            t = Ticket(self._ids, 0, on_delta, result=s.result)
        t.done.set()
        return t

    def pin(self, system: str | None, *, save_dir=None) -> PinnedPrefix | None:
        """`serve --system-prompt` (and the documents' system turn: a whole venue read in the cache, or
        the cached reading's base and passages): pinned.pin_system_prompt on this engine (its hold
        fills every free slot). Requests are not changed: a
        conversation starts with the prompt when it sends it (the kiosk page does). Only while no
        request is admitted or waiting (a reload's re-pin, which runs any time, waits for a free slot)."""
        with self._cv:
            if self._active or self._waiting:
                raise InvalidRequest("pin() while requests are running: pin before serving", param=None)
        return pin_system_prompt(self, system, save_dir=save_dir)

    def hold(self, tokens: list[int], rows=None):
        """A pinned prefix (pinned.py): every slot no request holds gets exactly `tokens`,
        the first by `rows` written back (ValueError when they do not fit) or prefilled, the others
        from its snapshot (a memory copy; prefilled each where the cache is not on the host). Returns
        the snapshot (None: not on the host). Waits for a free slot (see the module docstring)."""
        with self._free_slots() as free:
            for slot in free:
                rows = hold_slot(self._slots[slot], self._cached[slot], tokens, rows, self.pinned, self.plan_chunk)
        log.info("pinned prefix: %d tokens in each of %d free slots", len(tokens), len(free))
        return rows

    def compute_venue_rows(self, rows: VenueRows) -> None:
        """The cached reading (venue_rows.py): the passages' rows computed once, in one free slot,
        after the pinned base (any slot's rows: a block's positions are the same in each)."""
        with self._free_slots() as free:
            slot = free[0]
            rows.compute(self._slots[slot], self._cached[slot], self.pinned, self.plan_chunk)

    @contextmanager
    def _free_slots(self) -> Iterator[list[int]]:
        """The slots no request holds (at least one), with no round running while the caller uses them.
        While it waits for one, admission leaves a slot free, so a running batch's next ending frees it."""
        with self._cv:
            self._reserved += 1
        try:
            with self._cv:
                self._cv.wait_for(lambda: len(self._active) < self.slots)
            with self._work:  # admission (in a round) cannot take the free slot meanwhile: it is reserved
                yield [s for s in range(self.slots) if s not in self._active]
        finally:
            with self._cv:
                self._reserved -= 1
                self._cv.notify_all()

    def close(self) -> None:
        if self.governor is not None:
            self.governor.close()

    def _check_tree(self, mode: str) -> None:  # "on" on a graph that cannot run trees: refused by name
        check_tree_possible(mode, self._slots[0], self.bundle.name)

    def _unavailable(self, mode: str) -> str | None:
        """Why `mode` cannot run here (None: it can): the draft model was not loaded."""
        return None if self._drafters.available(mode) else not_loaded(mode, self.bundle, self.settings.draft)

    def reset_cache(self) -> None:
        """Every slot's cache and the n-gram evidence earlier
        requests left are forgotten. Only between requests: refused while any is admitted or waiting."""
        with self._work, self._cv:
            if self._active or self._waiting:
                raise InvalidRequest("reset_cache() while requests are running: wait for them to end", param=None)
            self.runner.reset()
            for c in self._cached:
                c.clear()
            self._drafters.forget()

    def round(self) -> bool:
        """One round (see the module docstring). Returns False when nothing is left to do."""
        with self._work:
            return self._round()

    def _round(self) -> bool:
        self._admit()
        for a in list(self._active.values()):
            if a.req.cancel():
                a.seq.stop("cancelled")
                self._end(a)
        prefilling = [a for a in self._active.values() if not a.seq.decoding]
        if prefilling:
            first = min(prefilling, key=lambda x: x.ticket.id)
            alone = not any(a.seq.decoding for a in self._active.values())
            self._guard(first, self._prefill_chunk, first)
            if alone:
                # nobody is generating: the whole prompt is read now, and the round ends with its first
                # token, so a caller waiting on this round (Engine.stream) has it before any decode pass
                while first.slot in self._active and not first.seq.decoding:
                    self._guard(first, self._prefill_chunk, first)
                with self._cv:
                    return bool(self._active or self._waiting)
        decoding = [a for a in self._active.values() if a.seq.decoding]
        if decoding:
            try:
                self._decode_round(decoding)
            except Exception as e:  # noqa: BLE001 - a failed pass fails the requests in it, not the worker
                log.exception("a batched verify failed")
                for a in decoding:
                    self._fail(a, e)
        with self._cv:
            return bool(self._active or self._waiting)

    def _guard(self, a: _Active, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001
            log.exception("request %s failed", a.ticket.id)
            self._fail(a, e)

    # -- admission and prefill --------------------------------------------------------------------
    def _admit(self) -> None:
        with self._cv:
            while self._waiting and len(self._active) < self.slots - self._reserved:
                a = self._waiting.popleft()
                if a.req.cancel():  # gone while waiting
                    a.ticket.result = unstarted(a.req, self.vocab, a.t0)
                    a.ticket.done.set()
                    continue
                free = [s for s in range(self.slots) if s not in self._active]
                # the slot holding the longest prefix of this prompt (a returning conversation)
                slot = max(free, key=lambda s: (common_prefix(self._cached[s].tokens, a.req.ids), -s))
                a.slot = slot
                self._active[slot] = a
                self._start(a)
                if a.ticket.on_start is not None:
                    a.ticket.on_start()

    def _start(self, a: _Active) -> None:
        req, cache, view = a.req, self._cached[a.slot], self._slots[a.slot]
        pin, rows = self.pinned, self.venue_rows
        if pin is not None:  # the slot lost the pinned prefix (another request overwrote it): copied back
            pin.restore(req.ids, view, cache)
        if a.blocks and a.rows is rows and pin is not None and pin.tokens == rows.base:
            rows.arrange(view, cache, req.ids, a.blocks)  # the cached reading: its passages' rows copied in
        # else (a reload replaced the rows after it was submitted) its assembled tokens are prefilled
        a.costs = self._drafters.costs(a.slot)
        d, fallback, k_cap = self._drafters.for_request(req.draft, req.k, a.costs, a.slot)
        a.built = d
        drafter = with_grammar(d, req.constraint)  # under a grammar: its forced tokens first
        drafting = Drafting(drafter, drafter if fallback is d else fallback, k_cap)
        a.tree = self._verifier(a)
        a.seq = Sequence(req, view, cache.tokens, drafting, self.vocab, self.governor, slot=a.slot, tree=a.tree,
                         t0=a.t0)
        cache.tokens = a.seq.ctx  # the slot holds ctx[:length] from here on

    def _verifier(self, a: _Active) -> TreeVerifier | None:
        """The slot's tree verifier for the request (None: chains). One slot: every request's, priced by
        the slot's cost model (the target's and the draft's steps), so tree="auto" trees where a tree
        pays. Several: tree="on" requests' only, priced at the slot's
        one-row steps (a tree runs alone: its pass is not priced beside the other rows)."""
        if self.slots > 1 and a.req.tree != "on":
            return None
        return self.tree_verifier(a.slot)

    def tree_verifier(self, slot: int = 0) -> TreeVerifier:
        """The slot's tree verifier, made at its first use and kept (what it learnt of runners-up)."""
        tv = self._trees.get(slot)
        if tv is None:
            view = self._slots[slot]
            costs = self._drafters.costs(slot) if self.slots == 1 else CostModel(view.times)
            tv = self._trees[slot] = TreeVerifier(costs, view)
        return tv

    def _prefill_chunk(self, a: _Active) -> None:
        """One chunk of its prompt: the batch's while others are generating (they keep streaming), the
        plan's while none is (fewer, larger passes)."""
        others = any(x is not a and x.seq.decoding for x in self._active.values())
        self._deliver(a, a.seq.prefill(self.prefill_chunk if others else self.plan_chunk))

    # -- decoding ---------------------------------------------------------------------------------
    def _deliver(self, a: _Active, deltas: list[str]) -> None:
        """Streams a request's text deltas; ends it when a stop condition hit (sequence.py)."""
        if a.ticket.on_delta is not None:
            for delta in deltas:
                a.ticket.on_delta(delta)
        if a.seq.decoding and not a.seq.running():
            self._end(a)

    def _decode_round(self, decoding: list[_Active]) -> None:
        """One round (engine/round.py) for every generating request; its tokens through each one's
        stop/emit step."""
        lo, hi = self.runner.pass_range([a.slot for a in decoding])
        table = self.runner.times.pricing(hi - lo)
        # a draft step carries every request drafting with a model: the draft model's, the self-draft's
        drafting = [a.slot for a in decoding if a.seq.part.drafter.uses_model]
        draft = self._step_pricing(self._draft_batch.runner if self._draft_batch is not None else None, drafting)
        own = self._step_pricing(self.self_pair.skips if self.self_pair is not None else None, drafting)
        for a in decoding:
            # drafters size proposals at this batch's verify cost and its draft steps'
            self._drafters.price(a.slot, table, draft, own)
            a.seq.next_k()
        trees = {a.slot: a.tree for a in decoding if a.tree is not None}
        cond = Conditions(self.vocab.usable, self.governor, trees, pass_seconds=CostModel(table).verify)
        rounds = run_round(self.runner, [a.seq.part for a in decoding], cond)
        self.rounds += 1
        self.last_batch = len(decoding)
        for a, r in zip(decoding, rounds):
            a.seq.batch_sizes.append(len(decoding))
            self._deliver(a, a.seq.take(r))

    @staticmethod
    def _step_pricing(runner: ModelRunner | None, slots: list[int]):
        """The step table a batched draft step over `slots` of `runner` is priced from (its width's, or
        one row's until that width has run); None without the runner."""
        if runner is None:
            return None
        lo, hi = runner.pass_range(slots) if slots else (0, 1)
        return runner.times.pricing(hi - lo)

    # -- leaving ------------------------------------------------------------------------------------
    def _end(self, a: _Active) -> None:
        self._leave(a)
        tail = a.seq.tail()
        if tail and a.ticket.on_delta is not None:
            a.ticket.on_delta(tail)
        self._drafters.finished(a.built, a.seq.ctx)  # later requests draft from its text and estimates
        result = a.seq.result()
        a.ticket.result = result if a.turn is None else sourced(result, a.turn)
        a.ticket.done.set()

    def _leave(self, a: _Active) -> None:
        """Frees its slot (a hold waiting for one hears it)."""
        with self._cv:
            if a.slot in self._active and self._active[a.slot] is a:
                del self._active[a.slot]
            self._cv.notify_all()

    def abandon(self, ticket: Ticket, error: BaseException) -> None:
        """The request leaves now, between rounds, failed with `error`, and its slot's cache is forgotten:
        what its caller does when an exception other than a clean close ends its stream (a half-read
        answer's text must not seed the next turn as if it were whole). Nothing when it already ended."""
        with self._work:
            with self._cv:
                gone = [a for a in self._waiting if a.ticket is ticket]
                for a in gone:
                    self._waiting.remove(a)
                gone += [a for a in self._active.values() if a.ticket is ticket]
            for a in gone:
                self._fail(a, error)

    def _fail(self, a: _Active, e: BaseException) -> None:
        self._leave(a)
        if a.slot >= 0:  # the slot's cache may be half-written: forget it
            self.runner.reset(a.slot)
            self._drafters.failed(a.slot, a.built)
            self._cached[a.slot].clear()
        a.ticket.error = e
        a.ticket.done.set()
