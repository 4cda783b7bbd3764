"""The suffix index as it was before the automaton: one flat array scanned with numpy at every lookup.

Kept as the reference the automaton (edgespec/drafters/suffix_index.py) is tested against: both
must propose the same chains (tokens, frequencies, supports, matched length) on any text, through
documents, eviction and clearing. Its lookup costs O(history) (np.flatnonzero over the whole text).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from edgespec.drafters.suffix_index import DEFAULT_MAX_MATCH, NO_CHAIN, SEP, Chain, check_capacity
from edgespec.errors import InvalidRequest
from edgespec.limits import SUFFIX_CAPACITY


class ScanIndex:
    """Token text of recent documents, bounded; see the module docstring."""

    def __init__(self, capacity: int = SUFFIX_CAPACITY, max_match: int = DEFAULT_MAX_MATCH):
        check_capacity(capacity)
        if isinstance(max_match, bool) or not isinstance(max_match, int) or max_match < 1:
            raise InvalidRequest(f"suffix index max_match must be an integer >= 1, got {max_match!r}",
                                 param="suffix_max_match")
        self.capacity = capacity
        self.max_match = max_match
        self._block = max(1, capacity // 8)  # tokens evicted at least per eviction
        self._buf = np.full(capacity + 1, SEP, dtype=np.int32)  # fixed size: the memory bound
        self._end = 1  # buf[:end] is the text; buf[0] == SEP
        self.evicted = 0  # tokens dropped so far (tests and stats)

    def copy(self) -> "ScanIndex":
        """An independent index holding the same text (a batched request drafts from its own copy
        of the history plus its own text, so requests running side by side never interleave)."""
        twin = ScanIndex(self.capacity, self.max_match)
        twin._buf[: self._end] = self._buf[: self._end]
        twin._end = self._end
        return twin

    # -- size -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Tokens held (separators included), never more than capacity."""
        return self._end - 1

    @property
    def nbytes(self) -> int:
        """Bytes of the index's storage: fixed at construction, whatever is appended."""
        return int(self._buf.nbytes)

    @property
    def text(self) -> np.ndarray:
        """What the index holds, oldest first (SEP between documents); a view, do not modify."""
        return self._buf[1 : self._end]

    # -- updates ----------------------------------------------------------------------------------
    def clear(self) -> None:
        self._buf[: self._end] = SEP
        self._end = 1

    def start_doc(self) -> None:
        """What is appended next does not continue what came before."""
        if self._end > 1 and self._buf[self._end - 1] != SEP:
            self._append(np.array([SEP], dtype=np.int32))

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        a = np.asarray(tokens, dtype=np.int64)
        if a.size == 0:
            return
        if a.ndim != 1 or a.min() < 0 or a.max() > np.iinfo(np.int32).max:
            raise InvalidRequest("suffix index: tokens must be a flat list of ids >= 0", param="tokens")
        self._append(a.astype(np.int32))

    def _append(self, a: np.ndarray) -> None:
        if a.size > self.capacity:  # only the newest capacity tokens can be kept anyway
            self.evicted += a.size - self.capacity
            a = a[-self.capacity :]
        if len(self) + a.size > self.capacity:
            self._evict(a.size)
        self._buf[self._end : self._end + a.size] = a
        self._end += a.size

    def _evict(self, incoming: int) -> None:
        """Drops the oldest tokens: enough for `incoming` more, and at least `block` of them, so
        that appending costs one copy per block of tokens rather than one per round."""
        held = len(self)
        keep = max(0, min(held, self.capacity - self._block, self.capacity - incoming))
        self._buf[1 : 1 + keep] = self._buf[self._end - keep : self._end]
        self._buf[1 + keep : self._end] = SEP
        self._end = 1 + keep
        self.evicted += held - keep

    # -- lookups ----------------------------------------------------------------------------------
    def occurrences(self, tail: Sequence[int]) -> tuple[np.ndarray, int]:
        """Positions p (buf[p] == tail[-1], each with a continuation at p + 1 inside the text) of
        the longest suffix of `tail` (at most max_match tokens) that occurred with a continuation,
        and its length. (empty, 0) when not even tail[-1] did."""
        if len(tail) == 0:
            return np.empty(0, dtype=np.int64), 0
        buf, end = self._buf, self._end
        last = int(tail[-1])
        # candidates: p in [1, end - 2] so that p + 1 <= end - 1 holds a token
        hits = np.flatnonzero(buf[1 : end - 1] == last) + 1
        if hits.size == 0:
            return hits, 0
        hits = hits[buf[hits + 1] != SEP]
        if hits.size == 0:
            return hits, 0
        n = 1
        limit = min(self.max_match, len(tail))
        while n < limit:
            # buf[0] is SEP and never equals a token id, so hits - n >= 0 while matches hold
            more = hits[buf[hits - n] == int(tail[-1 - n])]
            if more.size == 0:
                break
            hits, n = more, n + 1
        return hits, n

    def lookup(self, tail: Sequence[int], k: int) -> Chain:
        """The most frequent continuation of the longest matching suffix of tail, up to k tokens
        (the chain stops where no occurrence continues)."""
        if k <= 0:
            return NO_CHAIN
        hits, n = self.occurrences(tail)
        if n == 0:
            return NO_CHAIN
        buf, end = self._buf, self._end
        chain = Chain(matched=n)
        for _ in range(k):
            hits = hits[hits + 1 < end]
            if hits.size == 0:
                break
            nxt = buf[hits + 1]
            ok = nxt != SEP
            hits, nxt = hits[ok], nxt[ok]
            if hits.size == 0:
                break
            vals, counts = np.unique(nxt, return_counts=True)
            top = counts.max()
            if (counts == top).sum() == 1:
                t = int(vals[int(np.argmax(counts))])
            else:  # a tie: the continuation seen most recently among the tied ones
                tied = np.isin(nxt, vals[counts == top])
                t = int(nxt[np.flatnonzero(tied)[-1]])
            chain.tokens.append(t)
            chain.freqs.append(float(top) / hits.size)
            chain.supports.append(int(hits.size))
            hits = hits[nxt == t] + 1
        return chain
