"""What the server asks of an engine: the seam its tests fake.

`edgespec.engine.Engine` provides every member below (at any --parallel: one engine with `slots`
cache slots), so the handlers and the scheduler read them directly (never a private name, never
getattr). A request is prepared once, by the handler (`prepare`: documents read, options checked,
prompt tokenized); the scheduler's worker submits its Prepared and runs the engine's rounds
(scheduler.py), and the loader's warm-up is one `generate` before the worker starts (service.py).
The server tests' fake engine implements this same Protocol and returns the real result types
(Ticket, GenerationResult), so a fake cannot drift from what the server reads.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from ..engine.requests import Prepared
from ..engine.results import GenerationResult, Ticket


class ServedEngine(Protocol):
    model_name: str
    max_len: int
    slots: int  # requests that generate at once (--parallel)
    last_batch: int  # requests verified in the last round's target pass (for /metrics)
    docs: Any  # docs.answer.Docs: the documents it answers from (--docs), else None
    pinned: Any  # engine.pinned.PinnedPrefix: the pinned system prompt (--system-prompt), else None
    governor: Any  # edge.governor.Governor: the power/thermal governor, else None

    def drafter_stats(self) -> dict[str, dict]:
        """Each drafter's stats() by name (drafters/base.py): plain numbers, read without locks."""

    def prepare(self, prompt: str | None = None, **options) -> Prepared:
        """The request ready to run (its `prompt_tokens`): bad input raises InvalidRequest naming
        the parameter (PromptTooLong for a prompt the cache cannot hold)."""

    def count_tokens(self, prompt: str | None = None, *, messages=None) -> int: ...

    def submit(self, prompt: Prepared, *, on_delta: Callable[[str], None] | None = None,
               on_start: Callable[[], None] | None = None) -> Ticket:
        """The request joins at the next round; `on_delta(text)` is called from the thread running
        the rounds. The ticket's `done` is set once its `result` (or `error`) is there: at return
        already for a turn the documents declined."""

    def round(self) -> bool:
        """One round: admit waiting requests to free slots, check each one's `cancel`, one prefill
        chunk or one verified target pass for the batch. False when nothing is left to do."""

    def generate(self, prompt: str | None = None, **kw) -> GenerationResult:
        """The warm-up's one request, run to its end on the caller's thread."""

    def close(self) -> None: ...
