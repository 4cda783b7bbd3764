"""What a drafter hands to a speculative round (core's side of the drafter seam).

It lives in core, not with the drafters, because the round (speculative.py) reads it and data flows
from core to the drafters, never back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from .sampling import SamplingParams


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    # Draft distributions the tokens were sampled from, [len(tokens), usable]; None means the
    # proposal is deterministic (greedy model drafts, n-gram): rejection sampling then uses q one-hot.
    q: np.ndarray | None = None
    source: str = "none"  # "model" | "suffix" | "recycle" | "ngram" | "none"
    conf: list[float] = field(default_factory=list)  # draft's probability of each token (model)
    ngram: int = 0  # length of the matched suffix (ngram)
    # the drafter's estimate that token j is accepted given all before it were (empty: none); a
    # batched round reads it to choose how many tokens every row carries (engine/round_shape.py)
    accept: list[float] = field(default_factory=list)
    # tree verification (engine/tree_round.py): per drafted position, the draft's next best tokens
    # other than the one drafted, (token, probability), when the round asked for them (set_tree_width)
    alts: list[list[tuple[int, float]]] = field(default_factory=list)
    draft_s: float = 0.0  # seconds its draft steps cost, priced from measured step times (0: free)


EMPTY = Proposal()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists (prefix reuse of every cache)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


class Proposer(Protocol):
    """The part of a drafter a round uses (the whole interface is edgespec.drafters.base.Drafter)."""

    def propose(self, ctx: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal: ...

    def feedback(self, proposal: Proposal, accepted: int, valid_len: int) -> None: ...
