"""Several requests at once: continuous batching with speculation over one BatchRunner.

    be = BatchEngine.open("bundles/qwen-coder", parallel=4)     # or BatchEngine(engine, runner)
    t1 = be.submit("def fib(n):", max_new_tokens=64)            # validated and tokenized now
    t2 = be.submit(messages=[...], temperature=0.7, seed=1)
    while be.round(): pass                                      # or be.run(): a worker thread
    t1.result, t2.result                                        # GenerationResult, as Engine's

A round (one call of `round()`):
1. admit: waiting requests take free slots, preferring the slot whose cache holds the longest
   prefix of the prompt (a returning conversation); the slot is rewound to that prefix;
2. cancelled requests (client gone, timeout, shutdown) leave and free their slot;
3. prefill: one chunk (at most `prefill_chunk` tokens) of the oldest request still reading its
   prompt, so the requests already generating keep streaming while a long prompt is read;
4. decode: every generating request proposes (its own drafter, its own k from the cost model
   priced at this batch size), the round's width is chosen for the batch as a whole (round_shape.py:
   the pass is as wide as its longest row; adaptive rows are cut to the width with the most expected
   tokens per second, which is no drafting when drafting does not pay), one target pass verifies all
   their rows, and each request accepts (speculative.py's accept functions, its own RNG) and rewinds
   its own slot.
Requests join and leave between rounds. Every request in the batch gets the tokens it would get
alone: greedy rows are the target's argmax whatever their neighbours, and a sampled request draws
from its own seeded RNG in the same order as it would alone (with a fixed k or no drafting);
bitwise with `deterministic=True` (without, a padded 1-token row may flip a near-tie).

Drafting in a batch (batch_drafters.py): "none", "ngram", "suffix" (a shared history of finished
requests plus the request's own text) and "auto" choosing between the suffix index and nothing, each
request with its own drafters. The draft model has one cache and is not batched: with several slots
it is not loaded, and `draft="model"` (like "self" and "recycle") is refused (serve one client at a
time for it).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ..core.batch_runner import BatchRunner, SlotRunner
from ..core.costmodel import CostModel
from ..core.detokenize import TextStream
from ..core.proposal import EMPTY, common_prefix
from ..core.sampling import choose, make_rng
from ..core.speculative import accept_greedy, accept_sampled
from ..drafters import Drafter, NoDrafter
from ..errors import InvalidRequest
from ..limits import SUFFIX_CAPACITY
from . import build
from .engine import Engine
from .requests import Request, check_draft_mode, check_k
from .results import GenerationResult, GenerationStats
from .batch_drafters import BatchDrafters, check_batched_mode, check_batched_tree
from .batch_ticket import Ticket
from .round_shape import RowPlan, choose_width

log = logging.getLogger("edgespec.batch")

BATCH_PREFILL_CHUNK = 128  # prompt tokens per round while other requests are generating


def auto_slots(bundle, *, max_len=None, device=None, memory_budget=None) -> int:
    """`--parallel auto`: as many slots as the memory plan fits after the weights (memory.py's
    slots_that_fit), at most memory.MAX_AUTO_SLOTS. The budget is the given one, else the device
    profile's, else 80 % of what the kernel reports available now."""
    from ..models.bundle import Bundle

    edge = build.edge_options(device, None, None, None, memory_budget, None, None)
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, verify=False)
    plan = build.memory_plan(b, max_len=max_len, want_draft=False, profile=edge["profile"],
                             budget=edge["memory_budget"])
    return build.parallel_slots(b, plan)


@dataclass
class _Active:
    ticket: Ticket
    req: Request
    slot: int = -1
    ctx: list[int] = field(default_factory=list)
    filled: int = 0  # prompt tokens in the slot's cache (prefill progress)
    out: list[int] = field(default_factory=list)
    text: TextStream | None = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    rng: np.random.Generator | None = None
    drafter: Drafter = field(default_factory=NoDrafter)
    costs: CostModel | None = None
    k_cap: int = 0
    t0: float = 0.0
    t_first: float = 0.0
    decoding: bool = False
    finish: str | None = None
    mark: object = None


class BatchEngine:
    def __init__(self, engine: Engine, runner: BatchRunner, *, prefill_chunk: int = BATCH_PREFILL_CHUNK,
                 suffix_capacity: int = SUFFIX_CAPACITY):
        self.engine = engine
        self.runner = runner
        self.slots = runner.slots
        self.prefill_chunk = max(1, min(prefill_chunk, engine.prefill_chunk))
        self._cached: list[list[int]] = [[] for _ in range(self.slots)]  # what each slot's cache holds
        self._waiting: deque[_Active] = deque()
        self._active: dict[int, _Active] = {}  # slot -> request
        self._cv = threading.Condition()
        self._ids = 0
        self._stopping = False
        self.rounds = 0
        self.last_batch = 0  # rows in the last decode round (for /metrics)
        self._drafters = BatchDrafters(suffix_capacity, runner.max_len)  # each request's drafters, and what they share

    # -- opening --------------------------------------------------------------------------------
    @classmethod
    def open(cls, bundle, *, parallel: int, draft: str = "auto", k: int | None = None, max_len: int | None = None,
             providers=None, threads: int | None = None, device=None, memory_budget=None, power_budget=None,
             max_temp=None, verify: bool = True, warmup: bool = True,
             suffix_capacity: int = SUFFIX_CAPACITY, tree: str = "auto", deterministic: bool = False) -> "BatchEngine":
        """Loads the target with `parallel` cache slots (no draft model: see the module docstring).
        suffix_capacity: tokens of finished requests the shared suffix history keeps (batch_drafters.py).
        deterministic: tokens independent of the batch and the slot's cache (docs/runtime.md)."""
        from ..models.bundle import Bundle

        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise InvalidRequest(f"parallel must be an integer >= 1, got {parallel!r}", param="parallel")
        check_draft_mode(draft)
        check_batched_mode(draft)
        check_batched_tree(tree)
        check_k(k)
        edge = build.edge_options(device, providers, None, threads, memory_budget, power_budget, max_temp)
        b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, verify=verify)
        plan = build.memory_plan(b, max_len=max_len, want_draft=False, profile=edge["profile"],
                                 budget=edge["memory_budget"])
        max_len = plan.max_len
        runner = build.load_batch_runner(b.model_path("target"), b.target, max_len, parallel,
                                         providers=edge["providers"], threads=edge["threads"], profile=edge["profile"],
                                         deterministic=deterministic)
        governor = build.governor(edge, spinning=True)
        # the engine validates and tokenizes; batched requests draft with BatchDrafters, so its own
        # suffix index is the smallest there is
        eng = Engine(b, SlotRunner(runner, 0), None, b.load_tokenizer(), draft_mode=draft, k=k,
                     governor=governor, memory_plan=plan, suffix_capacity=16)
        if warmup:
            runner.warmup()
        return cls(eng, runner, suffix_capacity=suffix_capacity)

    @property
    def max_len(self) -> int:
        return self.runner.max_len

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def governor(self):
        return self.engine.governor

    def count_tokens(self, prompt=None, *, messages=None) -> int:
        return self.engine.count_tokens(prompt, messages=messages)

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # -- requests ---------------------------------------------------------------------------------
    def submit(self, prompt: str | None = None, *, messages=None, max_new_tokens: int = 256, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, seed: int | None = None, stop=None, draft: str | None = None,
               k: int | None = None, cancel=None, on_delta: Callable[[str], None] | None = None,
               on_start: Callable[[], None] | None = None, tree: str | None = None) -> Ticket:
        """Validates and tokenizes now (bad input raises here); the request joins at the next round.
        Batched rounds are chains: tree "auto" and "off" run them, "on" is refused."""
        check_batched_mode(draft)
        check_batched_tree(tree)
        req = self.engine._request(prompt, messages, max_new_tokens, temperature, top_p, top_k, seed, stop, draft,
                                   k, cancel)
        check_batched_mode(req.draft)
        with self._cv:
            self._ids += 1
            t = Ticket(self._ids, len(req.ids), on_delta, on_start)
            a = _Active(t, req, t0=time.perf_counter())
            self._waiting.append(a)
            self._cv.notify_all()
        return t

    def generate(self, prompt: str | None = None, **kw) -> GenerationResult:
        """One request, run to its end on this thread (only while no worker thread runs rounds)."""
        t = self.submit(prompt, **kw)
        while self.round():
            pass
        return t.wait(0)

    def close(self) -> None:
        self.stop()
        self.engine.close()

    def generate_many(self, requests: list[dict]) -> list[GenerationResult]:
        """Submits every request (dicts of submit's keyword arguments) and runs rounds until all end."""
        tickets = [self.submit(**r) for r in requests]
        while self.round():
            pass
        return [t.wait(0) for t in tickets]

    # -- the worker -----------------------------------------------------------------------------
    def run(self, idle_wait: float = 0.5) -> None:
        """Runs rounds until `stop()`; sleeps on a condition while nothing is active."""
        while True:
            with self._cv:
                while not self._waiting and not self._active and not self._stopping:
                    self._cv.wait(idle_wait)
                if self._stopping and not self._waiting and not self._active:
                    return
            self.round()

    def reset_cache(self) -> None:
        """Engine.reset_cache for the batch: every slot's cache and the n-gram evidence earlier
        requests left are forgotten. Only between requests: refused while any is admitted or waiting."""
        with self._cv:
            if self._active or self._waiting:
                raise InvalidRequest("reset_cache() while requests are running: wait for them to end", param=None)
            self.runner.reset()
            self._cached = [[] for _ in range(self.slots)]
            self._drafters.forget()

    def stop(self) -> None:
        """The worker returns once every admitted and waiting request has ended."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    def round(self) -> bool:
        """One round (see the module docstring). Returns False when nothing is left to do."""
        self._admit()
        for a in list(self._active.values()):
            if a.req.cancel():
                self._end(a, "cancelled")
        prefilling = [a for a in self._active.values() if not a.decoding]
        if prefilling:
            first = min(prefilling, key=lambda x: x.ticket.id)
            self._guard(first, self._prefill_chunk, first)
            # alone (nothing generating), finish the prompt now: nobody waits for its chunks
            while first.slot in self._active and not first.decoding and not any(
                    x.decoding for x in self._active.values()):
                self._guard(first, self._prefill_chunk, first)
        decoding = [a for a in self._active.values() if a.decoding]
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
            while self._waiting and len(self._active) < self.slots:
                a = self._waiting.popleft()
                if a.req.cancel():  # gone while waiting
                    a.ticket.batch_sizes = []
                    self._finish(a, "cancelled")
                    continue
                free = [s for s in range(self.slots) if s not in self._active]
                # the slot holding the longest prefix of this prompt (a returning conversation)
                slot = max(free, key=lambda s: (common_prefix(self._cached[s], a.req.ids), -s))
                a.slot = slot
                self._active[slot] = a
                self._start(a)
                if a.ticket.on_start is not None:
                    a.ticket.on_start()

    def _start(self, a: _Active) -> None:
        req, eng = a.req, self.engine
        a.rng = make_rng(req.params.seed)
        a.stats = GenerationStats(prompt_tokens=len(req.ids), drafter=req.draft)
        gov = eng.governor
        a.mark = gov.mark() if gov is not None and hasattr(gov, "mark") else None
        reuse = min(common_prefix(self._cached[a.slot], req.ids), len(req.ids) - 1, self.runner.lengths[a.slot])
        a.stats.cached_tokens = reuse
        self.runner.rewind(a.slot, reuse)
        a.ctx = list(req.ids)
        self._cached[a.slot] = a.ctx  # the slot holds ctx[:length] from here on
        a.filled = reuse
        a.costs = CostModel(self.runner.times.table(1))
        a.drafter, a.k_cap = self._drafters.for_request(req.draft, req.k, a.costs)

    def _prefill_chunk(self, a: _Active) -> None:
        end = min(len(a.ctx), a.filled + self.prefill_chunk)
        t0 = time.perf_counter()
        row = self.runner.step_one(a.slot, a.ctx[a.filled : end], 1)[0]
        a.stats.prefill_s += time.perf_counter() - t0
        a.filled = end
        if end < len(a.ctx):
            return
        a.stats.target_passes = 1
        a.drafter.begin(a.ctx)
        first = choose(row, a.req.params, self.engine.usable, a.rng)
        a.ctx.append(first)
        a.t_first = time.perf_counter()
        a.stats.ttft_s = a.t_first - a.t0
        a.text = TextStream(self.engine.tokenizer, a.req.ids, a.req.stop)
        a.decoding = True
        self._emit(a, [first])

    # -- decoding ---------------------------------------------------------------------------------
    def _emit(self, a: _Active, tokens: list[int]) -> None:
        """Streams a round's tokens until a stop condition; ends the request when one hits."""
        eng = self.engine
        for t in tokens:
            if t in eng.eos_ids:
                return self._end(a, "stop")
            a.out.append(t)
            delta = a.text.push(t)
            if delta and a.ticket.on_delta is not None:
                a.ticket.on_delta(delta)
            if a.text.stopped:
                return self._end(a, "stop")
            if len(a.out) >= a.req.max_new_tokens:
                return self._end(a, "length")
        if self.runner.free(a.slot) < 1:  # the newest token needs a position
            return self._end(a, "cache_full")
        return None

    def _decode_round(self, decoding: list[_Active]) -> None:
        eng, usable = self.engine, self.engine.usable
        gov = eng.governor
        lim = gov.limits() if gov is not None else None
        lo, hi = self.runner.pass_range([a.slot for a in decoding])
        table = self.runner.times.pricing(hi - lo)
        rows: dict[int, list[int]] = {}
        props = {}
        for a in decoding:
            a.costs.target = table
            free = self.runner.free(a.slot)
            k = min(a.k_cap, free - 1, a.req.max_new_tokens - len(a.out) - 1)
            drafter = a.drafter
            if lim is not None:
                if lim.max_k is not None:
                    k = min(k, lim.max_k)
                if lim.drafting == "none":
                    k = 0
            k = max(0, k)
            prop = drafter.propose(a.ctx, k, a.req.params, a.rng) if k > 0 else EMPTY
            draft = prop.tokens[:k]
            for i, t in enumerate(draft):  # ids past the usable vocabulary can never be accepted
                if not 0 <= t < usable:
                    draft = draft[:i]
                    break
            props[a.slot] = (prop, draft)
        self._shape(decoding, props, CostModel(table))
        for a in decoding:
            rows[a.slot] = [a.ctx[-1], *props[a.slot][1]]
        out = self.runner.step(rows)
        self.rounds += 1
        self.last_batch = len(decoding)
        n_tokens = 0
        for a in decoding:
            prop, draft = props[a.slot]
            logits = out[a.slot]
            base = len(a.ctx) - 1
            if a.req.params.greedy:
                n, nxt = accept_greedy(logits, draft, usable)
            else:
                n, nxt = accept_sampled(logits, prop, draft, a.req.params, a.rng, usable)
            self.runner.rewind(a.slot, base + 1 + n)
            a.drafter.feedback(prop, n, base + 1 + n)
            new = draft[:n] + [nxt]
            a.ctx.extend(new)
            st = a.stats
            st.target_passes += 1
            st.rounds += 1
            st.drafted += len(draft)
            st.accepted += n
            st.rounds_by_source[prop.source] = st.rounds_by_source.get(prop.source, 0) + 1
            a.ticket.batch_sizes.append(len(decoding))
            n_tokens += len(new)
            self._emit(a, new)
        if gov is not None:
            gov.on_tokens(n_tokens)
            if lim is not None and lim.pace_s > 0:
                time.sleep(lim.pace_s)

    def _shape(self, decoding: list[_Active], props: dict, costs: CostModel) -> None:
        """Cuts the adaptive rows to the round's width (round_shape.py): the pass is as wide as its
        longest row, so the width is chosen for the batch, not by each request alone."""
        plans = [RowPlan(len(props[a.slot][1]), props[a.slot][0].accept or None, a.req.k is not None)
                 for a in decoding]
        keep = choose_width(plans, costs.verify) - 1
        for a in decoding:
            prop, draft = props[a.slot]
            if a.req.k is None and len(draft) > keep:
                props[a.slot] = (replace(prop, tokens=draft[:keep], accept=prop.accept[:keep]), draft[:keep])

    # -- leaving ------------------------------------------------------------------------------------
    def _end(self, a: _Active, finish: str) -> None:
        if a.slot in self._active and self._active[a.slot] is a:
            del self._active[a.slot]
        if a.text is not None:
            tail = a.text.finish()
            if tail and a.ticket.on_delta is not None:
                a.ticket.on_delta(tail)
        self._drafters.finished(a.drafter, a.ctx)  # later requests draft from its text and estimates
        self._finish(a, finish)

    def _finish(self, a: _Active, finish: str) -> None:
        now = time.perf_counter()
        st = a.stats
        st.new_tokens = len(a.out)
        st.total_s = now - a.t0
        if st.drafted:
            st.acceptance_rate = st.accepted / st.drafted
        if st.target_passes:
            st.tokens_per_pass = len(a.out) / st.target_passes
        if st.rounds:
            st.k_mean = st.drafted / st.rounds
        if a.ticket.batch_sizes:
            st.batch_size_mean = sum(a.ticket.batch_sizes) / len(a.ticket.batch_sizes)
        if len(a.out) > 1 and a.t_first and now > a.t_first:
            st.decode_tokens_per_second = (len(a.out) - 1) / (now - a.t_first)
        gov = self.engine.governor
        if a.mark is not None and gov is not None:
            try:
                st.energy_j_per_token = gov.j_per_token_since(a.mark)
            except Exception:  # noqa: BLE001 - a sensor read failing must not fail the request
                st.energy_j_per_token = None
        text = a.text.text if a.text is not None else ""
        a.ticket.result = GenerationResult(text, list(a.out), finish, st)
        a.ticket.done.set()

    def _fail(self, a: _Active, e: BaseException) -> None:
        if a.slot in self._active and self._active[a.slot] is a:
            del self._active[a.slot]
        if a.slot >= 0:  # the slot's cache may be half-written: forget it
            self.runner.reset(a.slot)
            self._cached[a.slot] = []
        a.ticket.error = e
        a.ticket.done.set()
