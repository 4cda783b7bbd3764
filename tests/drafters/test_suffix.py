"""The suffix index (match, frequency, documents, eviction, memory bound, reset), the suffix and
recycling drafters, the free-drafter auto, and the engine wiring (cross-request index, reset,
lazy draft prefill). Lossless checks for the new drafters are in test_lossless.py / test_sampling.py."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.core.costmodel import CostModel
from edgespec.core.sampling import SamplingParams
from edgespec.drafters import AutoDrafter, RecycleDrafter, SuffixDrafter
from edgespec.drafters.suffix_index import SEP, SuffixIndex
from edgespec.engine import Engine
from edgespec.errors import InvalidRequest

from helpers.costs import times

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


def index_of(*docs, capacity=1024, max_match=32) -> SuffixIndex:
    idx = SuffixIndex(capacity, max_match)
    for d in docs:
        idx.start_doc()
        idx.extend(d)
    return idx


# --- the index -------------------------------------------------------------------------------------
def test_lookup_prefers_the_longest_match():
    # after "1 2 3" came 9 once; after "... 3" alone came 7 three times
    idx = index_of([1, 2, 3, 9, 5, 3, 7, 6, 3, 7, 4, 3, 7, 8, 1, 2, 3])
    chain = idx.lookup([1, 2, 3], 1)
    assert chain.tokens == [9] and chain.matched == 3 and chain.supports == [1]


def test_lookup_picks_the_most_frequent_continuation_then_narrows():
    # "5" was followed by 1 twice, 2 once; after "5 1" came 8 once and 9 once (tie: the latest, 9)
    idx = index_of([5, 1, 8, 0, 5, 2, 3, 0, 5, 1, 9, 0, 5])
    chain = idx.lookup([5], 3)
    assert chain.matched == 1
    assert chain.tokens[:2] == [1, 9]
    assert chain.freqs[0] == pytest.approx(2 / 3) and chain.supports[0] == 3
    assert chain.freqs[1] == pytest.approx(1 / 2) and chain.supports[1] == 2
    assert chain.tokens[2] == 0  # what followed "5 1 9"


def test_no_match_and_edges():
    idx = index_of([1, 2, 3])
    assert idx.lookup([4], 3).tokens == []
    assert idx.lookup([], 3).tokens == []
    assert idx.lookup([1], 0).tokens == []
    assert idx.lookup([3], 3).tokens == []  # the text's last token has no continuation yet
    assert SuffixIndex(16).lookup([1], 4).tokens == []


def test_matches_never_cross_documents():
    idx = index_of([1, 2], [3, 4])
    assert idx.lookup([2], 2).tokens == []  # 2 ended its document: 3 did not follow it
    assert idx.lookup([1, 2, 3], 1).matched == 1  # the match "2 3" would span the boundary
    assert list(idx.text) == [1, 2, SEP, 3, 4]


def test_max_match_caps_the_matched_length():
    text = list(range(40)) * 2
    assert index_of(text, max_match=8).lookup(text[:40], 1).matched == 8
    assert index_of(text).lookup(text[:40], 1).matched == 32


def test_eviction_drops_the_oldest_and_the_bound_holds():
    idx = SuffixIndex(capacity=64)
    idx.start_doc()
    idx.extend([7, 8])  # the oldest text: "7 -> 8"
    assert idx.lookup([7], 1).tokens == [8]
    for i in range(50):
        idx.start_doc()
        idx.extend(np.arange(100, 110) + i)
        assert len(idx) <= 64
        assert idx.states <= 2 * len(idx) + 1  # the automaton is bounded by the text held
    assert idx.evicted > 0
    assert idx.lookup([7], 1).tokens == []  # evicted
    assert idx.lookup([149], 1).tokens == [150]  # the newest document is still there
    assert idx.text.base.nbytes == (64 + 1) * 4  # the token buffer: fixed at construction


def test_a_document_longer_than_the_capacity_keeps_its_end():
    idx = SuffixIndex(capacity=32)
    idx.extend(np.arange(1, 101))
    assert len(idx) == 32 and list(idx.text) == list(range(69, 101))
    assert idx.lookup([80], 2).tokens == [81, 82]


def test_clear_forgets_everything():
    idx = index_of([1, 2, 3])
    idx.clear()
    assert len(idx) == 0 and idx.lookup([1], 2).tokens == []
    idx.extend([1, 5])
    assert idx.lookup([1], 1).tokens == [5]


@pytest.mark.parametrize("kw", [dict(capacity=0), dict(capacity=8), dict(capacity=2.5), dict(capacity=True),
                                dict(capacity=64, max_match=0)])
def test_bad_index_settings_are_refused(kw):
    with pytest.raises(InvalidRequest):
        SuffixIndex(**kw)


def test_bad_tokens_are_refused():
    idx = SuffixIndex(64)
    with pytest.raises(InvalidRequest):
        idx.extend([1, -3])
    with pytest.raises(InvalidRequest):
        idx.extend([[1, 2]])


# --- the drafters -----------------------------------------------------------------------------------
def costs() -> CostModel:
    # the dev machine's curve: 2 tokens cost 1.12 steps, every token after that ~0.22-0.25
    return CostModel(times(s1=0.076, s2=0.086, s3=0.106, s4=0.120, s5=0.141, s6=0.153, s7=0.172, s8=0.185, s9=0.208))


def test_suffix_drafter_copies_across_requests_and_learns():
    d = SuffixDrafter(SuffixIndex(4096), costs())
    answer = [50, 51, 52, 53, 54, 55, 56, 57, 58, 59]
    d.begin([1, 2, 3])
    d.record([1, 2, 3, 9, *answer])  # an earlier request and its answer
    ctx = [4, 9, 50, 51, 52]  # a new request quoting the answer
    d.begin(ctx)
    prop = d.propose(ctx, 8, GREEDY, RNG)
    assert prop.source == "suffix" and prop.tokens == answer[3 : 3 + len(prop.tokens)] and prop.tokens
    first = d.betas(d.index.lookup(ctx, 1))[0].mean
    d.lookup([*ctx, *answer[3:]], 1)  # the next round saw the copy verified: the estimate rises
    assert d.betas(d.index.lookup(ctx, 1))[0].mean > first


def test_suffix_drafter_proposes_nothing_on_a_weak_match():
    d = SuffixDrafter(SuffixIndex(4096), costs())
    ctx = [1, 2, 3, 4, 5, 6, 7, 3]  # "3" once followed by 4: a 1-token match is a weak hint
    d.begin(ctx)
    assert d.propose(ctx, 8, GREEDY, RNG).tokens == []
    d.adaptive = False
    assert d.propose(ctx, 8, GREEDY, RNG).tokens == [4, 5, 6, 7, 3]


def test_recycle_drafter_keeps_the_targets_top_candidates():
    r = RecycleDrafter(6, width=2, adaptive=False)
    rows = np.array([[0, 5, 1, 4.5, 0, 0, 9],  # after token 3: 1 best, then 3; id 6 is past vocab
                     [0, 0, 0, 0, 7, 0, 0]], dtype=np.float32)  # after token 1: 4 (alone within margin)
    r.observe(rows, [3, 1])
    assert r.table[3].tolist() == [1, 3] and r.table[1].tolist() == [4, -1]
    assert r.chain(3, 5) == [1, 4]  # 4 has no row yet: the chain stops
    r.observe(np.array([[9, 0, 0, 0, 0, 0, 0]], dtype=np.float32), [1])  # newer row replaces the older
    assert r.table[1, 0] == 0
    assert r.nbytes == 6 * 2 * 4
    r.forget()
    assert (r.table == -1).all() and r.chain(3, 2) == []


def test_recycle_drafter_refuses_bad_settings():
    with pytest.raises(InvalidRequest):
        RecycleDrafter(0)
    with pytest.raises(InvalidRequest):
        RecycleDrafter(10, width=0)


def test_auto_takes_the_suffix_copy_and_nothing_on_fresh_text():
    c = costs()
    suffix = SuffixDrafter(SuffixIndex(4096), c)
    auto = AutoDrafter(c, [suffix, RecycleDrafter(200, c)])
    span = list(range(100, 140))
    auto.begin([1, *span, 2])
    suffix.record([1, *span, 2])
    ctx = [3, *span[:12]]
    auto.begin(ctx)
    prop = auto.propose(ctx, 8, GREEDY, RNG)
    assert prop.source == "suffix" and len(prop.tokens) >= 2
    assert auto.propose([5, 6, 7, 8], 8, GREEDY, RNG).tokens == []


# --- the engine ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def eng(tiny_bundle):
    return Engine.open(tiny_bundle, max_len=256)


def test_a_later_request_copies_an_earlier_answer(eng):
    eng.reset_cache()
    first = eng.generate("def add(a, b):", max_new_tokens=40, draft="none")  # target alone, indexed too
    again = eng.generate("def add(a, b):", max_new_tokens=40, draft="suffix")
    assert again.token_ids == first.token_ids
    assert again.stats.rounds_by_source.get("suffix", 0) > 0
    assert again.stats.accepted >= len(first.token_ids) // 2
    eng.reset_cache()  # forgets the index: the same request copies from its prompt only
    fresh = eng.generate("def add(a, b):", max_new_tokens=40, draft="suffix")
    assert fresh.token_ids == first.token_ids
    assert fresh.stats.accepted < again.stats.accepted
    assert len(eng.history) == len(eng.encode("def add(a, b):")) + 40


def test_recycle_mode_drafts_from_the_verify_rows(eng):
    eng.reset_cache()
    ref = eng.generate("def add(a, b):", max_new_tokens=48, draft="none")
    r = eng.generate("def add(a, b):", max_new_tokens=48, draft="recycle", k=2)
    assert r.token_ids == ref.token_ids
    assert r.stats.rounds_by_source.get("recycle", 0) > 0 and r.stats.accepted > 0


def test_the_first_token_does_not_wait_for_the_draft_prefill(eng):
    """The draft model's cache is empty when the first token is out; it is filled when a round
    first uses the model, and the output is still the target's."""
    eng.reset_cache()
    ref = eng.generate("def mul(a, b):", max_new_tokens=24, draft="none")
    eng.reset_cache()
    s = eng.stream("def mul(a, b):", max_new_tokens=24, draft="model", k=2)
    deltas = [next(s)]
    assert eng.draft_runner.length == 0
    deltas += list(s)
    assert s.result.token_ids == ref.token_ids
    assert eng.draft_runner.length > 0


def test_a_stream_closed_early_leaves_a_clean_document(eng):
    """A client's Stop closes the stream between rounds: what was written so far joins the index as
    its own document, and the next request (in any mode) starts a new one."""
    eng.reset_cache()
    s = eng.stream("def add(a, b):", max_new_tokens=40, draft="suffix")
    next(s)
    s.close()
    first_doc = list(eng.history.text)
    assert first_doc[: len(eng.encode("def add(a, b):"))] == eng.encode("def add(a, b):")
    r = eng.generate("x = [1, 2", max_new_tokens=8, draft="none")
    ids = eng.encode("x = [1, 2")
    assert list(eng.history.text) == [*first_doc, SEP, *ids, *r.token_ids]
