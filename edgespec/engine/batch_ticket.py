"""A batched request's handle: what the server's scheduler holds while the batch generates it."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from .results import GenerationResult


@dataclass(eq=False)  # compared and hashed by identity: a scheduler keys its jobs by ticket
class Ticket:
    """A request's handle. `on_delta(text)` is called from the batch thread for each text delta;
    `done` is set once `result` (or `error`) is there."""

    id: int
    prompt_tokens: int
    on_delta: Callable[[str], None] | None = None
    on_start: Callable[[], None] | None = None  # called when it takes a slot (its prompt starts being read)
    result: GenerationResult | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    batch_sizes: list[int] = field(default_factory=list)  # rows verified with it, per decode round

    def wait(self, timeout: float | None = None) -> GenerationResult:
        if not self.done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result
