"""Reading the document index again (POST /v1/docs/reload, SIGHUP), coalesced.

A reload re-checks every file of the index against its manifest (sha256), which costs the CPU a
streaming chat needs; clients looping on the endpoint ran it 270 times a second and doubled a stream's
token gap. So: one reload reads at a time; a call arriving while none is pending starts the next one,
which begins once the one reading has ended and `interval` seconds have passed since it did; every
call arriving meanwhile joins that pending reload and gets its answer. A call never gets an answer
read before it arrived (it joins only a reload that has not started reading), and reloads run at most
once per `interval` seconds however many clients ask.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any


def reload_docs(engine) -> dict[str, Any]:
    """The engine's documents read again. LookupError: it has none; InvalidRequest: the index cannot be
    used (the one in use stays)."""
    kn = engine.docs
    if kn is None:
        raise LookupError("this server has no documents: serve it with --docs INDEX")
    idx = kn.reload()
    return {"object": "docs.reload", "index": str(kn.path), "documents": idx.manifest["counts"]["documents"],
            "passages": len(idx.chunks), "generation": kn.generation}


class ReloadGate:
    """The coalescing (module docstring); used from the event loop only."""

    def __init__(self, interval: float):
        self.interval = interval
        self._pending: asyncio.Task | None = None  # the next reload, not reading yet: later calls join it
        self._reading: asyncio.Task | None = None
        self._last = -float("inf")  # time.monotonic() when the last reload ended
        self.waiting = 0  # calls waiting for a reload (/metrics)
        self.runs = 0  # reloads done

    @property
    def reading(self) -> bool:
        return self._reading is not None

    async def reload(self, engine) -> tuple[dict[str, Any], bool]:
        """(the answer of reload_docs, joined: True when another call had started this reload)."""
        joined = self._pending is not None
        if not joined:
            self._pending = asyncio.ensure_future(self._run(engine, self._reading))
        task = self._pending
        self.waiting += 1
        try:
            return await asyncio.shield(task), joined
        finally:
            self.waiting -= 1

    async def _run(self, engine, before: asyncio.Task | None) -> dict[str, Any]:
        if before is not None:
            await asyncio.wait([before])
        wait = self._last + self.interval - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self._pending, self._reading = None, asyncio.current_task()
        try:
            return await asyncio.to_thread(reload_docs, engine)
        finally:
            self._last = time.monotonic()
            self._reading = None
            self.runs += 1
