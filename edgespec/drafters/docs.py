"""The docs drafter: proposals copied from a venue's documents (an engine opened with docs=INDEX).

The whole document store, not only the passages a turn retrieved into its prompt, is one read-only
suffix index over every passage's tokens (docs/answer.py builds it with the index, and a reload
swaps it whole). An answer that quotes any passage, an opening time or a rule word for word, drafts
for free: this is retrieval-based drafting (REST, He et al., NAACL 2024) on the suffix drafter's
machinery (suffix.py): the longest match of the context's tail, its most frequent continuation, each
token's acceptance estimated per (matched length, frequency) and the chain cut where it stops paying.

Unlike the suffix drafter it never writes: requests' own text stays in the suffix index (`auto`
asks both, each quoting its rate), and Engine.reset_cache() forgets only what it learned.

The engine builds a docs drafter per request (engine/batch_drafters.py), all of them over one
`DocsStore`: the documents' index is built once per load of the documents, not per request, and is
only read (a lookup writes nothing), so requests drafting side by side share it safely; each
request's acceptance estimates are its own (seeded from the last finished request's).
"""
from __future__ import annotations

from typing import Sequence

from ..core.costmodel import CostModel
from .base import NEW_REQUEST_KEEP
from .suffix import SuffixDrafter
from .suffix_index import Chain, SuffixIndex


class DocsStore:
    """The documents' suffix index, rebuilt when the documents are reloaded: one per engine, read by
    every docs drafter over it (the engine's, one per request)."""

    def __init__(self, docs):
        """docs: a docs.answer.Docs (its `index`, read again after a reload)."""
        self.docs = docs
        self.generation = docs.generation  # read before the index: a reload in between rebuilds again
        self.index = store(docs.index)

    def current(self) -> SuffixIndex:
        """The index over the documents as they are now (a new object after a reload: drafters
        still holding the old one keep reading it unchanged)."""
        generation = self.docs.generation
        if generation != self.generation:
            self.generation, self.index = generation, store(self.docs.index)
        return self.index

    def __deepcopy__(self, memo) -> "DocsStore":
        """The engine's, not learnt: a drafter's state() keeps it as the same object (drafters/base.py)."""
        return self


class DocsDrafter(SuffixDrafter):
    name = "docs"

    def __init__(self, docs: DocsStore, costs: CostModel | None = None, *, adaptive: bool = True):
        super().__init__(docs.current(), costs, adaptive=adaptive)
        self.docs = docs

    def begin(self, ctx: Sequence[int]) -> None:
        self._scorer.forget()
        for row in self.acc:
            for b in row:
                b.fade(NEW_REQUEST_KEEP)
        self.index = self.docs.current()  # a reload takes effect here, never mid-request

    def sync(self, ctx: Sequence[int]) -> None:
        pass  # the documents only: requests' text is the suffix drafter's

    def record(self, ctx: Sequence[int]) -> None:
        pass

    def forget(self) -> None:
        self._scorer.forget()

    def alternatives(self, ctx: Sequence[int], k: int, width: int) -> list[tuple[list[int], str]]:
        idx = self.index
        return [(c, "docs-alt") for c in idx.alternatives(ctx[-idx.max_match :], k, width)]

    def lookup(self, ctx: Sequence[int], k: int) -> Chain:
        self._scorer.score(ctx)
        chain = self.index.lookup(ctx[-self.index.max_match :], k)
        self._scorer.remember(len(ctx), chain.tokens, self.betas(chain))
        return chain


def store(index) -> SuffixIndex:
    """A suffix index over every passage of a docs.index.Index (a separator between passages)."""
    n = len(index.chunks)
    out = SuffixIndex(max(len(index.ids) + n + 1, 1024))
    for i in range(n):
        out.start_doc()
        out.extend(index.chunk_ids(i))
    out.settle()
    return out
