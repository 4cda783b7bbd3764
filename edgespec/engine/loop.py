"""The decode loop of the serial engine: one request's Sequence (sequence.py) as the batch of one,
its prompt read in chunks, then speculative rounds (engine/round.py) until a stop.

    decode(parts, req, drafting, cache) -> generator of text deltas, returning GenerationResult

`cancel` is checked before the prompt is read and after every round; the cache (`PrefixCache`)
tells the next request which prefix it may reuse.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator

from ..core.slot import Slot
from .requests import Request, Vocabulary
from .results import GenerationResult
from .round import Conditions, Governor, OneSlot, run_round
from .sequence import Drafting, Sequence
from .tree_round import TreeVerifier


@dataclass
class Parts:
    """What the engine lends the loop for one request."""

    target: Slot
    vocab: Vocabulary
    prefill_chunk: int
    governor: Governor | None = None
    tree: TreeVerifier | None = None  # runs the rounds when given (chain or tree, per req.tree)
    # called with the request's whole text when it ends, whatever its mode (the suffix index records it)
    on_end: Callable[[list[int]], None] | None = None


@dataclass
class PrefixCache:
    """The tokens whose K/V the target cache holds (a prefix of this list)."""

    tokens: list[int] = field(default_factory=list)

    def clear(self) -> None:
        self.tokens = []


def decode(parts: Parts, req: Request, drafting: Drafting, cache: PrefixCache) -> Generator[str, None, GenerationResult]:
    seq = Sequence(req, parts.target, cache.tokens, drafting, parts.vocab, parts.governor, tree=parts.tree)
    cache.tokens = seq.ctx  # the target cache holds ctx[:target.length] from here on
    if req.cancel():
        seq.stop("cancelled")
        return seq.result()
    deltas: list[str] = []
    while not seq.decoding:
        deltas = seq.prefill(parts.prefill_chunk)
    one = OneSlot(parts.target)  # the batch of one (engine/round.py)
    cond = Conditions(parts.vocab.usable, parts.governor, parts.tree)
    try:
        yield from deltas
        while seq.running():
            seq.next_k()
            (r,) = run_round(one, [seq.part], cond)
            yield from seq.take(r)
    finally:
        if parts.on_end is not None:  # also when the stream is closed early: ctx is final text
            parts.on_end(seq.ctx)
    tail = seq.tail()
    if tail:
        yield tail
    return seq.result()
