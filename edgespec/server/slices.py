"""Work that is not generation but runs on the engine's worker thread, in slices between generation's
rounds (POST /v1/embeddings): the one way to give it a bounded share of a small board's cores.

Why not a thread of its own: on two cores an embedding model running beside a streaming chat takes
the cores the target's pass needs, and every token waits (measured before this queue: 4 embedding
requests doubled a stream's median token gap). onnxruntime's pool threads cannot be given a lower
priority from Python, and a session on the process's shared pool competes with the target inside it.
On the worker thread, a slice never runs at the same time as a target pass; while a request
generates, one slice runs after every SLICE_EVERY-th round, so at most one gap in
SLICE_EVERY is longer and a stream's median token gap stays what it is alone. With no generation
waiting, slices run back to back, and a new generation request waits for one slice at most.

A job is a generator: each `next()` does one slice of work; its return value is the answer. Jobs
wait in a bounded queue (429 past it, as generation's does) and run one at a time.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Generator

from .apierror import APIError

log = logging.getLogger(__name__)

SLICE_EVERY = 3  # while a request generates: one slice after every third round


@dataclass
class SliceJob:
    """One request's work: `work` yields once per slice and returns the answer, which (or the exception it
    raised) is set on `future` in the event loop."""

    work: Generator[None, None, Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    created: float = field(default_factory=time.monotonic)
    started: float | None = None
    slices: int = 0
    cancelled: bool = False  # the handler stopped waiting (timeout): its slices are skipped

    def settle(self, value: Any = None, error: BaseException | None = None) -> None:
        def _set() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(value)

        try:
            self.loop.call_soon_threadsafe(_set)
        except RuntimeError:  # the loop is closed: nobody is waiting
            pass


class SliceQueue:
    """Bounded: `max_queue` jobs wait while one runs. `cv` is the worker's condition variable (the
    scheduler's), notified when work arrives so an idle worker wakes for it."""

    def __init__(self, name: str, max_queue: int, cv: threading.Condition):
        self.name = name
        self.max_queue = max_queue
        self._cv = cv
        self._queue: deque[SliceJob] = deque()
        self.current: SliceJob | None = None
        self._accepting = True
        self._job_seconds = 1.0  # moving average of a job's run time, for Retry-After

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def pending(self) -> bool:
        return self.current is not None or bool(self._queue)

    def retry_after(self) -> int:
        return int(min(60, max(1, round(self._job_seconds * (1 + self.depth)))))

    def full_error(self) -> APIError:
        return APIError(429, f"the {self.name} queue is full ({self.max_queue} waiting, one running); retry later",
                        code="queue_full", headers={"Retry-After": str(self.retry_after())})

    def check_room(self) -> None:
        """429 now, before the body is read, when a job could not wait (the body would be read for nothing)."""
        if not self._accepting:
            raise APIError(503, "the server is shutting down; retry against the restarted service",
                           code="shutting_down", headers={"Retry-After": "5"})
        if len(self._queue) >= self.max_queue and self.current is not None:
            raise self.full_error()

    def submit(self, job: SliceJob) -> None:
        with self._cv:
            self.check_room()
            if len(self._queue) >= self.max_queue + (self.current is None):
                raise self.full_error()
            self._queue.append(job)
            self._cv.notify_all()

    def run_one(self) -> bool:
        """Runs one slice of the current job (taking the next one when none runs); False when there was
        nothing to run. Called by the worker thread only."""
        with self._cv:
            while self.current is None or self.current.cancelled:
                if self.current is not None:  # the handler gave up on it
                    self.current.work.close()
                    self.current = None
                if not self._queue:
                    return False
                self.current = self._queue.popleft()
            job = self.current
        if job.started is None:
            job.started = time.monotonic()
        try:
            next(job.work)
            job.slices += 1
            return True
        except StopIteration as done:
            job.settle(done.value)
        except Exception as e:  # noqa: BLE001 - every failure goes back to its request, the worker lives on
            if not isinstance(e, (ValueError, APIError)):
                log.exception("%s job failed", self.name)
            job.settle(error=e)
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * (time.monotonic() - job.started)
        with self._cv:
            self.current = None
        return True

    def drain(self) -> None:
        """Shutdown: refuse new jobs and answer every job not yet finished with 503."""
        with self._cv:
            self._accepting = False
            jobs = list(self._queue) + ([self.current] if self.current is not None else [])
            self._queue.clear()
        for job in jobs:
            job.cancelled = True
            job.settle(error=APIError(503, "the server is shutting down before this request finished; retry",
                                      code="shutting_down", headers={"Retry-After": "5"}))
