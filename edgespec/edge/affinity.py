"""Holding this process to fewer cores: the governor's fewer-cores rung."""
from __future__ import annotations

import os


class AffinityLimiter:
    """Holds every thread of this process to the first `n` of the cores it started with.

    Why affinity: onnxruntime fixes a session's intra-op thread count when the session is created,
    and recreating sessions mid-request would cost seconds. `sched_setaffinity` on each task in
    /proc/self/task moves the existing pool threads onto fewer cores, so the process can never use
    more than `n` cores' worth of CPU time (and power); threads started later inherit the mask from
    the thread that starts them. `restore()` gives back the original mask."""

    def __init__(self, task_dir: str = "/proc/self/task"):
        self.task_dir = task_dir
        try:
            self.original = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.original = []
        self.current: list[int] | None = None

    @property
    def available(self) -> bool:
        return len(self.original) >= 2 and hasattr(os, "sched_setaffinity")

    def _apply(self, cores: list[int]) -> int:
        """Sets the mask on every task; returns how many accepted it (tasks may exit meanwhile)."""
        done = 0
        try:
            tids = [int(t) for t in os.listdir(self.task_dir)]
        except OSError:
            tids = [0]
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cores)
                done += 1
            except OSError:  # the thread exited between listdir and here
                pass
        return done

    def limit(self, n: int) -> int:
        cores = self.original[: max(1, min(n, len(self.original)))]
        self._apply(cores)
        self.current = cores
        return len(cores)

    def restore(self) -> None:
        if self.current is not None and self.original:
            self._apply(self.original)
        self.current = None
