"""A bounded index of recent token text that answers "what followed this suffix before, and how often?".

Structure (a measured choice, docs/speed.md): a suffix automaton over the documents held, built
online one token at a time, beside the flat token buffer that bounds it. The automaton's states are
the classes of substrings that end at the same positions; each keeps, for the strings of up to
`max_match + max_chain` tokens the drafter ever asks about:

- `cnt`: how many times its strings occurred;
- `cont`: how many of those occurrences were followed by a token of the same document;
- `best`: the token that most often followed them (ties: the one seen most recently).

A lookup walks the context's last `max_match` tokens through the automaton (O(max_match), whatever
the history's size), steps back to the longest suffix that occurred with a continuation, and then
follows `best` for up to k tokens: the same chain the old scan of the whole history found (the scan
is kept as the tests' reference, tests/helpers/suffix_scan.py), at a cost that no longer grows with
the history (measured: `python -m edgespec.drafters.suffix_bench`).

Updates: appending a token costs the automaton's amortised O(1) extension plus one walk over the
suffix classes of the new position's last `max_match + max_chain` tokens (at most that many states,
usually a handful), each updating its counts and its best continuation; the counts of longer
classes are never read and not kept current. Bound and eviction are the buffer's: at most `capacity`
tokens are held; when full, the oldest are dropped in blocks of capacity/8 and the automaton of
what is kept is rebuilt over the following appends, REBUILD_PER_TOKEN buffer tokens per token
appended (the old one, which still knows the evicted text, answers until then; memory is briefly
two automata). Documents (requests) are
separated: the automaton is a generalised one (each document starts from the root), so a match
never spans two of them; buf[0] is always SEP.

    idx = SuffixIndex(capacity=1 << 20)
    idx.start_doc(); idx.extend(prompt_ids); idx.extend(new_ids)
    chain = idx.lookup(tail=ctx[-32:], k=8)      # Chain(tokens, freqs, supports, matched)
    alts = idx.alternatives(ctx[-32:], k=8, width=3)   # other continuations, for tree verification
"""
from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..errors import InvalidRequest
from ..limits import K_LIMIT, SUFFIX_CAPACITY

SEP = -1
DEFAULT_MAX_MATCH = 32  # longest suffix matched; longer matches are no rarer in practice, just slower
NONE = -1  # no transition / no best continuation
# After an eviction, buffer tokens fed to the kept text's new automaton per token appended: more
# than the 7 the next eviction needs (7/8 of the capacity kept, 1/8 appended before the next).
REBUILD_PER_TOKEN = 8


@dataclass
class Chain:
    """A proposed continuation. tokens[j] followed the matched suffix (+ tokens[:j]) in freqs[j] of
    the supports[j] earlier occurrences still matching at that step; matched is the suffix length
    matched before tokens[0] (tokens[j] is then predicted from a match of matched + j tokens)."""

    tokens: list[int] = field(default_factory=list)
    freqs: list[float] = field(default_factory=list)
    supports: list[int] = field(default_factory=list)
    matched: int = 0

    def __len__(self) -> int:
        return len(self.tokens)


NO_CHAIN = Chain()


def check_capacity(capacity) -> None:
    """The index's size in tokens: an integer of at least 16 (else InvalidRequest naming it)."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 16:
        raise InvalidRequest(f"suffix index capacity must be an integer >= 16 tokens, got {capacity!r}",
                             param="suffix_capacity")


class _Automaton:
    """A generalised suffix automaton with per-state occurrence counts and best continuation.

    State 0 is the root (the empty string). Per state, in int32 arrays: `len` (its longest string),
    `link` (suffix link), `cnt`, `cont`, `best` (module docstring), and its first transition
    (`ttok`, `tdst`); the others, for the states that have several, in `more[state][token]`. Counts
    are exact for the states whose shortest string has at most `depth` tokens."""

    __slots__ = ("depth", "len", "link", "cnt", "cont", "best", "ttok", "tdst", "more", "last", "jump")

    def __init__(self, depth: int):
        self.depth = depth
        self.len, self.link = array("i", [0]), array("i", [-1])
        self.cnt, self.cont, self.best = array("i", [0]), array("i", [0]), array("i", [NONE])
        self.ttok, self.tdst = array("i", [NONE]), array("i", [NONE])
        self.more: dict[int, dict[int, int]] = {}
        self.last = 0  # the state of the current document's text so far (0: a document starts)
        # state -> an ancestor on its suffix-link path such that every state between them has a
        # shortest string longer than depth (their counts are not kept): a long repetition's path
        # is skipped rather than walked at every token. Clones only lengthen such states' shortest
        # strings, so a jump stays valid.
        self.jump = array("i", [NONE])

    @property
    def states(self) -> int:
        return len(self.len)

    @property
    def nbytes(self) -> int:
        arrays = sum(a.buffer_info()[1] * a.itemsize for a in
                     (self.len, self.link, self.cnt, self.cont, self.best, self.ttok, self.tdst, self.jump))
        # the dicts, and the int objects their keys and values are (28 bytes each, ids past 256)
        more = sys.getsizeof(self.more) + sum(sys.getsizeof(m) + 56 * len(m) for m in self.more.values())
        return arrays + more

    def step(self, v: int, t: int) -> int:
        """The state reached from v by token t, or NONE."""
        if self.ttok[v] == t:
            return self.tdst[v]
        m = self.more.get(v)
        return NONE if m is None else m.get(t, NONE)

    def _set(self, v: int, t: int, u: int) -> None:
        tt = self.ttok[v]
        if tt == t or tt == NONE:
            self.ttok[v], self.tdst[v] = t, u
        else:
            m = self.more.get(v)
            if m is None:
                m = self.more[v] = {}
            m[t] = u

    def _new(self, length: int, link: int) -> int:
        self.len.append(length)
        self.link.append(link)
        self.cnt.append(0)
        self.cont.append(0)
        self.best.append(NONE)
        self.ttok.append(NONE)
        self.tdst.append(NONE)
        self.jump.append(NONE)
        return len(self.len) - 1

    def _clone(self, q: int, length: int) -> int:
        c = self._new(length, self.link[q])
        self.cnt[c], self.cont[c], self.best[c] = self.cnt[q], self.cont[q], self.best[q]
        self.ttok[c], self.tdst[c] = self.ttok[q], self.tdst[q]
        m = self.more.get(q)
        if m is not None:
            self.more[c] = dict(m)
        return c

    def start_doc(self) -> None:
        self.last = 0

    def add(self, t: int) -> None:
        """Appends token t (>= 0) to the current document."""
        prev = self.last
        self.last = self._extend(prev, t)
        self._count(prev, t)

    def _extend(self, p: int, t: int) -> int:
        """The online (generalised) suffix automaton extension by t from state p; returns the new
        last state."""
        length, link, step = self.len, self.link, self.step
        q = step(p, t)
        if q != NONE:  # t already followed the whole text: only at a document's start, or a repeat
            if length[p] + 1 == length[q]:
                return q
            clone = self._clone(q, length[p] + 1)
            while p != NONE and step(p, t) == q:
                self._set(p, t, clone)
                p = link[p]
            link[q] = clone
            return clone
        cur = self._new(length[p] + 1, 0)
        while p != NONE and step(p, t) == NONE:
            self._set(p, t, cur)
            p = link[p]
        if p != NONE:
            q = step(p, t)
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = self._clone(q, length[p] + 1)
                while p != NONE and step(p, t) == q:
                    self._set(p, t, clone)
                    p = link[p]
                link[q] = link[cur] = clone
        return cur

    def _count(self, prev: int, t: int) -> None:
        """The new position's counts: every state whose strings ended at the previous position (the
        suffix-link path of `prev`) now has one more occurrence followed by t, and the state it
        reaches by t one more occurrence. Only states with a shortest string of <= depth tokens are
        kept current (the walk skips the longer ones above them)."""
        link, cnt, cont, best, step = self.link, self.cnt, self.cont, self.best, self.step
        v = self._skip(prev)
        seen = -1  # the last state counted: several v on the path reach the same u, consecutively
        while v != NONE:  # below the skipped part every state's shortest string is shorter still
            u = step(v, t)
            if u != seen:
                cnt[u] += 1
                seen = u
            cont[v] += 1
            b = best[v]
            if b != t and (b == NONE or cnt[u] >= cnt[step(v, b)]):
                best[v] = t  # a tie goes to the one seen now, the most recent
            v = link[v]

    def _skip(self, v: int) -> int:
        """The first state on v's suffix-link path (v included) whose shortest string has at most
        depth tokens (path-compressed through `jump`)."""
        length, link, jump, depth = self.len, self.link, self.jump, self.depth
        passed = []
        while v > 0 and length[link[v]] >= depth:
            passed.append(v)
            j = jump[v]
            v = link[v] if j == NONE else j
        for x in passed:
            jump[x] = v
        return v

    def match(self, tail: Sequence[int]) -> tuple[int, int]:
        """(state, n): the longest suffix of tail (n tokens) that occurred with a continuation;
        (0, 0) when none did."""
        v, n = 0, 0
        length, link, step = self.len, self.link, self.step
        for t in tail:
            t = int(t)
            u = step(v, t)
            while u == NONE and v != 0:
                v = link[v]
                n = length[v]
                u = step(v, t)
            if u == NONE:
                v, n = 0, 0
            else:
                v, n = u, n + 1
        while v != 0 and self.cont[v] == 0:  # this suffix occurred only where nothing followed yet
            v = link[v]
            n = length[v]
        return v, n

    def children(self, v: int) -> list[tuple[int, int]]:
        """(token, state) of every transition of v."""
        out = [] if self.ttok[v] == NONE else [(self.ttok[v], self.tdst[v])]
        out.extend(self.more.get(v, {}).items())
        return out


def _feed(sam: _Automaton, tokens: list[int]) -> None:
    for t in tokens:
        if t == SEP:
            sam.start_doc()
        else:
            sam.add(t)


class SuffixIndex:
    """Token text of recent documents, bounded, and its automaton; see the module docstring."""

    def __init__(self, capacity: int = SUFFIX_CAPACITY, max_match: int = DEFAULT_MAX_MATCH,
                 max_chain: int = K_LIMIT):
        check_capacity(capacity)
        if isinstance(max_match, bool) or not isinstance(max_match, int) or max_match < 1:
            raise InvalidRequest(f"suffix index max_match must be an integer >= 1, got {max_match!r}",
                                 param="suffix_max_match")
        self.capacity = capacity
        self.max_match = max_match
        self.max_chain = max_chain  # longest chain a lookup returns (its counts are kept exact)
        self._block = max(1, capacity // 8)  # tokens evicted at least per eviction
        self._buf = np.full(capacity + 1, SEP, dtype=np.int32)  # fixed size: the token bound
        self._end = 1  # buf[:end] is the text; buf[0] == SEP
        self._sam = _Automaton(max_match + max_chain)
        # after an eviction: the automaton of what was kept, built a few tokens per appended token
        # (REBUILD_PER_TOKEN) while `_sam` (still holding the evicted text too) answers lookups;
        # `_fed` is the buffer position it has reached. Swapped in once it holds the whole buffer.
        self._next: _Automaton | None = None
        self._fed = 1
        self._stale = 0  # evictions since `_sam` last held only the buffer's text
        self.evicted = 0  # tokens dropped so far (tests and stats)
        self.rebuilt = 0  # automaton rebuilds after an eviction, finished (stats)

    # -- size -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Tokens held (separators included), never more than capacity."""
        return self._end - 1

    @property
    def nbytes(self) -> int:
        """Bytes of the index's storage now: the token buffer (fixed) and the automaton (grows with
        the text held, at most ~2 states and ~3 transitions per token held)."""
        return int(self._buf.nbytes) + self._sam.nbytes

    @property
    def states(self) -> int:
        return self._sam.states

    @property
    def text(self) -> np.ndarray:
        """What the index holds, oldest first (SEP between documents); a view, do not modify."""
        return self._buf[1 : self._end]

    # -- updates ----------------------------------------------------------------------------------
    def clear(self) -> None:
        self._buf[: self._end] = SEP
        self._end = 1
        self._sam = _Automaton(self.max_match + self.max_chain)
        self._next, self._fed, self._stale = None, 1, 0

    @property
    def rebuilding(self) -> bool:
        """An eviction's automaton is still being built (lookups may still see evicted text)."""
        return self._next is not None

    def settle(self) -> None:
        """Finishes a pending rebuild now (tests: the rebuilt automaton compared with the scan)."""
        if self._next is not None:
            self._advance(self._end)

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
        if self._next is None:
            _feed(self._sam, a.tolist())
            return
        # REBUILD_PER_TOKEN a token, and more if needed so that the rebuild ends before the room left runs
        # out: the next eviction starts another, and at the bare rate (8 = capacity / block) the buffer grew
        # as fast as it was fed, so a rebuild was restarted just short of its end again and again while the
        # old automaton kept every evicted token (a soak's RSS grew without bound)
        room = self.capacity - len(self)
        n = max(REBUILD_PER_TOKEN * a.size, self._end - self._fed - (REBUILD_PER_TOKEN - 1) * room)
        if self._fed + n >= self._end:
            self._advance(self._end)  # the rebuild ends in this call: the old automaton is done
            return
        _feed(self._sam, a.tolist())
        self._advance(n)

    def _advance(self, n: int) -> None:
        """Feeds the next automaton up to n more tokens of the buffer; swaps it in when done."""
        stop = min(self._end, self._fed + max(n, 1))
        _feed(self._next, self._buf[self._fed : stop].tolist())
        self._fed = stop
        if stop == self._end:
            self._sam, self._next = self._next, None
            self._stale = 0
            self.rebuilt += 1

    def _evict(self, incoming: int) -> None:
        """Drops the oldest tokens: enough for `incoming` more, and at least `block` of them, so
        that appending costs one copy and one automaton rebuild per block of tokens rather than one
        per round."""
        if self._next is not None and self._stale >= 2:
            # two evictions in a row came before their rebuilds ended: this one is finished (it is short of
            # its end by at most REBUILD_PER_TOKEN - 1 tokens for each incoming one, see _append), so the
            # automaton answering lookups never holds more than three windows of evicted text
            self._advance(self._end)
        held = len(self)
        keep = max(0, min(held, self.capacity - self._block, self.capacity - incoming))
        self._buf[1 : 1 + keep] = self._buf[self._end - keep : self._end]
        self._buf[1 + keep : self._end] = SEP
        self._end = 1 + keep
        self.evicted += held - keep
        # the kept text's automaton is built over the next appends (REBUILD_PER_TOKEN each), not now:
        # a rebuild of ~900k tokens at once would stall one round for 10-100 s on a 2-core board
        self._next, self._fed = _Automaton(self.max_match + self.max_chain), 1
        self._stale += 1

    # -- lookups ----------------------------------------------------------------------------------
    def lookup(self, tail: Sequence[int], k: int) -> Chain:
        """The most frequent continuation of the longest matching suffix of tail (at most max_match
        tokens), up to k tokens (at most max_chain; the chain stops where no occurrence continues)."""
        k = min(k, self.max_chain)
        if k <= 0 or len(tail) == 0:
            return NO_CHAIN
        sam = self._sam
        v, n = sam.match(tail[-self.max_match :])
        if n == 0:
            return NO_CHAIN
        chain = Chain(matched=n)
        cnt, cont, best, step = sam.cnt, sam.cont, sam.best, sam.step
        for _ in range(k):
            c = cont[v]
            if c == 0:
                break
            t = best[v]
            v = step(v, t)
            chain.tokens.append(t)
            chain.freqs.append(cnt[v] / c)
            chain.supports.append(c)
        return chain

    def alternatives(self, tail: Sequence[int], k: int, width: int) -> list[list[int]]:
        """Up to `width` continuations of up to k tokens with distinct first tokens: first those
        that followed the longest matching suffix (most frequent first: the first is `lookup`'s
        chain), then those that followed shorter ones (a shorter match has seen more). Each then
        follows its most frequent path. What tree verification widens a chain with: several earlier
        continuations at no model step, found in O(max_match * width)."""
        k = min(k, self.max_chain)
        if k <= 0 or width <= 0 or len(tail) == 0:
            return []
        sam = self._sam
        v, _ = sam.match(tail[-self.max_match :])
        out: list[list[int]] = []
        taken: set[int] = set()
        while v > 0 and len(out) < width:
            kids = sorted(((sam.cnt[u], t != sam.best[v], t, u) for t, u in sam.children(v) if t not in taken),
                          key=lambda x: (-x[0], x[1]))
            for _, _, t, u in kids[: width - len(out)]:
                taken.add(t)
                path = [t]
                while len(path) < k and sam.cont[u] > 0:
                    b = sam.best[u]
                    path.append(b)
                    u = sam.step(u, b)
                out.append(path)
            v = sam.link[v]
        return out
