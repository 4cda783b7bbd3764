"""The suffix index's lookup as it was before the automaton: a numpy scan of the whole token buffer.

Kept as the reference the automaton (edgespec/drafters/suffix_index.py) is tested against: both
must propose the same chains (tokens, frequencies, supports, matched length) on any text. It shares
the index's token buffer (documents, eviction, copies, clearing) and replaces only the lookup, whose
cost grows with the history (np.flatnonzero over the whole text).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from edgespec.drafters.suffix_index import NO_CHAIN, SEP, Chain, SuffixIndex


class ScanIndex(SuffixIndex):
    """SuffixIndex whose lookup scans the buffer (the pre-automaton implementation)."""

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
