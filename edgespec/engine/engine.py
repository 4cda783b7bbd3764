"""Engine: a bundle opened for generation — text in, text out, as the target alone would write it.

    eng = Engine.open("bundles/qwen-coder")         # draft="auto" | ... (drafters/modes.py), any Settings field
    r = eng.generate("def fib(n):", max_new_tokens=64)
    for delta in eng.stream(messages=[{"role": "user", "content": "hi"}], temperature=0.7, seed=1): ...

The engine owns the models, the drafters and the prefix cache, and lends them to the decode loop
(loop.py) one request at a time (a lock; the server queues in front of it). Its options are one
Settings (settings.py), checked once; build.plan turns them with the bundle and the board into the
Plan it is built from. Requests are checked and tokenized first (requests.py); the edge concerns are
consulted once, when the plan is made (build.py): a memory plan sizes the cache and decides whether the draft fits, a governor caps k or
drafting, or paces rounds, under a power or thermal limit.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Generator

from ..core.costmodel import CostModel
from ..core.slot import Slot
from ..drafters import Drafter, modes
from ..drafters.grammar import with_grammar
from ..errors import InvalidRequest, PromptTooLong
from ..knowledge.answer import Turn, declined, with_sources
from ..limits import DEFAULT_K_CAP
from ..models.bundle import Bundle
from . import build, selfdraft
from .build import Plan
from .loop import Parts, PrefixCache, decode
from .pinned import hold_slot
from .requests import Options, Prepared, Request, RequestParser, Vocabulary, as_prepared, not_loaded
from .results import GenerationResult, GenerationStats, Stream
from .sequence import Drafting
from .settings import Settings
from .tree_round import TreeVerifier, check_tree_possible
from .venue_rows import turn_ids

log = logging.getLogger("edgespec.engine")


class Engine:
    def __init__(self, plan: Plan, target: Slot, runners: dict[str, object], *,
                 governor=None):
        """The engine over runners already loaded for `plan` (Engine.open loads them): `runners`
        holds the draft model's ("draft"), the self-draft's ("self") and the draft heads' session
        ("heads") where loaded."""
        s = plan.settings
        bundle = plan.bundle
        self.settings = s
        # deterministic mode lives in the runners (core/runner.py); the request parser pins requests to
        # what keeps it (requests.pin_for_determinism)
        self.deterministic = s.deterministic
        self.bundle = bundle
        self.target = target
        self.draft_runner = runners.get("draft")
        self.self_runner = runners.get("self")  # the self-draft (engine/selfdraft.py), when loaded
        self.max_len = target.max_len
        self.model_name = bundle.name
        self.draft_mode = s.draft
        self.k = s.k
        self.tree_mode = s.tree
        self.governor = governor
        self.memory_plan = plan.memory
        self.prefill_chunk = plan.memory.prefill_chunk
        self.vocab = Vocabulary.of(bundle, bundle.load_tokenizer(), target.vocab_size)
        self.tokenizer = self.vocab.tokenizer
        self.usable, self.eos_ids = self.vocab.usable, self.vocab.eos_ids
        self.knowledge = open_knowledge(s, bundle, self.tokenizer, self.max_len)  # docs=INDEX: answers from documents, else None
        draft = self.draft_runner
        self.costs = CostModel(target.times, draft.times if draft is not None else None)
        # every mode the table can build with what is loaded (drafters/modes.py); the free drafters
        # learn across requests: the suffix index (bounded; reset_cache() clears it), the recycle table
        kit = modes.Kit(self.costs, self.usable, target, target.times, runners, s.suffix_capacity,
                        build.draft_vocab_map(bundle) if draft is not None else None, bundle,
                        docs=self.knowledge)
        self._drafters: dict[str, Drafter] = modes.build_all(kit)
        self._fallback = self._drafters[modes.FALLBACK]  # a power limit's free drafter (engine/round.py)
        self._tree = TreeVerifier(self.costs, target)
        self._cache = PrefixCache()
        self.pinned = None  # a PinnedPrefix (pinned.py): written back before a request that starts with it
        self.venue_rows = None  # a VenueRows (venue_rows.py): the cached reading's passages, copied in per turn
        self.repins_on_reload = False  # pinned.py hooked a re-pin to the documents' reloads
        self._lock = threading.Lock()
        self._parse = RequestParser(self.vocab, self.max_len, s, unavailable=self._unavailable,
                                    tree_check=self._check_tree_possible)

    # -- opening --------------------------------------------------------------------------------
    @classmethod
    def open(cls, bundle: str | os.PathLike | Bundle, settings: Settings | None = None, **options) -> "Engine":
        """Verifies the bundle (sha256 unless verify=False), plans memory, loads the models.

        `settings` (engine/settings.py), or its fields as keywords (checked by Settings.of, each bad
        value one named error, before the bundle is read):
        draft: the default drafting mode of requests (drafters/modes.py: auto, model, suffix, docs, recycle,
        ngram, self, none). Without "auto" or "model" the draft model is not loaded at all (less
        memory, faster start). "self" loads the self-draft instead (the target with layers skipped,
        on shared weights: engine/selfdraft.py); only an engine opened with it serves draft="self"
        requests, and its `auto` has the self-draft as one more option.
        max_len: the cache length; default: the bundle's (`export --max-context`) capped by the
        board's profile and the memory budget.
        suffix_capacity: tokens the suffix index keeps across requests (the oldest are evicted;
        the memory plan counts 244 bytes a token held, limits.suffix_memory_text: 244 MiB at the default).
        warmup: time the step sizes adaptive drafting chooses between once at open (about 1 s on
        a 2-core CPU), so the first request neither pays one-off allocations nor guesses costs.
        device: None (no board defaults), "auto" (this board, detected) or a profile name: its
        provider orders, threads, default memory budget and max_len fill what is left unset
        (docs/edge.md, "What --device sets"); explicit options always win.
        tree: the default tree verification of requests ("auto" | "on" | "off", docs/runtime.md)."""
        if settings is None:
            settings = Settings.of(**options)
        elif options:
            raise TypeError("Engine.open: pass either settings or keyword options, not both")
        if settings.batched:
            raise InvalidRequest("Engine serves one request at a time: open a BatchEngine for parallel > 1",
                                 param="parallel")
        return cls.from_plan(build.plan(settings, bundle))

    @classmethod
    def from_plan(cls, p: Plan) -> "Engine":
        """Loads the runners the plan names and builds the engine (both models on one shared thread
        pool: they take turns, and must not fight over cores)."""
        s, b = p.settings, p.bundle
        target = self_runner = None
        if "self" in p.runners:
            pair = selfdraft.open_for_engine(b, p.max_len, required=s.draft == "self", providers=p.providers,
                                             threads=p.threads, profile=p.profile, deterministic=s.deterministic)
            if pair is not None:
                target, self_runner = pair.target, pair.runner
        with_draft = "draft" in p.runners
        if target is None:
            target = build.load_runner(b.model_path("target"), b.target, p.max_len, providers=p.providers,
                                       threads=p.threads, shared_threads=with_draft, profile=p.profile,
                                       deterministic=s.deterministic)
        draft_runner = None
        if with_draft:
            draft_runner = build.load_runner(b.model_path("draft"), b.draft, p.max_len,
                                             providers=p.draft_providers if p.draft_providers is not None
                                             else p.providers, threads=p.threads, shared_threads=True,
                                             profile=p.profile)  # proposals only: the target decides every token
        heads = None  # draft heads (`export --heads`): a small graph over the target's hidden state
        if "heads" in p.runners and target.has_hidden:
            heads = build.load_heads_session(b.root / b.manifest.heads["path"])
        governor = build.governor(p, spinning=build.sessions_spin(with_draft))
        eng = cls(p, target, {"draft": draft_runner, "self": self_runner, "heads": heads}, governor=governor)
        if s.tree == "on":
            eng._check_tree_possible("on")
        if s.warmup and s.draft != "none":
            eng.warmup()
        return eng

    def close(self) -> None:
        with self._lock:
            if self.governor is not None:
                self.governor.close()
            self.target = None  # type: ignore[assignment]
            self.draft_runner = None
            self.self_runner = None
            self._drafters = {}

    @property
    def has_draft(self) -> bool:
        return self.draft_runner is not None

    slots = 1  # requests generating at once (server/served.ServedEngine): one

    @property
    def drafters(self) -> dict[str, Drafter]:
        """Every mode's drafter by name, as built at open (bench/lineage.py keeps their state())."""
        return dict(self._drafters)

    def drafter_stats(self) -> dict[str, dict]:
        """Each mode's drafter's stats() (server/served.ServedEngine: /metrics sums the suffix indexes'
        figures); read without the lock, as plain numbers."""
        return {name: d.stats() for name, d in list(self._drafters.items())}

    def cached(self) -> list[int]:
        """The tokens whose K/V the target cache holds now (what the next request can reuse)."""
        with self._lock:
            n = self.target.length if self.target is not None else 0
            return list(self._cache.tokens[:n])

    def hold(self, tokens: list[int], rows=None):
        """Makes the target cache hold exactly `tokens` (a pinned prefix, pinned.py) and returns the
        snapshot of their rows (Slot.snapshot; None when the cache is not on the host):
        `rows` written back when given (ValueError, the cache untouched, when they do not fit it),
        else what the cache lacks of `tokens` prefilled. Waits for a running request."""
        with self._lock:
            return hold_slot(self.target, self._cache, tokens, rows, self.pinned, self.prefill_chunk)

    def compute_venue_rows(self, rows) -> None:
        """Computes a venue's passages' rows (venue_rows.py) after the base the target cache holds
        (the pinned prefix). Waits for a running request."""
        with self._lock:
            rows.compute(self.target, self._cache, self.pinned, self.prefill_chunk)

    # -- the public calls -------------------------------------------------------------------------
    def generate(self, prompt: str | None = None, **options) -> GenerationResult:
        """The whole answer at once; options as stream's."""
        s = self.stream(prompt, **options)
        for _ in s:
            pass
        assert s.result is not None
        return s.result

    def prepare(self, prompt: str | None = None, **options) -> Prepared:
        """Everything a request needs before it runs, on the caller's thread: the documents' turn
        read (a chat request, with docs=INDEX), the options checked and the prompt tokenized (bad
        input raises here). The options (messages, max_new_tokens, temperature, top_p, top_k, seed,
        stop, draft, k, cancel, tree, json_schema, grammar, tools, tool_choice, strict) are
        requests.Options': tree verification of the drafts (docs/runtime.md), structured output
        (docs/structured-output.md: the result's tool_calls holds a tool call)."""
        return prepare_request(self.knowledge, Options(prompt=prompt, **options), self._parse, self.count_tokens,
                               self.max_len)

    def stream(self, prompt: str | Prepared | None = None, **options) -> Stream:
        """A request prepared (prepare()), or prepared now from the prompt and options (bad input
        raises here, before anything runs); generation runs as the stream is iterated."""
        p = as_prepared(prompt, options, self.prepare)
        turn, req = p.turn, p.request
        if req is None:
            return Stream(declined(turn, self.tokenizer, GenerationResult, GenerationStats), 0)
        blocks = turn_ids(self, p)  # the cached reading (venue_rows.py), or None: quoted
        if blocks is not None:
            req = dataclasses.replace(req, ids=blocks[1])
        gen = self._run(req, blocks[0] if blocks is not None else ())
        return Stream(gen if turn is None else with_sources(gen, turn), len(req.ids))

    def count_tokens(self, prompt: str | None = None, *, messages=None) -> int:
        return len(self.vocab.encode(prompt, messages))

    def encode(self, prompt: str | None = None, *, messages=None) -> list[int]:
        """The token ids a request with this prompt or these messages starts from."""
        return self.vocab.encode(prompt, messages)

    def warmup(self, k_max: int = 4) -> None:
        """Runs each step size up to k_max + 1 tokens twice (the first run of a shape pays one-off
        allocations, the second is what the cost model keeps), so the first request is not slowed
        by them and adaptive drafting starts from this device's real costs."""
        with self._lock:
            self._invalidate()
            for s in range(1, min(k_max + 1, self.max_len - 1) + 1):
                for _ in range(2):
                    self.target.rewind(0)
                    self.target.step([0] * s, s)  # as a verify: every row scored
            for d in self._drafters.values():  # the draft model's, the self-draft's, the heads' steps
                d.warmup()
            self._invalidate()

    def reset_cache(self) -> None:
        """Forgets what the caches hold, so the next request prefills its whole prompt, and what the
        free drafters learned from earlier requests (the suffix index, the recycle table): benchmarks
        use this to time every mode from the same start. Waits for a running request."""
        with self._lock:
            self._invalidate()
            for d in self._drafters.values():
                d.forget()

    # -- requests ---------------------------------------------------------------------------------
    def _check_tree_possible(self, mode: str) -> None:
        """tree="on" on a graph that cannot run trees is refused with the fix; "auto" just chains."""
        check_tree_possible(mode, self.target, self.bundle.name)

    def _unavailable(self, mode: str) -> str | None:
        """Why `mode` cannot run on this engine (None: it can): its runner was not loaded."""
        return None if mode in self._drafters else not_loaded(mode, self.bundle, self.draft_mode)

    def _drafting(self, req: Request) -> Drafting:
        """The request's drafter (under its grammar: the forced tokens first), the free fallback and
        the per-round proposal cap. k=None lets the drafter choose each round from measured costs (up
        to DEFAULT_K_CAP); a given k is used as is."""
        drafter = self._drafters[req.draft]
        k_cap = 0
        if req.draft != "none":
            drafter.set_adaptive(req.k is None)
            k_cap = DEFAULT_K_CAP if req.k is None else req.k
        drafter = with_grammar(drafter, req.constraint, self._drafters.get("grammar"))
        return Drafting(drafter, self._fallback, k_cap)

    def _end(self, ctx) -> None:
        """A request ended, whatever mode ran it: every drafter hears its text (the suffix index keeps it)."""
        for d in self._drafters.values():
            d.end(ctx)

    def _invalidate(self) -> None:
        """Forget what the caches hold (after an error mid-step, or a warm-up)."""
        self._cache.clear()
        if self.target is not None:
            self.target.reset()
        for d in self._drafters.values():
            d.reset()

    # -- the loop ---------------------------------------------------------------------------------
    def _run(self, req: Request, blocks: tuple[int, ...] = ()) -> Generator[str, None, GenerationResult]:
        with self._lock:
            if self.target is None:
                raise InvalidRequest("this engine is closed", param=None)
            drafting = self._drafting(req)
            if self.pinned is not None:
                self.pinned.restore(req.ids, self.target, self._cache)
            if blocks:  # the cached reading: the passages' rows copied in after the pinned base
                self.venue_rows.arrange(self.target, self._cache, req.ids, blocks)
            parts = Parts(self.target, self.vocab, self.prefill_chunk, governor=self.governor, tree=self._tree,
                          on_end=self._end)
            try:
                return (yield from decode(parts, req, drafting, self._cache))
            except GeneratorExit:
                # the stream was closed between rounds (a client pressed Stop): every cache is
                # consistent there, so the next turn reuses what this one prefilled and generated
                raise
            except BaseException:
                self._invalidate()
                raise


def open_knowledge(s: Settings, bundle, tokenizer, max_len: int):
    """The documents an engine opened with docs=INDEX answers from (None without): the serial engine
    and the batched one (batch.py) open them alike."""
    if s.docs is None:
        return None
    from ..knowledge.answer import Knowledge

    return Knowledge.open(s.docs, bundle, tokenizer, max_len=max_len)


def prepare_request(knowledge, o: Options, parse, count_tokens, max_len: int) -> Prepared:
    """Both engines' prepare(): the documents' turn read (read_documents), then the options parsed
    and tokenized, unless the documents declined the turn. The documents' reload count is taken
    before the turn is read, so a reload after it is seen when the request runs."""
    read = knowledge.generation if knowledge is not None else None
    o, turn = read_documents(knowledge, o, count_tokens, max_len)
    return Prepared(o, None if turn is not None and turn.declined else parse(o), turn, read)


def read_documents(knowledge, o: Options, count_tokens, max_len: int) -> tuple[Options, Turn | None]:
    """A chat request without tools answered from documents (knowledge/answer.py): (the options to
    generate from, with the passages in the last user turn; the Turn, None when the request does not
    read documents). The room left for passages is the cache less the conversation and some answer.
    Both engines prepare a request here, so it reads the same prompt at every --parallel. A declined
    turn's options are the request's own: the caller answers it without the model."""
    if knowledge is None or o.messages is None or o.tools:
        return o, None
    n = count_tokens(messages=o.messages)
    if n >= max_len:  # too long before any passage: refused as it is without documents, not declined
        raise PromptTooLong(n, o.max_new_tokens, max_len)
    turn = knowledge.turn(o.messages, max_len - n - min(o.max_new_tokens, 128))
    return (o if turn.declined else dataclasses.replace(o, messages=turn.messages)), turn
