"""The suffix automaton against the scan it replaced (tests/helpers/suffix_scan.py): the same chains
(tokens, frequencies, supports, matched length) on random and real text, through documents, eviction,
copies and clearing; its alternatives for tree verification; its size bound."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from edgespec.drafters.suffix_index import SEP, SuffixIndex

from helpers.suffix_scan import ScanIndex

ROOT = Path(__file__).resolve().parents[2]


def same(a: SuffixIndex, b: ScanIndex, tail, k: int) -> None:
    ca, cb = a.lookup(tail, k), b.lookup(tail, k)
    assert (ca.tokens, ca.supports, ca.matched) == (cb.tokens, cb.supports, cb.matched), (tail, k)
    assert ca.freqs == pytest.approx(cb.freqs)


def tails(rng, idx, vocab: int):
    """Random tails, and tails taken from the text itself (the drafter's case: its context's end)."""
    yield rng.integers(0, vocab, int(rng.integers(0, 12))).tolist()
    text = [int(t) for t in idx.text[-int(rng.integers(1, 40)):]]
    if SEP in text:
        text = text[len(text) - text[::-1].index(SEP):]
    yield text


@pytest.mark.parametrize("seed", range(6))
def test_random_text_gives_the_scans_chains(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        cap, vocab, mm = int(rng.integers(16, 300)), int(rng.integers(2, 10)), int(rng.integers(1, 9))
        a, b = SuffixIndex(cap, mm), ScanIndex(cap, mm)
        for _ in range(int(rng.integers(1, 25))):
            if rng.random() < 0.3:
                a.start_doc()
                b.start_doc()
            toks = rng.integers(0, vocab, int(rng.integers(0, 40))).tolist()
            a.extend(toks)
            b.extend(toks)
            a.settle()
            assert list(a.text) == list(b.text) and a.evicted == b.evicted
            for tail in tails(rng, a, vocab):
                same(a, b, tail, int(rng.integers(0, 17)))


def _words() -> list[int]:
    """Real text: this repository's docs and code as word/punctuation ids."""
    ids: dict[str, int] = {}
    out = []
    for f in sorted((ROOT / "docs").glob("*.md"))[:4] + sorted((ROOT / "edgespec" / "drafters").glob("*.py")):
        out += [ids.setdefault(w, len(ids)) for w in re.findall(r"\w+|[^\w\s]", f.read_text())]
    return out


def test_real_text_gives_the_scans_chains_through_eviction():
    words = _words()
    rng = np.random.default_rng(7)
    a, b = SuffixIndex(4096), ScanIndex(4096)
    pos = 0
    while pos < min(len(words), 20000):
        n = int(rng.integers(50, 900))
        if rng.random() < 0.5:
            a.start_doc()
            b.start_doc()
        a.extend(words[pos : pos + n])
        b.extend(words[pos : pos + n])
        pos += n
        a.settle()  # an eviction's rebuild, finished now (test_an_eviction_rebuilds_over_the_next_appends)
        for _ in range(20):  # contexts the drafter would look up: an end of text seen so far
            end = int(rng.integers(1, pos))
            same(a, b, words[max(0, end - 40) : end], 8)
        same(a, b, [int(t) for t in a.text[-32:]], 16)
    assert a.evicted > 0 and a.rebuilt > 0 and list(a.text) == list(b.text)


def test_a_cleared_index_still_agrees_with_the_scan():
    rng = np.random.default_rng(3)
    text = rng.integers(0, 5, 300).tolist()
    a, b = SuffixIndex(256), ScanIndex(256)
    a.extend(text)
    b.extend(text)
    for tail in (text[-5:], text[:3], text[40:49]):
        same(a, b, tail, 8)
    a.clear()
    b.clear()
    a.extend(text[:20])
    b.extend(text[:20])
    same(a, b, text[:4], 8)


def test_a_long_repetition_keeps_its_counts_exact():
    """A model stuck in a loop: the automaton's suffix paths grow with the repeat, its counts of the
    short matches the drafter asks about must stay the scan's."""
    a, b = SuffixIndex(8192, max_match=8), ScanIndex(8192, max_match=8)
    for piece in ([7] * 300, [1, 2] * 200, [7] * 50 + [3]):
        a.extend(piece)
        b.extend(piece)
    for tail in ([7], [7, 7, 7], [1, 2, 1], [2, 7], [7] * 20 + [3]):
        same(a, b, tail, 16)


def test_alternatives_are_distinct_continuations_most_frequent_first():
    # after "5": "1 8" twice, "2 3" once, "4" once
    a = SuffixIndex(64)
    for doc in ([5, 1, 8], [5, 2, 3], [5, 1, 8], [5, 4]):
        a.start_doc()
        a.extend(doc)
    alts = a.alternatives([9, 5], k=3, width=3)
    assert alts[0] == a.lookup([9, 5], 3).tokens == [1, 8]
    assert sorted(alts[1:]) == [[2, 3], [4]]
    assert a.alternatives([9, 5], k=3, width=1) == [[1, 8]]
    assert a.alternatives([6], k=3, width=3) == [] and a.alternatives([5], k=0, width=3) == []


def test_alternatives_fall_back_to_shorter_matches():
    a = SuffixIndex(64)
    for doc in ([1, 5, 2, 7], [3, 5, 4], [3, 5, 4]):
        a.start_doc()
        a.extend(doc)
    # "1 5" was followed by 2 only; "5" alone also by 4 (twice)
    assert a.alternatives([1, 5], k=2, width=3) == [[2, 7], [4]]


def test_the_automaton_is_bounded_by_the_tokens_held():
    rng = np.random.default_rng(1)
    a = SuffixIndex(512)
    for _ in range(40):
        a.start_doc()
        a.extend(rng.integers(0, 50, 100).tolist())
        assert len(a) <= 512
        assert a.states <= 2 * len(a) + 1  # a suffix automaton has at most 2n - 1 states (+ the root)
    assert a.rebuilt > 0


def test_an_eviction_rebuilds_over_the_next_appends():
    """No stall: the kept text's automaton is built REBUILD_PER_TOKEN tokens per appended token;
    meanwhile the old one answers (it still knows the new text); then the scan's answers again."""
    from edgespec.drafters.suffix_index import REBUILD_PER_TOKEN

    rng = np.random.default_rng(5)
    a, b = SuffixIndex(1024), ScanIndex(1024)
    text = rng.integers(0, 30, 1022).tolist()
    a.extend(text)
    b.extend(text)
    a.start_doc()
    b.start_doc()
    a.extend([7, 8, 9])  # over capacity: the oldest 1/8 go
    b.extend([7, 8, 9])
    assert a.rebuilding and a.evicted == b.evicted > 0 and a.rebuilt == 0
    assert a.lookup([7, 8], 1).tokens == [9]  # the new text is found while the rebuild runs
    appended = 0
    while a.rebuilding:
        a.extend([int(t) for t in rng.integers(0, 30, 5)])
        appended += 5
    assert a.rebuilt == 1 and appended * REBUILD_PER_TOKEN >= len(a) - appended - 5
    b.extend(a.text[len(b) :].tolist())
    assert list(a.text) == list(b.text)
    for tail in (text[-6:], [7, 8], [int(t) for t in a.text[-10:]]):
        same(a, b, tail, 8)


@pytest.mark.parametrize("doc", [5, 9])
def test_short_documents_let_every_rebuild_end_so_the_automaton_stays_bounded(doc):
    """Documents of 5 or 9 tokens (and their separators) into 512 tokens: each eviction's rebuild used to
    be restarted by the next eviction a few tokens short of its end, every time, so the automaton that
    answers lookups kept every evicted token (8,499 and 16,971 states after 2,000 documents; a server's
    RSS grew without bound). Now rebuilds end, and the automaton holds a few windows of text at most."""
    rng = np.random.default_rng(0)
    ix = SuffixIndex(512)
    peak = 0
    for _ in range(2000):
        ix.start_doc()
        ix.extend(rng.integers(0, 400, size=doc).tolist())
        peak = max(peak, ix.states)
    evictions = ix.evicted // ix._block
    assert ix.rebuilt >= evictions // 3, (ix.rebuilt, evictions)
    assert peak <= 2 * (512 + 3 * ix._block), peak  # ~2 states a token held: the buffer and three windows
