"""Engine: a bundle opened for generation — text in, text out, as the target alone would write it.

    eng = Engine.open("bundles/qwen-coder")         # draft="auto" | ... (drafters/modes.py), any Settings field
    r = eng.generate("def fib(n):", max_new_tokens=64)
    for delta in eng.stream(messages=[{"role": "user", "content": "hi"}], temperature=0.7, seed=1): ...

There is one engine: the batched one (batch.py), with `parallel` cache slots (1 unless asked). This
class is its synchronous face, as vLLM's `LLM` sits on its engine core: `generate` and `stream`
submit one request and run the engine's rounds on the caller's thread until that request is done.
Several threads may call them at once; one of them runs each round, and every request admitted
rides in it, so at parallel=N they share the target's passes. A server runs the same engine's
rounds on its worker instead (server/scheduler.py: submit, then round).

Its options are one Settings (settings.py), checked once; build.plan turns them with the bundle and
the board into the Plan it is built from (the memory plan, the governor, what is loaded).
"""
from __future__ import annotations

import dataclasses
import os
import threading
from collections import deque
from typing import Generator

from ..drafters import modes
from ..models.bundle import Bundle
from . import build
from .batch import BatchEngine
from .requests import Prepared, as_prepared
from .results import GenerationResult, Stream, Ticket
from .settings import Settings


class Engine(BatchEngine):
    """The engine, with `generate` and `stream` for a caller that waits for its answer."""

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
        parallel: cache slots, the requests that generate at once (1).
        max_len: the cache length; default: the bundle's (`export --max-context`) capped by the
        board's profile and the memory budget.
        suffix_capacity: tokens the suffix history keeps across requests (the oldest are evicted;
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
        return cls.from_plan(build.plan(settings, bundle))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._driving = threading.Lock()  # one caller runs a round at a time; the others' requests ride in it

    @property
    def has_draft(self) -> bool:
        """Whether the draft model is loaded (draft "auto" or "model" at open)."""
        return self._unavailable("model") is None

    def modes(self) -> list[str]:
        """The drafting modes this engine serves: the rows of drafters/modes.py whose runner was loaded."""
        return [m.name for m in modes.MODES if self._unavailable(m.name) is None]

    def auto_sources(self) -> list[str]:
        """What `auto` chooses between here, in its order of preference (drafters/modes.py auto_rank)."""
        served = set(self.modes())
        return [r.name for r in modes.request_rows("auto")[1:] if r.name in served]

    def slot_drafters(self, slot: int = 0) -> dict:
        """The drafters a slot keeps across its requests, by mode (the draft model's, recycle's, the
        self-draft's, the heads': drafters/modes.py per_slot; built now where none was yet); a
        request's other drafters are its own (batch_drafters.py)."""
        return self._drafters.kept(slot, build=True)

    @property
    def history(self):
        """The suffix history (drafters/suffix_index.SuffixIndex): every finished request's text, one
        document each, what suffix drafting copies from (engine/batch_drafters.py)."""
        return self._drafters.history

    @property
    def draft_runner(self):
        """Slot 0 of the draft model's runner (core/slot.Slot), None when it is not loaded: what
        measure.py fills to its end and a test reads the graph's facts from."""
        return self.draft_slot(0)

    @property
    def deterministic(self) -> bool:
        """Bitwise-repeatable kernels in every runner (core/runner.py; settings.deterministic)."""
        return self.settings.deterministic

    @property
    def tokenizer(self):
        return self.vocab.tokenizer

    # -- the public calls -------------------------------------------------------------------------
    def generate(self, prompt: str | Prepared | None = None, **options) -> GenerationResult:
        """The whole answer at once; options as stream's."""
        s = self.stream(prompt, **options)
        for _ in s:
            pass
        assert s.result is not None
        return s.result

    def stream(self, prompt: str | Prepared | None = None, **options) -> Stream:
        """A request prepared (prepare()), or prepared now from the prompt and options (bad input
        raises here, before anything runs); it is submitted at the first iteration, and the engine's
        rounds run as the stream is iterated. Closing the stream early (a client pressed Stop)
        cancels the request at the next round, run then; its slot keeps what it prefilled and
        generated for the next turn. Any other exception thrown into the stream fails the request
        and forgets its slot's cache."""
        p = as_prepared(prompt, options, self.prepare)
        closed = threading.Event()
        if p.request is not None:
            asked = p.request.cancel
            p = dataclasses.replace(p, request=dataclasses.replace(p.request,
                                                                   cancel=lambda: closed.is_set() or asked()))
        return Stream(self._follow(p, closed), p.prompt_tokens)

    def _follow(self, p: Prepared, closed: threading.Event) -> Generator[str, None, GenerationResult]:
        """The request's deltas as the rounds write them, then its result (or its error, raised)."""
        deltas: deque[str] = deque()
        ticket = self.submit(p, on_delta=deltas.append)
        try:
            while not ticket.done.is_set():
                self._drive(ticket)
                while deltas:
                    yield deltas.popleft()
        except GeneratorExit:
            closed.set()  # seen at the next round, which ends the request between rounds
            while not ticket.done.is_set():
                self._drive(ticket)
            raise
        except BaseException as e:  # thrown in at a yield (an interrupt): the request fails, its cache goes
            self.abandon(ticket, e)
            raise
        while deltas:
            yield deltas.popleft()
        return ticket.wait(0)

    def _drive(self, ticket: Ticket) -> None:
        """One round, unless another caller's round has just finished this request."""
        with self._driving:
            if not ticket.done.is_set():
                self.round()
