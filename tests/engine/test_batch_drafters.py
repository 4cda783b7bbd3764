"""Batched requests' suffix drafting: the shared history of finished requests read in place, each
request's own text in an index of its own (engine/batch_drafters.py, drafters/suffix.py); and their
docs drafting: one index of the documents read by every request (drafters/docs.py)."""
from __future__ import annotations

import pytest

from edgespec.core.costmodel import CostModel
from edgespec.drafters.suffix import SuffixDrafter
from edgespec.drafters.suffix_index import SEP
from edgespec.engine.batch_drafters import BatchDrafters, request_index_capacity
from helpers.costs import times


def _suffix(bd: BatchDrafters, ctx: list[int]) -> SuffixDrafter:
    d, _, cap = bd.for_request("suffix", 8, None)
    assert isinstance(d, SuffixDrafter) and cap == 8
    d.begin(ctx)
    return d


def test_running_requests_never_see_each_other_but_all_see_finished_ones():
    bd = BatchDrafters(suffix_capacity=1024, max_len=64)
    f_ctx = [30, 31, 32, 33, 34, 35]
    f = _suffix(bd, f_ctx)
    f.lookup(f_ctx, 8)
    bd.finished(f, f_ctx)
    a_ctx, b_ctx = [10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24, 25]
    a, b = _suffix(bd, a_ctx), _suffix(bd, b_ctx)
    a.lookup(a_ctx, 8)
    b.lookup(b_ctx, 8)  # both requests' text is indexed now, each in its own index
    assert list(a.index.text) == a_ctx and list(b.index.text) == b_ctx
    # neither sees the other's in-flight text ...
    assert a.lookup(a_ctx + [20, 21], 8).tokens == []
    assert b.lookup(b_ctx + [10, 11], 8).tokens == []
    # ... both see the finished request's, and their own
    assert a.lookup(a_ctx + [20, 21, 30, 31], 8).tokens == [32, 33, 34, 35]
    assert b.lookup(b_ctx + [30, 31, 32], 3).tokens == [33, 34, 35]
    assert b.lookup(b_ctx + [30, 31, 32, 21, 22], 2).tokens == [23, 24]
    # a request that ends joins the history at once: the one still running drafts from it next
    a_done = a_ctx + [20, 21, 30, 31, 40]
    bd.finished(a, a_done)
    assert b.lookup(b_ctx + [30, 31, 32, 21, 22, 12, 13], 3).tokens == [14, 15, 16]
    assert list(bd.history.text) == f_ctx + [SEP] + a_done  # b's text is not there while it runs
    b_done = b_ctx + [30, 31, 32, 21, 22, 12, 13, 14]
    bd.finished(b, b_done)
    assert list(bd.history.text) == f_ctx + [SEP] + a_done + [SEP] + b_done


def test_admission_copies_nothing_and_the_own_index_holds_only_the_request():
    bd = BatchDrafters(suffix_capacity=1 << 14, max_len=200)
    old = list(range(1, 5001))
    bd.history.extend(old)
    history, held, states = bd.history, len(bd.history), bd.history.states
    for mode in ("suffix", "auto"):
        d, _, _ = bd.for_request(mode, None, CostModel(times(s1=0.1)))
        sx = d if mode == "suffix" else d.sources[0]
        assert sx.shared is history and sx.index is not history  # the history itself, not a copy
        assert len(sx.index) == 0 and sx.index.states == 1  # an empty automaton (its root) to start
        assert sx.index.capacity == request_index_capacity(200) == 201  # sized by the slot, not the history
        ctx = [7, 8, 9, 4000, 4001]
        d.begin(ctx)
        sx.lookup(ctx, 8)
        assert list(sx.index.text) == ctx
        # drafting reads the history and never writes it
        assert sx.lookup(ctx, 4).tokens == [4002, 4003, 4004, 4005]
        assert bd.history is history and len(history) == held and history.states == states
        assert history.text.tolist() == old
    assert request_index_capacity(4) == 16  # the index's smallest


def test_the_better_chain_wins_longest_match_first_then_own_text_on_a_tie():
    bd = BatchDrafters(suffix_capacity=256, max_len=64)
    bd.history.extend([4, 1, 2, 3, 7])
    d = _suffix(bd, [])
    # own text: "1 2 3" then 8; history: "4 1 2 3" then 7. The tail "... 4 1 2 3" matches 4 tokens there
    assert d.lookup([1, 2, 3, 8, 4, 1, 2, 3], 1).tokens == [7]
    # the tail "... 5 1 2 3": 3 tokens match in both, with the same estimate: the request's own text
    assert _suffix(bd, []).lookup([1, 2, 3, 8, 5, 1, 2, 3], 1).tokens == [8]


def test_forget_clears_the_shared_history_for_new_requests():
    bd = BatchDrafters(suffix_capacity=256, max_len=64)
    f = _suffix(bd, [1, 2, 3])
    bd.finished(f, [1, 2, 3, 4])
    assert _suffix(bd, []).lookup([9, 2, 3], 1).tokens == [4]
    bd.forget()
    assert len(bd.history) == 0 and _suffix(bd, []).lookup([9, 2, 3], 1).tokens == []


def test_auto_starts_from_the_last_finished_requests_evidence_and_forget_drops_it():
    """A batched engine builds an auto per request: what the draft model showed on the last finished
    request carries over (faded at begin, as in the serial engine), so a draft that kept losing is
    not explored afresh on every request; forget() drops it."""
    bd = BatchDrafters(suffix_capacity=256, max_len=64)
    costs = CostModel(times(s1=0.1))
    first, _, _ = bd.for_request("auto", None, costs)
    first.acceptance("model", 0.8)  # the posterior is made from the prior on first use ...
    first.posteriors["model"].add(2, 30)  # ... then the request shows the draft mostly rejected
    shown = first.posteriors["model"].mean
    assert shown < 0.2
    bd.finished(first, [1, 2, 3])
    second, _, _ = bd.for_request("auto", None, costs)
    assert second.posteriors["model"] is not first.posteriors["model"]  # a copy: the two never share
    second.begin([4, 5])
    b = second.posteriors["model"]
    assert abs(b.mean - shown) < 1e-12 and b.a + b.b < 34 * 0.3  # the same mean, its weight faded
    bd.forget()
    third, _, _ = bd.for_request("auto", None, costs)
    assert third.posteriors == {} and third.share == {}


def test_auto_learns_the_replies_length_across_batched_requests_as_the_serial_auto_does():
    """The serial engine's auto hears every request end and keeps the mean reply length that prices a
    catch-up (drafters/auto.py `served`); a batched request's auto is built fresh, so the length goes
    through its evidence. A reset keeps it in both engines: it describes the service, not a text."""
    from edgespec.drafters.auto import AutoDrafter, REPLY_KEEP, REPLY_PRIOR

    costs = CostModel(times(s1=0.1))
    serial = AutoDrafter(costs, [])
    bd = BatchDrafters(suffix_capacity=256, max_len=256)
    prompt = list(range(10))
    for reply in (12, 40):  # two requests of 12 and 40 tokens
        serial.begin(prompt)
        serial.end(prompt + [7] * reply)
        d, _, _ = bd.for_request("auto", None, costs)
        d.begin(prompt)
        bd.finished(d, prompt + [7] * reply)
    want = (REPLY_KEEP * (REPLY_KEEP * REPLY_PRIOR + (1 - REPLY_KEEP) * 12) + (1 - REPLY_KEEP) * 40)
    nxt, _, _ = bd.for_request("auto", None, costs)
    assert serial.reply == pytest.approx(want) and nxt.reply == pytest.approx(want)
    bd.forget()
    serial.forget()
    after, _, _ = bd.for_request("auto", None, costs)
    assert after.reply == pytest.approx(want) == serial.reply


class _Docs:
    """A docs.answer.Docs as the docs drafter reads it: an index of passages' token ids and
    the generation a reload bumps."""

    def __init__(self, passages: list[list[int]]):
        self.generation = 0
        self.index = self._index(passages)

    @staticmethod
    def _index(passages):
        class Index:
            chunks = passages
            ids = [t for p in passages for t in p]

            @staticmethod
            def chunk_ids(i):
                return passages[i]

        return Index

    def reload(self, passages: list[list[int]]) -> None:
        self.index = self._index(passages)
        self.generation += 1


def test_docs_requests_share_one_index_of_the_documents_and_learn_apart():
    """Three requests drafting from the documents at once read one index, built once (not per request),
    which none writes; each has its own acceptance estimates, and the next request starts from the last
    finished one's. A reload is read by the requests that begin after it, never mid-request."""
    kn = _Docs([[10, 11, 12, 13, 14], [20, 21, 22, 23]])
    bd = BatchDrafters(suffix_capacity=256, max_len=64, docs=kn)
    assert bd.available("docs") and not BatchDrafters(max_len=64).available("docs")
    ds = [bd.for_request("docs", 4, None, slot)[0] for slot in range(3)]
    index = ds[0].index
    assert all(d.index is index for d in ds) and len(index) == 5 + 1 + 4
    for d, ctx in zip(ds, ([1, 10, 11], [2, 21], [3, 12])):
        d.begin(ctx)
    assert ds[0].lookup([1, 10, 11], 4).tokens == [12, 13, 14]
    assert ds[1].lookup([2, 21], 4).tokens == [22, 23]
    assert ds[2].lookup([3, 12], 2).tokens == [13, 14]
    assert index.text.tolist() == [10, 11, 12, 13, 14, SEP, 20, 21, 22, 23]  # the requests' text never joins
    assert len({id(d.acc) for d in ds}) == 3  # estimates per request
    ds[0].acc[0][0].add(0, 30)  # the first request's lookups were all rejected ...
    bd.finished(ds[0], [1, 10, 11, 99])
    nxt = bd.for_request("docs", 4, None, 0)[0]
    assert nxt.acc is not ds[0].acc and nxt.acc[0][0].mean == ds[0].acc[0][0].mean < 0.1  # ... the next starts there
    kn.reload([[30, 31, 32]])
    ds[1].begin([2, 21])  # (a request that begins again reads the reloaded documents)
    assert ds[1].lookup([2, 30], 4).tokens == [31, 32]
    assert ds[2].lookup([3, 12], 2).tokens == [13, 14]  # still running: the documents it began with
    later = bd.for_request("docs", 4, None, 2)[0]
    later.begin([5])
    assert later.index is ds[1].index is not index and later.lookup([5, 31], 4).tokens == [32]


def test_auto_drafts_from_the_documents_only_where_the_engine_has_them():
    with_docs = BatchDrafters(max_len=64, docs=_Docs([[10, 11, 12]]))
    names = [s.name for s in with_docs.for_request("auto", None, CostModel(times(s1=0.1)))[0].sources]
    assert names == ["suffix", "docs", "grammar"]
    bare = [s.name for s in BatchDrafters(max_len=64).for_request("auto", None, CostModel(times(s1=0.1)))[0].sources]
    assert bare == ["suffix", "grammar"]
