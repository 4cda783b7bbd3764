"""A drafter whose proposals cost model steps, and the rate its rounds deliver.

Such a drafter cannot say what a round would buy without paying for it, so it quotes (for `auto`)
the tokens per second its recent rounds delivered: each round's *expected* yield from its
calibrated confidences (far less noisy than the actual yield, so a choice between it and nothing
does not flip on one unlucky rejection) over the measured cost of its draft steps and the verify.
The bookkeeping lives here once; the draft model (model.py) and the test doubles that stand in for it
share it by subclassing, so a double cannot drift from what `auto` reads.

A subclass gives:
    draft(ctx, k, params, rng) -> Proposal       the proposal, setting `last_sizes` (draft steps run)
    learn(proposal, accepted, valid_len)         its own learning and cache rewind
    acceptance(conf) -> float                    P(accepted) of a token proposed with confidence conf
    prior_acceptance() -> float                  its long-run acceptance
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.costmodel import CostModel, chain_tokens
from ..core.proposal import Proposal
from ..core.sampling import SamplingParams
from ..limits import PREFILL_CHUNK
from .base import NEW_REQUEST_KEEP, DrafterBase, Quote

RATE_KEEP = 0.9  # per round: the weight of the earlier rounds in the rate estimate
# A costed round must promise this much more than a plain target step (see ngram.NGRAM_MIN_GAIN);
# more than an n-gram's, since a wrong "yes" also pays for the draft steps.
MODEL_MIN_GAIN = 0.15
CATCH_UP = 2  # tokens a draft catch-up step holds when the drafter is used round after round
# A probe may pay a catch-up costing at most this many 1-token target steps beyond a round's usual
# one (measured step costs). Beyond it the draft's cache is cold: its prompt prefill has not run (it
# runs when a round first uses the draft, so the first token never waits for it), or many plain rounds
# have passed since it last ran, and a probe would pay that mid-decode to learn a rate that earlier
# requests already estimate; a cold drafter is used only when that estimate, with the catch-up priced
# in (catch_up_rate), clears its margin. Bounded by cost, not tokens: on the 2-core dev CPU a 60-token
# catch-up of the 0.5B draft costs ~5 target steps (four such probes were 10 % of a short chat reply),
# on a GPU about one.
PROBE_CATCH_UP_STEPS = 1.0
FIRST_LOOK_ROUNDS = 8  # rounds an engine's draft must have run before cold probes stop
# A reply's length before any has been seen (the CLI's and bench's default max_new_tokens), and the
# weight of the earlier replies in the running estimate, per request. The estimate is the horizon
# over which a catch-up is paid back (CostedDrafter.catch_up_rate).
REPLY_PRIOR = 128
REPLY_KEEP = 0.75


class CostedDrafter(DrafterBase):
    uses_model = True
    min_gain = MODEL_MIN_GAIN

    def __init__(self, costs: CostModel | None):
        self.costs = costs
        self.last_sizes: list[int] = []  # tokens per draft step the last proposal ran (catch-up first)
        self.m_tokens, self.m_seconds = 0.0, 0.0  # recent rounds: expected tokens, seconds (weighted)
        self._round: tuple[int, float] | None = None  # (proposals, draft seconds) of this round
        self.reply_tokens = float(REPLY_PRIOR)  # a reply's length, recent requests weighted
        self.rounds_seen = 0  # rounds it has drafted in this engine (few: its rate is mostly the prior)
        self._prompt_len: int | None = None  # this request's prompt, and the furthest final length
        self._final_len = 0  # its rounds reached (valid_len): the reply's length when the next begins

    # -- hooks ------------------------------------------------------------------------------------
    def draft(self, ctx: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Proposal:
        raise NotImplementedError

    def learn(self, proposal: Proposal, accepted: int, valid_len: int) -> None:
        """Own learning from the verdict; forget cache rows past valid_len."""

    def acceptance(self, conf: float) -> float:
        raise NotImplementedError

    def prior_acceptance(self) -> float:
        raise NotImplementedError

    def catch_up(self, ctx: Sequence[int]) -> int:
        """Tokens of ctx its cache would have to be fed before it can draft (0: no cache of its own)."""
        return 0

    # -- the interface ----------------------------------------------------------------------------
    def begin(self, ctx) -> None:
        if self._prompt_len is not None:
            reply = max(0, self._final_len - self._prompt_len)
            self.reply_tokens = self.reply_tokens * REPLY_KEEP + reply * (1.0 - REPLY_KEEP)
        self._prompt_len = self._final_len = len(ctx)
        if self.costs is not None:
            # start from the old rate, pulled toward what the long-run acceptance predicts for a
            # one-token proposal (one round's worth of evidence): a new text may suit the draft
            # better or worse than the last one
            self.m_tokens = self.m_tokens * NEW_REQUEST_KEEP + 1.0 + self.prior_acceptance()
            self.m_seconds = (self.m_seconds * NEW_REQUEST_KEEP + self.costs.draft_steps([CATCH_UP])
                              + self.costs.verify(2))

    def propose(self, ctx, k, params, rng) -> Proposal:
        self.last_sizes = []
        prop = self.draft(ctx, k, params, rng)
        if self.costs is not None:
            # its cost from the (median) step times, not its own wall time: one burst of another
            # process must not turn the drafter off for the rest of the request. The catch-up step
            # is costed as it would be if the drafter were used every round (CATCH_UP tokens): the
            # question the estimate answers is whether using it from now on pays.
            sizes = list(self.last_sizes)
            i = 0
            while i < len(sizes) and sizes[i] > 1:  # the catch-up (a prompt: one step per chunk)
                sizes[i] = CATCH_UP if i == 0 else 0
                i += 1
            sizes = [x for x in sizes if x]
            self._round = (len(prop.tokens), self.costs.draft_steps(sizes))
        return prop

    def feedback(self, proposal, accepted, valid_len) -> None:
        self._final_len = max(self._final_len, valid_len)
        if self._round is not None:
            n, seconds = self._round
            self._round = None
            self.rounds_seen += 1
            # expected yield from the confidences as calibrated *before* this verdict is learned
            self.m_tokens = self.m_tokens * RATE_KEEP + self.expected_yield(proposal)
            self.m_seconds = self.m_seconds * RATE_KEEP + seconds + self.costs.verify(n + 1)
        self.learn(proposal, accepted, valid_len)

    def expected_yield(self, proposal: Proposal) -> float:
        """Expected tokens from one of its proposals: 1 + sum over j of P(first j all accepted)."""
        return chain_tokens(self.acceptance(c) for c in (proposal.conf if proposal.source == self.name else ()))

    def rate(self) -> float:
        """Expected tokens per second of one of its rounds, from its recent rounds."""
        if self.m_seconds <= 0:  # nothing seen yet: i.i.d. acceptance at the prior mean
            return self.costs.best_k(self.prior_acceptance(), 4)[1]
        return self.m_tokens / self.m_seconds

    def quote(self, ctx: Sequence[int], k: int) -> Quote | None:
        """No proposal (that would cost the draft steps): the rate of its recent rounds, which only
        using it can update, hence `probe`, less what its pending catch-up costs (catch_up_rate)."""
        if self.costs is None:
            return None
        extra = self.catch_up_extra(self.catch_up(ctx))
        # its first looks in an engine may pay a cold catch-up: until FIRST_LOOK_ROUNDS rounds have run,
        # its rate is mostly a prior from the dev machine's ratios, which must not decide for good
        # that it never pays (a rate estimate that stays under the margin would never be tested)
        probe = self.rounds_seen < FIRST_LOOK_ROUNDS or extra <= PROBE_CATCH_UP_STEPS * self.costs.verify(1)
        return Quote(self.catch_up_rate(ctx, k, extra), self.min_gain, None, probe=probe)

    def catch_up_extra(self, pending: int) -> float:
        """Seconds a catch-up of `pending` tokens costs beyond the CATCH_UP tokens a round always feeds."""
        if pending <= CATCH_UP:
            return 0.0
        chunks = [PREFILL_CHUNK] * (pending // PREFILL_CHUNK) + [pending % PREFILL_CHUNK]
        return max(0.0, self.costs.draft_steps([c for c in chunks if c]) - self.costs.draft_steps([CATCH_UP]))

    def catch_up_rate(self, ctx: Sequence[int], k: int, extra: float) -> float:
        """The rate of its rounds over the rest of this reply, counting the catch-up it must run
        first: `extra` seconds (catch_up_extra) of feeding the tokens its cache lacks (a whole prompt
        when it has not run in this request) beyond a round's usual catch-up. Paid once, that catch-up
        is spread over the tokens the reply is expected still to need (the recent replies' length less
        what this one has written, at least the k + 1 tokens of this round), so R tokens cost
        R / rate + catch-up seconds.

        Why: the rate alone prices a round as if the drafter were already caught up. A draft
        model first used in a request must first read the prompt (a 200-token prompt costs the 0.5B
        draft ~0.6 s on the 2-core dev CPU, some 15 target steps) and on a short reply that prefill
        costs more than the draft's rounds save; on a long one it is paid back."""
        rate = self.rate()
        if extra <= 0 or rate <= 0:
            return rate
        written = len(ctx) - (self._prompt_len if self._prompt_len is not None else len(ctx))
        remaining = max(self.reply_tokens - written, k + 1.0)
        return remaining / (remaining / rate + extra)
