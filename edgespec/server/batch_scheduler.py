"""Several requests generating at once (`edgespec serve --parallel N`): one worker thread runs a
BatchEngine's rounds; queued jobs take a slot as soon as one is free, between rounds.

The same outside as the batch-1 Scheduler (submit, withdraw, drain, healthy, depth, retry_after),
so the HTTP side does not know which one it talks to. Differences:
- up to N jobs run at once; `running` is one object standing for all of them (`cancel` cancels
  every one: what the SIGTERM drain does once its grace time is over);
- a job's cancellation (client gone, timeout, shutdown) is seen at the next round and frees its
  slot there; the other jobs keep generating.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from .scheduler import Job, Scheduler
from .slices import SLICE_EVERY

log = logging.getLogger(__name__)


class _Running:
    """Every running job, behind the one-job interface the service's drain uses."""

    def __init__(self, jobs: list[Job]):
        self.jobs = jobs
        self.id = ",".join(j.id for j in jobs)
        self.started = min((j.started for j in jobs if j.started is not None), default=None)

    def cancel(self, reason: str) -> None:
        for j in self.jobs:
            j.cancel(reason)


class BatchScheduler(Scheduler):
    def __init__(self, max_queue: int = 8, *, token_delay: float = 0.0, embed_queue: int = 2):
        super().__init__(max_queue, token_delay=token_delay, embed_queue=embed_queue)
        self._jobs: dict[Any, Job] = {}  # ticket -> job, for every job holding (or about to hold) a slot
        self.last_batch = 0

    @property
    def slots(self) -> int:
        return self.engine.slots if self.engine is not None else 1

    @property
    def running(self):
        jobs = list(self._jobs.values())
        return _Running(jobs) if jobs else None

    @property
    def active(self) -> int:
        return len(self._jobs)

    def gauges(self) -> dict[str, tuple[str, float | int]]:
        """Extra /metrics gauges: the slots and how full the last round was."""
        return {
            "edgespec_slots": ("requests that can generate at once (--parallel)", self.slots),
            "edgespec_active_requests": ("requests holding a slot now", self.active),
            "edgespec_batch_size": ("requests verified in the last target pass", self.last_batch),
        }

    def healthy(self, stall_seconds: float) -> bool:
        if self._thread is not None and not self._thread.is_alive() and not self._stopping:
            return False
        # a round is a pass or a prefill chunk: stuck means no round finished for stall_seconds
        return not self._jobs or time.monotonic() - self._last_round < stall_seconds

    _last_round = 0.0

    # -- worker -------------------------------------------------------------------------------------
    def _loop(self) -> None:
        be = self.engine
        rounds = 0
        while True:
            with self._cv:
                self._admit_locked(be)
                while not self._jobs and not self.embeddings.pending and not (self._stopping and not self._queue):
                    self._cv.wait()
                    self._admit_locked(be)
                if self._stopping and not self._queue and not self._jobs:
                    return
            if not self._jobs:  # nothing generating: a slice of the other work, then look again
                self.embeddings.run_one()
                continue
            self._last_round = time.monotonic()
            try:
                be.round()
            except Exception as e:  # noqa: BLE001 - a bug here must not kill the only worker
                log.exception("a batch round failed")
                for job in self._jobs.values():
                    job.finished = job.finished or time.monotonic()
                    job.post("error", RuntimeError(f"worker failure: {type(e).__name__}"))
                self._jobs.clear()
                continue
            self._last_round = time.monotonic()
            self.last_batch = be.last_batch
            for ticket, job in list(self._jobs.items()):
                if ticket.done.is_set():
                    del self._jobs[ticket]
                    job.finished = time.monotonic()
                    if ticket.error is not None:
                        if not isinstance(ticket.error, ValueError):
                            log.error("generation %s failed: %r", job.id, ticket.error)
                        job.post("error", ticket.error)
                    else:
                        job.post("done", ticket.result)
                    self._job_seconds = 0.8 * self._job_seconds + 0.2 * (job.finished - (job.started or job.finished))
            if self._token_delay:
                time.sleep(self._token_delay)
            rounds += 1
            if rounds % SLICE_EVERY == 0:  # the other work's share: one round in SLICE_EVERY (slices.py)
                self.embeddings.run_one()

    def _admit_locked(self, be) -> None:
        """Queued jobs go to the engine while it has free slots (held: self._cv)."""
        while self._queue and len(self._jobs) < be.slots:
            job = self._queue.popleft()
            if job.cancelled:  # gone while waiting; its handler has already answered
                continue
            job.started = time.monotonic()
            job.post("start")

            def on_delta(delta: str, job: Job = job) -> None:
                if job.first_delta is None:
                    job.first_delta = time.monotonic()
                job.post("delta", delta)

            try:
                ticket = be.submit(job.prepared, on_delta=on_delta)
            except Exception as e:  # noqa: BLE001 - a bug here fails its request, not the worker
                job.finished = time.monotonic()
                job.post("error", e)
                continue
            self._jobs[ticket] = job
