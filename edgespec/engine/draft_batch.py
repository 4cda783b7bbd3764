"""The draft model drafting for several requests in one batched step.

A batched engine loads the draft model as a BatchRunner with one cache slot per request slot
(core/batch_runner.py). Each slot's ModelDrafter runs its ordinary drafting loop (drafters/model.py:
catch up, then one token at a time until its own confidence says stop) on a `DraftSlot`, one slot of
that runner behind ModelRunner's interface. In a round (engine/round.py) the proposals of every
request whose drafter steps a model are run by `DraftBatch.run`, each on a worker thread: a
DraftSlot's step then does not run alone but waits, and once every drafting request is waiting or
done, one batched step of the draft runs all their rows together, and each gets its logits back.

    requests A, B, C propose           A: catch-up [t, u]   B: [v]   C: [w]      -> one draft step
                                        A: [x1]  B: [y1]  (C stopped drafting)   -> one draft step
                                        A: [x2]  (B stopped)                      -> one (one row)

So a round costs as many draft steps as its longest proposal, not the sum of all of them. Which rows
share a step is decided by who is waiting, never by timing: every step waits for all drafting
requests to be waiting or done, so the grouping, and with the runners' deterministic mode every
row's logits, are the same on every run. A row of more than SHORT_ROW tokens (a prompt's catch-up)
runs alone: padding every other row to its length would make them all pay for it.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

import numpy as np

from ..core.batch_runner import BatchRunner, BatchSlot

SHORT_ROW = 4  # tokens: a catch-up longer than this (a prompt) runs alone rather than padding every row
T = TypeVar("T")


class DraftBatch:
    """Gathers the draft steps of concurrent proposal calls into batched steps (module docstring)."""

    def __init__(self, runner: BatchRunner):
        self.runner = runner
        self._cv = threading.Condition()
        self._local = threading.local()
        self._asks: dict[int, tuple[list[int], int]] = {}  # slot -> (tokens, n_logits), waiting for a step
        self._answers: dict[int, object] = {}  # slot -> logits [n_logits, V] or the step's exception
        self._live = 0  # calls of the running batch not yet returned
        self._pool: ThreadPoolExecutor | None = None

    def slot(self, i: int) -> "DraftSlot":
        return DraftSlot(self, i)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def run(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """Runs the calls (proposals), batching their draft steps; returns their results in order.
        A call's exception is raised here once every call has returned."""
        if len(calls) < 2:
            return [c() for c in calls]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.runner.slots, thread_name_prefix="edgespec-draft")
        with self._cv:
            self._live = len(calls)
        futures = [self._pool.submit(self._call, c) for c in calls]
        while True:
            with self._cv:
                self._cv.wait_for(lambda: len(self._asks) == self._live)
                if self._live == 0:
                    break
                asks, self._asks = self._asks, {}
            answers = self._steps(asks)
            with self._cv:
                self._answers.update(answers)
                self._cv.notify_all()
        return [f.result() for f in futures]

    def _call(self, c: Callable[[], T]) -> T:
        self._local.gather = True
        try:
            return c()
        finally:
            self._local.gather = False
            with self._cv:
                self._live -= 1
                self._cv.notify_all()

    def gathering(self) -> bool:
        """Whether this thread runs a call of a batch (its steps are gathered)."""
        return getattr(self._local, "gather", False)

    def ask(self, slot: int, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        """A call's draft step: waits for the batched step that runs it; logits [n_logits, V]."""
        with self._cv:
            self._asks[slot] = (list(tokens), n_logits)
            self._cv.notify_all()
            self._cv.wait_for(lambda: slot in self._answers)
            got = self._answers.pop(slot)
        if isinstance(got, BaseException):
            raise got
        return got

    def _steps(self, asks: dict[int, tuple[list[int], int]]) -> dict[int, object]:
        """The waiting rows: the short ones in one batched step, each long one alone."""
        out: dict[int, object] = {}
        short = {s: t for s, (t, _) in asks.items() if len(t) <= SHORT_ROW}
        groups = ([short] if short else []) + [{s: t} for s, (t, _) in asks.items() if len(t) > SHORT_ROW]
        for rows in groups:
            try:
                if len(rows) == 1:
                    ((s, t),) = rows.items()
                    got = {s: self.runner.step_one(s, t, asks[s][1]).copy()}
                else:
                    got = {s: x[len(x) - asks[s][1]:] for s, x in self.runner.step(rows).items()}
                out.update(got)
            except BaseException as e:  # noqa: BLE001 - the asking calls raise it
                out.update(dict.fromkeys(rows, e))
        return out


class DraftSlot(BatchSlot):
    """One slot of the draft BatchRunner behind ModelRunner's interface (what a ModelDrafter drafts
    on): inside `DraftBatch.run` its steps are gathered into batched ones, elsewhere (a warm-up) they
    run alone."""

    def __init__(self, batch: DraftBatch, slot: int):
        super().__init__(batch.runner, slot)
        self.batch = batch

    def step(self, tokens, n_logits: int = 1) -> np.ndarray:
        if self.batch.gathering():
            return self.batch.ask(self.slot, tokens, n_logits)
        return super().step(tokens, n_logits)
