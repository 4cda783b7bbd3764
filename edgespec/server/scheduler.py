"""Generation: one worker thread runs the engine's rounds; requests wait in a bounded queue and take
one of the engine's slots (`--parallel`, 1 by default) as soon as one is free, between rounds.

Why a thread and not the event loop: a round blocks for a whole target pass (tens of ms to seconds
on a Pi), which would freeze every other connection, /health and the watchdog. The engine calls each
job's `on_delta` from this thread, which posts the text back to the event loop with
`call_soon_threadsafe`, so the HTTP side never touches the models: it only calls the engine's
`prepare` (the tokenizer, the documents' index), and the worker submits the Prepared a job carries.

One worker at every --parallel, 1 included: the engine is one (a batch of `slots` requests), so is
the loop that drives it, and what a request sees (queueing, cancellation, errors) does not depend on
the slot count.

Cancellation is cooperative: each job carries a `should_stop()` that the engine calls at every
round, so a client that goes away, a per-request timeout or a shutdown frees its slot within one
pass; the other jobs keep generating.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .apierror import APIError
from .slices import SLICE_EVERY, SliceQueue
from .validate import GenRequest

log = logging.getLogger(__name__)

# why a job was cancelled (Job.cancel_reason)
CLIENT_GONE = "client_disconnected"
TIMEOUT = "timeout"
SHUTDOWN = "shutdown"


@dataclass
class Job:
    """One request on its way through the queue. Events posted to `events` (in the loop):
    ("start", None) · ("delta", str) · ("done", GenerationResult) · ("error", Exception)."""

    id: str
    request: GenRequest
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic() after which the engine is asked to stop
    timeout: float = 0.0  # the request timeout the deadline came from (for messages)
    prompt_tokens: int = 0
    prepared: Any = None  # the engine's Prepared (ServedEngine.prepare): what the worker runs
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    created: float = field(default_factory=time.monotonic)  # request arrival (for time to first token)
    queued: float | None = None  # when it entered the queue (for queue wait)
    started: float | None = None
    first_delta: float | None = None
    finished: float | None = None
    cancel_reason: str | None = None
    _cancel: threading.Event = field(default_factory=threading.Event)

    def cancel(self, reason: str) -> None:
        if not self._cancel.is_set():
            self.cancel_reason = reason
            self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def should_stop(self) -> bool:
        """The engine's `cancel` callable: checked before every target pass."""
        if not self._cancel.is_set() and time.monotonic() >= self.deadline:
            self.cancel(TIMEOUT)
        return self._cancel.is_set()

    def post(self, kind: str, value: Any = None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: the server is gone, nobody is listening
            pass




@dataclass
class Running:
    """Every job holding a slot, behind the one-job face the service's drain uses: `id` to log,
    `started` (the earliest), `cancel` for all of them (the SIGTERM drain once its grace is over)."""

    jobs: list[Job]

    @property
    def id(self) -> str:
        return ",".join(j.id for j in self.jobs)

    @property
    def started(self) -> float | None:
        return min((j.started for j in self.jobs if j.started is not None), default=None)

    def cancel(self, reason: str) -> None:
        for j in self.jobs:
            j.cancel(reason)


class Scheduler:
    """The queue in front of the engine and the worker that runs its rounds (ServedEngine's submit
    and round): queued jobs go to the engine while it has a free slot, between rounds."""

    def __init__(self, max_queue: int = 8, *, token_delay: float = 0.0, embed_queue: int = 2):
        self.max_queue = max_queue
        self.engine: Any = None  # a ServedEngine (served.py), from start()
        self._cv = threading.Condition()
        self._queue: deque[Job] = deque()
        self._jobs: dict[Any, Job] = {}  # the engine's Ticket -> its job, for every job holding a slot
        self._accepting = True
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._job_seconds = 5.0  # moving average of a job's run time, for Retry-After
        self._last_round = 0.0  # when the worker last began or ended a round, or admitted a job
        self._token_delay = token_delay  # test hook: slows the worker so tests can act mid-request
        self.last_batch = 0  # requests verified in the last target pass (the engine's, read after each round)
        # POST /v1/embeddings: run by this worker in slices between generation's rounds (slices.py)
        self.embeddings = SliceQueue("embeddings", embed_queue, self._cv)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, engine: Any) -> None:
        self.engine = engine
        self._thread = threading.Thread(target=self._loop, name="edgespec-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Ends the worker once its running jobs are done; True if it ended within `timeout`."""
        with self._cv:
            self._stopping = True
            self._accepting = False
            self._cv.notify_all()
        self.embeddings.drain()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    # -- queue ----------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def slots(self) -> int:
        """Requests that generate at once (--parallel): the engine's slots (1 before it is loaded)."""
        return self.engine.slots if self.engine is not None else 1

    @property
    def active(self) -> int:
        return len(self._jobs)

    @property
    def running(self) -> Running | None:
        jobs = list(self._jobs.values())
        return Running(jobs) if jobs else None

    def gauges(self) -> dict[str, tuple[str, float | int]]:
        """/metrics gauges of the engine's slots: how many, how many are held, how full the last round was."""
        return {
            "edgespec_slots": ("requests that can generate at once (--parallel)", self.slots),
            "edgespec_active_requests": ("requests holding a slot now", self.active),
            "edgespec_batch_size": ("requests verified in the last target pass", self.last_batch),
        }

    def retry_after(self) -> int:
        """Seconds until a queue slot is likely free: what 429 and 503 put in Retry-After."""
        return int(min(60, max(1, round(self._job_seconds * max(1, self.depth) / max(1, self.max_queue)))))

    def submit(self, job: Job) -> None:
        with self._cv:
            if not self._accepting:
                raise APIError(503, "the server is shutting down; retry against the restarted service",
                               code="shutting_down", headers={"Retry-After": "5"})
            if len(self._queue) >= self.max_queue:
                raise APIError(
                    429,
                    f"the generation queue is full ({self.max_queue} waiting, {self.slots} generating); retry later",
                    code="queue_full",
                    headers={"Retry-After": str(self.retry_after())},
                )
            job.queued = time.monotonic()
            self._queue.append(job)
            self._cv.notify_all()

    def withdraw(self, job: Job) -> bool:
        """Takes a job out of the queue if it has not started (client gone or timed out while waiting)."""
        with self._cv:
            try:
                self._queue.remove(job)
                return True
            except ValueError:
                return False

    def drain(self) -> Running | None:
        """Shutdown: refuse new jobs, answer every waiting one with 503; returns the running jobs."""
        with self._cv:
            self._accepting = False
            waiting = list(self._queue)
            self._queue.clear()
        self.embeddings.drain()
        for job in waiting:
            job.cancel(SHUTDOWN)
            job.post("error", APIError(503, "the server is shutting down before this request could start; retry",
                                       code="shutting_down", headers={"Retry-After": "5"}))
        return self.running

    def healthy(self, stall_seconds: float) -> bool:
        """False when the worker is dead, or when jobs hold slots and no round has finished for
        `stall_seconds`: the worker is stuck inside a pass (cancellation is seen between rounds), and
        only a restart can free it."""
        if self._thread is not None and not self._thread.is_alive() and not self._stopping:
            return False
        return not self._jobs or time.monotonic() - self._last_round < stall_seconds

    # -- worker ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        rounds = 0
        while True:
            with self._cv:
                self._admit_locked()
                while not self._jobs and not self.embeddings.pending and not (self._stopping and not self._queue):
                    self._cv.wait()
                    self._admit_locked()
                if self._stopping and not self._queue and not self._jobs:
                    return
            if not self._jobs:  # nothing generating: a slice of the other work, then look again
                self.embeddings.run_one()
                continue
            self._round()
            if self._token_delay:
                time.sleep(self._token_delay)
            rounds += 1
            if rounds % SLICE_EVERY == 0:  # the other work's share: one round in SLICE_EVERY (slices.py)
                self.embeddings.run_one()

    def _round(self) -> None:
        """One engine round, then every job it finished answered (its result or its error)."""
        self._last_round = time.monotonic()
        try:
            self.engine.round()
        except Exception as e:  # noqa: BLE001 - a bug here must not kill the only worker
            log.exception("a round failed")
            for job in self._jobs.values():
                job.finished = job.finished or time.monotonic()
                job.post("error", RuntimeError(f"worker failure: {type(e).__name__}"))
            self._jobs.clear()
            return
        self._last_round = time.monotonic()
        self.last_batch = self.engine.last_batch
        for ticket, job in list(self._jobs.items()):
            if ticket.done.is_set():
                del self._jobs[ticket]
                self._answer(job, ticket)

    def _answer(self, job: Job, ticket: Any) -> None:
        if ticket.error is not None:
            self._fail(job, ticket.error)
        else:
            job.finished = time.monotonic()
            job.post("done", ticket.result)
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * (job.finished - (job.started or job.finished))

    @staticmethod
    def _fail(job: Job, e: BaseException) -> None:
        """Every failure goes back to its request; the worker lives on."""
        job.finished = time.monotonic()
        if not isinstance(e, ValueError):  # ValueErrors are the caller's fault; anything else is ours
            log.error("generation %s failed: %r", job.id, e)
        job.post("error", e)

    def _admit_locked(self) -> None:
        """Queued jobs go to the engine while it has free slots (held: self._cv)."""
        while self._queue and len(self._jobs) < self.slots:
            job = self._queue.popleft()
            if job.cancelled:  # gone while waiting; its handler has already answered
                continue
            job.started = self._last_round = time.monotonic()
            job.post("start")

            def on_delta(delta: str, job: Job = job) -> None:
                if job.first_delta is None:
                    job.first_delta = time.monotonic()
                job.post("delta", delta)

            try:
                ticket = self.engine.submit(job.prepared, on_delta=on_delta)
            except Exception as e:  # noqa: BLE001 - a bug here fails its request, not the worker
                self._fail(job, e)
                continue
            if ticket.done.is_set():  # done at submission (a turn the documents declined): answered now
                self._answer(job, ticket)
            else:
                self._jobs[ticket] = job
