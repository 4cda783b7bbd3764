"""A venue's passages in the cache, computed once: a visitor's turn copies the rows of the passages
retrieval picked in after the system turn and prefills only the question (an index built with
`edgespec index --cached-passages`, its manifest's reading "cached").

Why: quoting passages into the turn made their prefill most of a visitor's wait (the 1.5B target
prefills ~60 tokens/s on a 2-core CPU: 240 tokens of passages are ~4 s), and reading the whole venue
from the cache made the model look for the answer among some fifty passages at every step (fewer
facts, slower decode). Here each passage's K/V rows are computed once, after the system turn's prefix
and the turn's preamble (`base`), at rotary positions of their own: passage i (the index's order) at
len(base) + the tokens of passages 0..i-1, so no two passages' positions overlap (positions kept with
gaps: graph contract v2's position_ids). A turn's prompt is assembled from token lists, and its cache:

    base | block c1 | block c2 | ... | "Question: ..." + the template's end of turn
    rows restored (pinned.py) | rows copied at their own positions | prefilled after the last block's position

What it is not: a prefill of the same text. A passage's rows attended to the base only, not to the
passages before it in the turn (CacheBlend's recomputed seams are not done), and the question sits at
positions past the venue's end. docs/kiosk.md measures what that costs in facts, against the quoted
reading. Decoding from the assembled cache is exact against the target alone from that same cache:
speculation changes nothing.

Memory: every passage's rows stay on the host, kv_bytes_per_token x the venue's tokens (57,344 B a
token for the int4 1.5B's float32 cache: ~350 MB for 6,100 tokens), counted by the memory plan
(build.py). They are saved like the pinned prefix (pinned.py's file, keyed by the bundle, the template
and every token), so a restart copies instead of computing. A follow-up turn (a conversation with
earlier turns) and a request with another system prompt are quoted and prefilled as before.

At every --parallel (batch.py) the rows are computed in one slot and kept once: a block's
positions are the same in every slot, so a turn's blocks are copied into whichever slot it is admitted
to (arrange() remembers what it placed per slot), and turn_ids() decides which turns qualify.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..core.proposal import common_prefix
from ..docs.answer import PREAMBLE, block_text

log = logging.getLogger("edgespec.engine")

Encode = Callable[[str], list[int]]  # a user turn's content -> the tokens the template gives it


@dataclass
class VenueRows:
    system: str  # the system prompt the rows were computed after
    base: list[int]  # the system turn's prefix and the turn's preamble: the pinned prefix
    blocks: dict[int, list[int]]  # chunk -> its quoted block's tokens
    tail: list[int]  # the template's tokens after a user turn's content
    encode: Encode
    index: object = None  # the Index whose chunks these are (a reload's new index is not read with them)
    rows: dict[int, tuple[list[np.ndarray], np.ndarray]] = field(default_factory=dict)  # chunk -> (K/V, positions)
    # slot index -> the tokens arrange() last put in that slot's cache (each slot holds its own turn)
    _placed: dict[int, list[int]] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(map(len, self.blocks.values()))

    def layout(self) -> dict[int, int]:
        """Each passage's first rotary position: after the base and every passage before it."""
        pos, out = len(self.base), {}
        for c in sorted(self.blocks):
            out[c] = pos
            pos += len(self.blocks[c])
        return out

    def end(self) -> int:
        return len(self.base) + self.tokens

    def ids(self, chunks: Sequence[int], question: str) -> list[int] | None:
        """A single-turn request's tokens: base, the chosen blocks, the question, the template's end;
        None when a chunk has no rows or the question cannot be laid out (quote it instead)."""
        if not chunks or any(c not in self.rows for c in chunks):
            return None
        q = self.encode(f"Question: {question}")
        if not q:
            return None
        return [*self.base, *(t for c in chunks for t in self.blocks[c]), *q, *self.tail]

    def arrange(self, target, cache, ids: Sequence[int], chunks: Sequence[int]) -> None:
        """Makes a cache slot (target: a core/slot.Slot; cache: its PrefixCache) hold ids' base and
        blocks (the base already restored by the pinned prefix): keeps the blocks it still holds from
        its last arrangement, copies the rest."""
        bounds = [len(self.base)]
        for c in chunks:
            bounds.append(bounds[-1] + len(self.blocks[c]))
        placed = self._placed.get(target.index, [])
        held = common_prefix(cache.tokens[: target.length], ids)  # blocks only as this object placed them:
        held = min(held, max(bounds[0], common_prefix(placed, ids)))  # never a prefill of the same tokens
        if held < bounds[0]:
            raise ValueError("venue rows: the cache does not hold the base (pin it first)")
        j = max(i for i, b in enumerate(bounds) if b <= held)
        target.rewind(bounds[j])
        for c in chunks[j:]:
            kv, pos = self.rows[c]
            target.place(kv, pos)
        self._placed[target.index] = list(ids[: bounds[-1]])
        cache.tokens = list(ids[: bounds[-1]])

    def compute(self, target, cache, pinned, prefill_chunk: int) -> None:
        """Every block's rows, after the base: one prefill of each block at its layout position in
        one cache slot (target, its PrefixCache `cache`), its rows copied out. The base is written
        back from `pinned` (pinned.py's PinnedPrefix of it) when the slot lost it; the slot holds
        the base after. The rows are any slot's: a block's positions are the same in every slot."""
        n0 = len(self.base)
        if pinned is not None:
            pinned.restore(self.base, target, cache, past=False)
        if target.length < n0:
            raise ValueError("venue rows: the target cache does not hold the base")
        for c, p in self.layout().items():
            target.rewind(n0)
            toks = self.blocks[c]
            for i in range(0, len(toks), prefill_chunk):
                target.step(toks[i : i + prefill_chunk], 1, position=p if i == 0 else None)
            self.rows[c] = target.rows(n0, n0 + len(toks))
        target.rewind(n0)
        cache.tokens = list(self.base)

    # -- saved next to the pinned prefix (pinned.py's format: the tokens, the rows, a checksum) ------
    def all_tokens(self) -> list[int]:
        return [*self.base, *(t for c in sorted(self.blocks) for t in self.blocks[c])]

    def stacked(self) -> list[np.ndarray]:
        order = sorted(self.blocks)
        return [np.concatenate([self.rows[c][0][i] for c in order], axis=2) for i in range(len(self.rows[order[0]][0]))]

    def unstack(self, rows: Sequence[np.ndarray]) -> None:
        """The rows of a saved file (stacked()), split back into blocks; ValueError when they do not fit."""
        if any(r.shape[2] != self.tokens for r in rows):
            raise ValueError("its rows do not hold the venue's tokens (stale)")
        at = 0
        for c, p in self.layout().items():
            n = len(self.blocks[c])
            self.rows[c] = ([r[:, :, at : at + n] for r in rows], np.arange(p, p + n, dtype=np.int64))
            at += n


def turn_ids(engine, p) -> tuple[tuple[int, ...], list[int]] | None:
    """A prepared request (requests.Prepared) as a turn of the cached reading: (its passages, the
    request's tokens assembled from the rows' token lists) when it is a single question after the
    system prompt the engine's rows (engine.venue_rows) were computed with (none: the default one),
    its passages read from the index the rows were computed from; None for anything else, which is
    quoted and prefilled. The engine decides here (batch.py, at submit), so a turn is read the same
    way at every --parallel. `engine`: its docs, venue_rows, pinned and max_len."""
    kn, rows, pin, turn = engine.docs, engine.venue_rows, engine.pinned, p.turn
    if kn is None or rows is None or turn is None or not turn.blocks or pin is None or pin.tokens != rows.base:
        return None
    # a turn read before a reload (it waited in a queue), or a reload's new passages before their rows
    # are computed: quoted
    if p.read != kn.generation or rows.index is not kn.index:
        return None
    messages = p.options.messages
    system = messages[0].get("content") if messages and messages[0].get("role") == "system" else None
    users = messages[1:] if system is not None else messages
    if len(users) != 1 or (system if system is not None else rows.system) != rows.system:
        return None
    ids = rows.ids(turn.blocks, turn.question)
    if ids is None or len(ids) >= engine.max_len:
        return None
    return turn.blocks, ids


def plan(system: str, index, encode_turn: Callable[[str], list[int] | None], head: list[int],
         tail: list[int]) -> VenueRows | None:
    """The venue's layout for this system prompt (no rows yet): encode_turn(content) is the whole
    request's tokens for a single user turn (engine.encode), head and tail what every such request
    starts and ends with. None when a block cannot be laid out between them."""
    def content(text: str) -> list[int]:
        ids = encode_turn(text)
        if ids is None or ids[: len(head)] != head or (tail and ids[len(ids) - len(tail):] != tail):
            return []
        return ids[len(head) : len(ids) - len(tail)]

    pre = content(PREAMBLE + "\n\n")
    if not pre:
        return None
    blocks = {}
    for c in range(len(index.chunks)):
        ids = content(block_text(index, c))
        if not ids:
            log.warning("venue rows: passage %d cannot be laid out in the template: it is quoted", c + 1)
            continue
        blocks[c] = ids
    return VenueRows(system, [*head, *pre], blocks, list(tail), content, index) if blocks else None


def cache_file(save_dir: Path | None, key: str) -> Path | None:
    return None if save_dir is None else Path(save_dir) / f"venue-{key}.npz"
