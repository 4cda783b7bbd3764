"""Each bench mode learns as if it were the only mode the engine ran.

The bench runs every mode on one open engine, and what its drafters learn is the engine's: a finished
request's estimates seed the next request's drafters of the same modes, whichever mode it ran in
(`auto`'s suffix source seeds a `suffix` request), and a slot's draft model keeps its calibration. What
they learn (acceptance by matched length or confidence, a draft's rate, how long replies run and how
much of them its rounds write) would flow from one mode's run of a prompt into the next mode's run of
the same prompt, the same text:
measured, whichever of `suffix` and `auto` ran second on a copying prompt started from the other's
estimates, and `auto` priced the draft's prompt prefill against the `model` mode's habit of writing
every token of a reply, paying a 190-token prefill for one model round on a prompt the suffix
index then copied. A server runs one mode; so does each lineage here.

A snapshot is the engine's `drafter_state()` (engine/batch_drafters.py: what finished requests taught,
and each slot's kept drafters' `state()`; not the suffix history, which holds text, not estimates),
taken right after the engine's caches were reset, so nothing in it describes a cache's content.
"""
from __future__ import annotations

from typing import Any, Callable


class Lineages:
    """enter(mode) before a mode's generations, leave(mode) after them; each resets the engine's
    caches first (`reset(engine)`), so a snapshot never describes a cache's content. A mode continues
    from its own state, or from the engine's state when the lineages were made: run_bench makes them
    before its warmup, which pays one-off costs and must teach no mode (it did: the warmup's `model`
    run took the draft past its first looks, so the bench's `auto` never tried it as a server's does)."""

    def __init__(self, engine, reset: Callable[[Any], None]) -> None:
        self.engine, self.reset = engine, reset
        reset(engine)
        self.start = engine.drafter_state()
        self.saved: dict[str, Any] = {}

    def enter(self, mode: str) -> None:
        self.reset(self.engine)
        self.engine.load_drafter_state(self.saved.get(mode, self.start))

    def leave(self, mode: str) -> None:
        self.reset(self.engine)
        self.saved[mode] = self.engine.drafter_state()
