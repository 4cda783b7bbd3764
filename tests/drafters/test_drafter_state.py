"""A drafter's learnt numbers go out through stats() and state(), and come back through load_state():
what /metrics and the bench read instead of a drafter's attributes (drafters/base.py)."""
from __future__ import annotations

from edgespec.core.costmodel import CostModel
from edgespec.drafters import AutoDrafter, SuffixDrafter
from edgespec.drafters.base import Beta, DrafterBase
from edgespec.drafters.suffix_index import SuffixIndex

from helpers.costs import times


def _suffix(capacity=64):
    return SuffixDrafter(SuffixIndex(capacity), CostModel(times(), None))


def test_suffix_stats_report_its_index_and_its_acceptance():
    d = _suffix(32)
    d.begin([1, 2, 3, 4, 5])
    d.end([1, 2, 3, 4, 5, 6, 7])
    st = d.stats()
    assert st["index_tokens"] == len(d.index) == 7
    assert st["index_capacity"] == 32 and st["index_evicted"] == 0 and st["index_bytes"] == d.index.nbytes
    assert st["acceptance"][0][0] == d.acc[0][0].mean


def test_the_default_stats_report_nothing_learnt():
    assert DrafterBase().stats() == {}


def test_load_state_restores_what_was_learnt_and_keeps_what_is_not_shared():
    d = _suffix()
    index, costs = d.index, d.costs
    before = d.acc[2][1].mean
    saved = d.state()
    for _ in range(30):
        d.acc[2][1].add(1.0, 0.0)
    assert d.acc[2][1].mean > before + 0.1
    d.load_state(saved)
    assert d.acc[2][1].mean == before
    assert d.index is index and d.costs is costs  # the text and the measured costs are the engine's
    d.acc[2][1].add(1.0, 0.0)
    d.load_state(saved)  # one state loads any number of times: loading copies it
    assert d.acc[2][1].mean == before


def test_auto_state_keeps_its_sources_as_the_same_drafters():
    src = _suffix()
    auto = AutoDrafter(CostModel(times(), None), [src])
    auto.posteriors["model"] = Beta(0.5)
    saved = auto.state()
    auto.posteriors["model"].add(10.0, 0.0)
    auto.reply = 999.0
    auto.load_state(saved)
    assert auto.sources[0] is src and auto.posteriors["model"].mean == 0.5 and auto.reply != 999.0
    assert auto.stats()["acceptance"] == {"model": 0.5}


def test_docs_state_keeps_the_documents_and_restores_the_estimates():
    """The docs drafter's state() copies its estimates, never the documents' index or the documents
    (a Docs holds a lock: a copy would fail, and the documents are the engine's)."""
    import threading

    from edgespec.drafters.docs import DocsDrafter, DocsStore

    class Index:
        chunks, ids = [0], [5, 6, 7]

        @staticmethod
        def chunk_ids(i):
            return [5, 6, 7]

    class Docs:  # what the docs drafter reads of docs.answer.Docs, lock included
        def __init__(self):
            self.generation, self.index, self.lock = 0, Index, threading.Lock()

    store = DocsStore(Docs())
    d = DocsDrafter(store, CostModel(times(), None))
    before = d.acc[2][1].mean
    saved = d.state()
    d.acc[2][1].add(1.0, 0.0)
    d.load_state(saved)
    assert d.acc[2][1].mean == before and d.docs is store and d.index is store.index
    assert d.lookup([1, 5], 2).tokens == [6, 7]
