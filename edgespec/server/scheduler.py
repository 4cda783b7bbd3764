"""Batch-1 generation: one worker thread owns the engine; requests wait in a bounded queue.

Why a thread and not the event loop: Engine calls block for a whole target pass (tens of ms to
seconds on a Pi), which would freeze every other connection, /health and the watchdog. The worker
posts each text delta back to the event loop with `call_soon_threadsafe`, so the HTTP side never
touches the models: it only calls the engine's `prepare` (the tokenizer, the documents' index), and
the worker runs the Prepared a job carries.

Cancellation is cooperative: each job carries a `should_stop()` that the engine calls before every
target pass, so a client that goes away, a per-request timeout or a shutdown frees the engine
within one pass.
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


class Scheduler:
    def __init__(self, max_queue: int = 8, *, token_delay: float = 0.0, embed_queue: int = 2):
        self.max_queue = max_queue
        self.engine: Any = None
        self._cv = threading.Condition()
        self._queue: deque[Job] = deque()
        self._running: Job | None = None
        self._accepting = True
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._job_seconds = 5.0  # moving average of a job's run time, for Retry-After
        self._token_delay = token_delay  # test hook: slows the worker so tests can act mid-request
        # POST /v1/embeddings: run by this worker in slices between generation's rounds (slices.py)
        self.embeddings = SliceQueue("embeddings", embed_queue, self._cv)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, engine: Any) -> None:
        self.engine = engine
        self._thread = threading.Thread(target=self._loop, name="edgespec-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Ends the worker after its current job; True if it ended within `timeout`."""
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
    def running(self) -> Job | None:
        return self._running

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
                    f"the generation queue is full ({self.max_queue} waiting, one generating); retry later",
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

    def drain(self) -> Job | None:
        """Shutdown: refuse new jobs, answer every waiting one with 503; returns the running job."""
        with self._cv:
            self._accepting = False
            waiting = list(self._queue)
            self._queue.clear()
        self.embeddings.drain()
        for job in waiting:
            job.cancel(SHUTDOWN)
            job.post("error", APIError(503, "the server is shutting down before this request could start; retry",
                                       code="shutting_down", headers={"Retry-After": "5"}))
        return self._running

    def healthy(self, stall_seconds: float) -> bool:
        """False when one job has held the engine for longer than any request may: the worker is stuck
        inside a pass (cancellation is checked between passes), and only a restart can free it."""
        if self._thread is not None and not self._thread.is_alive() and not self._stopping:
            return False
        job = self._running
        return job is None or job.started is None or time.monotonic() - job.started < stall_seconds

    # -- worker ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self.embeddings.pending and not self._stopping:
                    self._cv.wait()
                if self._stopping and not self._queue:
                    return
                job = self._queue.popleft() if self._queue else None
                if job is None or job.cancelled:  # gone while waiting; its handler has already answered
                    job = None
                else:
                    self._running = job
            if job is None:  # no generation waiting: a slice of the other work, then look again
                self.embeddings.run_one()
                continue
            try:
                self._run(job)
            except Exception:  # noqa: BLE001 - a bug here must not kill the only worker
                log.exception("the worker failed on %s", job.id)
                job.finished = job.finished or time.monotonic()
                job.post("error", RuntimeError("worker failure"))
            finally:
                with self._cv:
                    self._running = None

    def _run(self, job: Job) -> None:
        job.started = time.monotonic()
        job.post("start")
        try:
            stream = self.engine.stream(job.prepared)
            for n, delta in enumerate(stream, 1):
                if delta:
                    if job.first_delta is None:
                        job.first_delta = time.monotonic()
                    job.post("delta", delta)
                if self._token_delay:
                    time.sleep(self._token_delay)
                if n % SLICE_EVERY == 0:  # the other work's share: one gap in SLICE_EVERY (slices.py)
                    self.embeddings.run_one()
            result = stream.result
        except Exception as e:  # noqa: BLE001 - every failure goes back to its request, the worker lives on
            if not isinstance(e, ValueError):  # ValueErrors are the caller's fault; anything else is ours
                log.exception("generation %s failed", job.id)
            job.finished = time.monotonic()
            job.post("error", e)
        else:
            job.finished = time.monotonic()
            job.post("done", result)
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * (job.finished - job.started)
