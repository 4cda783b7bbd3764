"""What the server asks of an engine: the seam its tests fake.

`edgespec.engine.Engine` and `edgespec.engine.batch.BatchEngine` both provide every member below with the
same meaning, so the handlers read them directly (never a private name); what a scheduler
drives beyond them is its own engine's (Engine.stream for scheduler.py, BatchEngine.submit and round
for batch_scheduler.py). A request is prepared once, by the handler (`prepare`: documents read,
options checked, prompt tokenized), and its Prepared is what the scheduler hands the engine to run.
The server tests' fake engine implements this same Protocol and returns the real result types, so a
fake cannot drift from what the handlers read.
"""
from __future__ import annotations

from typing import Any, Iterator, Protocol

from ..engine.requests import Prepared
from ..engine.results import GenerationResult


class ServedStream(Protocol):
    """Iterate for text deltas; `result` once iteration has ended."""

    def __iter__(self) -> Iterator[str]: ...

    @property
    def result(self) -> GenerationResult | None: ...


class ServedEngine(Protocol):
    model_name: str
    max_len: int
    slots: int  # requests that generate at once (1: the serial engine; BatchEngine: --parallel)
    knowledge: Any  # knowledge.answer.Knowledge: the documents it answers from (--docs), else None
    pinned: Any  # engine.pinned.PinnedPrefix: the pinned system prompt (--system-prompt), else None
    governor: Any  # edge.governor.Governor: the power/thermal governor, else None

    def drafter_stats(self) -> dict[str, dict]:
        """Each drafter's stats() by name (drafters/base.py): plain numbers, read without locks."""

    def prepare(self, prompt: str | None = None, **options) -> Prepared:
        """The request ready to run (its `prompt_tokens`): bad input raises InvalidRequest naming
        the parameter (PromptTooLong for a prompt the cache cannot hold)."""

    def count_tokens(self, prompt: str | None = None, *, messages=None) -> int: ...

    def stream(self, prompt: Prepared | str | None = None, **options) -> ServedStream:
        """A Prepared run as it is (or a prompt and options prepared first)."""

    def generate(self, prompt: str | None = None, **kw) -> GenerationResult: ...

    def close(self) -> None: ...
