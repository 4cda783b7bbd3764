"""Draft heads on the target's own hidden state (`--draft heads`, bundles exported with `--heads`):
Medusa heads here, the feature drafter (`--heads feature`) in feature.py on the same base.

The target graph returns the final hidden state of its logits rows (graph contract v3), so after
any round the runner holds h at the position of the context's second-to-last token: the state whose
logits chose the last token. The heads graph (export/edgespec_export/heads*.py) maps that one row
to n rows of logits over a kept vocabulary: head i scores the token *after* the last one plus i.
One heads run proposes a chain of up to n tokens and costs a few percent of a target step
(no KV cache, no catch-up, nothing to rewind).

Sizing: as the draft model does, acceptance is learned per (head, confidence bin), starting from the
held-out top-1 the export measured, and the chain length maximises expected tokens per second
(measured heads time + measured verify time). `auto` prices it like the draft model (Drafter.cost):
its measured run time, at the acceptance `auto` has seen from it.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..core.costmodel import CostModel
from ..core.proposal import EMPTY, Proposal
from ..core.slot import Slot
from ..core.steptimes import StepTimes
from ..core.sampling import SamplingParams
from .base import Beta, DraftCost, DrafterBase
from .model import CONF_MIDS, check_vocab_map, conf_bin, pick

HEADS_INPUT = "hidden"  # the heads graph's input [rows, hidden] and output [rows, n_heads, kept]
NO_HEADS = ("bundle {name} has no draft heads: export it with `edgespec export ... --heads feature` (or medusa) "
            "(docs/export.md, \"Draft heads\")")


class ChainHeads(DrafterBase):
    """What the Medusa heads and the feature drafter (feature.py) share: a graph over the target
    runner's last hidden row proposing a chain, acceptance per (chain position, confidence bin)
    from the export's held-out top-1, the chain sized by measured cost. A subclass gives draft()
    (setting last_sizes), warmup() and draft_cost(n): seconds to draft n tokens."""

    name = "heads"
    uses_model = True

    def __init__(self, target: Slot, session, vocab_map, usable: int, n_heads: int, *,
                 priors: Sequence[float] = (), adaptive: bool = True):
        self.times = StepTimes()  # the heads graph's run times (the cost model's "draft step")
        self.costs = CostModel(target.times, self.times)
        self.last_sizes: list[int] = []  # the graph runs the last proposal made (one entry a run)
        self.target = target
        self.session = session
        self.n_heads = n_heads
        self.usable = usable
        self.vocab_map = check_vocab_map(vocab_map, len(vocab_map), usable)
        self.scored = len(self.vocab_map)
        self.adaptive = adaptive
        priors = list(priors) + [0.3] * n_heads
        # acceptance by (head, confidence bin): the export's held-out top-1 sets the level, the
        # head's own confidence the spread
        self.by_conf = [[Beta(float(np.clip(0.5 * (priors[i] + m), 0.02, 0.98))) for m in CONF_MIDS]
                        for i in range(n_heads)]
        self.mean = [Beta(float(np.clip(priors[i], 0.02, 0.98)), weight=8.0) for i in range(n_heads)]

    # -- the interface ----------------------------------------------------------------------------
    def set_adaptive(self, on: bool) -> None:
        self.adaptive = on

    def draft_cost(self, n: int) -> float:
        raise NotImplementedError

    def cost(self, ctx: Sequence[int]) -> DraftCost | None:
        """No cache to catch up: the first token costs one run, each further one what a longer chain adds."""
        one = self.draft_cost(1)
        return DraftCost(one, self.draft_cost(2) - one, self.mean[0].mean)

    def propose(self, ctx, k, params, rng) -> Proposal:
        self.last_sizes = []
        return self.draft(ctx, k, params, rng)

    def draft(self, ctx, k, params: SamplingParams, rng) -> Proposal:
        raise NotImplementedError

    def _proposal(self, tokens: list[int], confs: list[float], qs: list) -> Proposal:
        if not tokens:
            return EMPTY
        return Proposal(tokens, np.stack(qs) if qs else None, self.name, confs,
                        accept=[self.by_conf[i][conf_bin(c)].mean for i, c in enumerate(confs)])

    def _expected(self, confs: list[float]) -> tuple[list[float], float]:
        """Expected tokens a verify of the chain's first n proposals gives, n = 0..len(confs), and
        P(all of them accepted)."""
        e, p_all = [1.0], 1.0
        for i, c in enumerate(confs):
            p_all *= self.by_conf[i][conf_bin(c)].mean
            e.append(e[-1] + p_all)
        return e, p_all

    def _best_rate(self, confs: list[float]) -> tuple[int, float]:
        """The chain length with the most expected tokens per second, its draft cost already paid, and that rate."""
        e, _ = self._expected(confs)
        d = self.draft_cost(len(confs))
        rates = [e[n] / (d + self.costs.verify(n + 1)) for n in range(len(e))]
        n = int(np.argmax(rates))  # the shortest of equals
        return n, rates[n]

    def _best_length(self, confs: list[float]) -> int:
        return self._best_rate(confs)[0]

    def feedback(self, proposal, accepted, valid_len) -> None:
        if proposal.source != self.name or not proposal.tokens:
            return
        for i, c in enumerate(proposal.conf[: accepted + 1]):  # tokens after the first rejection were never judged
            ok = i < accepted
            self.by_conf[i][conf_bin(c)].add(ok, not ok)
            self.mean[i].add(ok, not ok)


class HeadsDrafter(ChainHeads):
    """Medusa heads over the target runner's last hidden row; see the module docstring."""

    def draft_cost(self, n: int) -> float:
        return self.costs.draft_step()  # one run gives every head's row

    def warmup(self) -> None:
        """Times the heads graph twice, so the cost model starts from this device's cost."""
        h = np.zeros((1, self.session.get_inputs()[0].shape[1]), dtype=np.float32)
        for _ in range(3):
            self._run(h)

    # -- drafting ---------------------------------------------------------------------------------
    def _run(self, h: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        out = self.session.run(None, {HEADS_INPUT: h})[0][0]  # [n_heads, kept]
        self.times.add(1, time.perf_counter() - t0)
        return out

    def draft(self, ctx, k, params: SamplingParams, rng) -> Proposal:
        p = len(ctx) - 2
        h = self.target.hidden_row(p, ctx[p]) if k > 0 and p >= 0 else None
        if h is None:  # the target's last step did not compute this position (a tree round): skip one round
            return EMPTY
        rows = self._run(h.reshape(1, -1))
        self.last_sizes.append(1)
        tokens, confs, qs = [], [], []
        for j in range(min(k, self.n_heads)):
            t, c, q, _ = pick(rows[j], params, rng, self.scored, self.usable, self.vocab_map)
            tokens.append(t)
            confs.append(c)
            if q is not None:
                qs.append(q)
        if self.adaptive and tokens:
            n = self._best_length(confs)
            del tokens[n:], confs[n:], qs[n:]
        return self._proposal(tokens, confs, qs)

