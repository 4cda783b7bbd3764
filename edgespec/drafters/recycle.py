"""The recycling drafter: the target's own earlier predictions, kept per token id.

Every verify computes the target's full next-token distribution at each position it checks. Those
rows are otherwise thrown away; here, for the token at each verified position, the target's top
candidates for what comes next are kept in a table [vocab, width] (the newest row for a token
replaces the older one). A proposal walks the table from the context's last token: the first
candidate of the last token, then the first candidate of that one, and so on. Text repeats tokens
(and the target predicts the same after them) far more often than it repeats whole spans, so this
drafts where the suffix index has nothing, at no model cost.

Measured sizes: width 4 over the Qwen2.5 vocabulary (151 936 ids) is 2.4 MB of int32. Reading the
top candidates off a row costs ~0.1 ms (a max and one threshold pass over the row; a full
np.argpartition costs ~1 ms per row on the 2-core dev machine, too much at up to 9 rows a round),
so candidates are the ids within RECYCLE_MARGIN logits of the row's best, best first.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.costmodel import CostModel
from ..core.proposal import EMPTY, Proposal
from ..errors import InvalidRequest
from .base import NEW_REQUEST_KEEP, Beta
from .lookup import FreeLookupDrafter, LookupScorer, plan_chain
from .ngram import NGRAM_MIN_GAIN

RECYCLE_WIDTH = 4
RECYCLE_MARGIN = 3.0  # logits below the best: e^-3 = 5 % of its probability at temperature 1
_DEPTH_PRIOR = (0.3, 0.35, 0.4, 0.4, 0.45, 0.45, 0.5, 0.5)


class RecycleDrafter(FreeLookupDrafter):
    """Proposals from the table of the target's earlier top candidates; see the module docstring."""

    name = "recycle"

    def __init__(self, vocab: int, costs: CostModel | None = None, *, width: int = RECYCLE_WIDTH,
                 adaptive: bool = True, table: np.ndarray | None = None):
        """table: a [vocab, width] table shared with other drafters (the engine's requests),
        else its own."""
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
            raise InvalidRequest(f"recycle table: vocab must be a positive integer, got {vocab!r}", param="vocab")
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= 64:
            raise InvalidRequest(f"recycle table: width must be an integer from 1 to 64, got {width!r}",
                                 param="width")
        self.vocab = vocab
        self.width = width
        # [vocab, width]: next-token candidates
        self.table = np.full((vocab, width), -1, dtype=np.int32) if table is None else table
        if self.table.shape != (vocab, width):
            raise InvalidRequest(f"recycle table: shape {self.table.shape} is not ({vocab}, {width})", param="table")
        self.costs = costs
        self.adaptive = adaptive and costs is not None
        self.min_gain = NGRAM_MIN_GAIN
        # acceptance by depth in the chain (given the tokens before it were accepted)
        self.acc = [Beta(p) for p in _DEPTH_PRIOR]
        self._scorer = LookupScorer()

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def forget(self) -> None:
        """Engine.reset_cache(): the table forgets every earlier request."""
        self.table.fill(-1)
        self._scorer.forget()

    def reset(self) -> None:
        self._scorer.forget()

    def set_adaptive(self, on: bool) -> None:
        self.adaptive = on and self.costs is not None

    def begin(self, ctx: Sequence[int]) -> None:
        self._scorer.forget()
        for b in self.acc:
            b.fade(NEW_REQUEST_KEEP)

    def observe(self, rows: np.ndarray, tokens: Sequence[int]) -> None:
        """rows[i] ([len(tokens), V] logits) is the target's prediction after tokens[i] (in the
        verified context). Keeps the top candidates for each token id."""
        for row, tok in zip(rows, tokens):
            tok = int(tok)
            if not 0 <= tok < self.vocab:
                continue
            x = row[: self.vocab]
            best = int(np.argmax(x))
            cand = np.flatnonzero(x >= x[best] - RECYCLE_MARGIN)
            if cand.size > 1:
                cand = cand[np.argsort(-x[cand], kind="stable")][: self.width]
            else:
                cand = np.array([best])
            out = self.table[tok]
            out[:] = -1
            out[: cand.size] = cand

    def chain(self, last: int, k: int) -> list[int]:
        """The first-candidate walk from token `last`, at most k tokens."""
        out: list[int] = []
        t = last
        for _ in range(k):
            if not 0 <= t < self.vocab:
                break
            nxt = int(self.table[t, 0])
            if nxt < 0:
                break
            out.append(nxt)
            t = nxt
        return out

    def lookup(self, ctx: Sequence[int], k: int) -> list[int]:
        self._scorer.score(ctx)
        tokens = self.chain(int(ctx[-1]), min(k, len(self.acc))) if len(ctx) and k > 0 else []
        self._scorer.remember(len(ctx), tokens, self.acc[: len(tokens)])
        return tokens

    def plan(self, tokens: list[int]) -> tuple[int, float]:
        if not tokens:
            return 0, self.costs.target_alone_rate() if self.costs else 0.0
        if not self.adaptive:
            return len(tokens), 0.0
        return plan_chain(self.costs, [b.mean for b in self.acc[: len(tokens)]], self.min_gain)

    def proposal(self, tokens: list[int], k: int) -> Proposal:
        return Proposal(tokens[:k], None, self.name) if k else EMPTY
