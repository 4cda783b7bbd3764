"""Waiting on a condition with a deadline that fails loudly: the only way tests wait."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T], timeout: float = 30.0, every: float = 0.05,
             detail: Callable[[], str] | None = None) -> T:
    """Polls fn until it returns something truthy and returns it; raises AssertionError naming
    `what` (and the last value seen) when the deadline passes first. `detail`, called only then,
    adds what explains the failure (a server's log tail, the states seen). fn may raise to stop
    early (a process that exited will never become ready)."""
    end = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > end:
            more = f":\n{detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last value: {value!r}){more}")
        time.sleep(every)
