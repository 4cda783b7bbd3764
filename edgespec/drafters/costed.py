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

from ..core.costmodel import CostModel, chain_tokens, expected_tokens
from ..core.proposal import EMPTY, Proposal
from ..core.sampling import SamplingParams
from ..limits import PREFILL_CHUNK
from .base import NEW_REQUEST_KEEP, DraftCost, DrafterBase, Quote
from .costed_params import (  # the numbers, each with the measurement behind it
    RATE_KEEP, MODEL_MIN_GAIN, CATCH_UP, PROBE_CATCH_UP_STEPS, FIRST_LOOK_ROUNDS, REPLY_PRIOR, REPLY_KEEP,
    STREAK_PRIOR, STREAK_KEEP, SHARE_PRIOR, SHARE_EVIDENCE, PRIOR_K_MAX, PREFILL_WAIT, PREFILL_MIN_GAIN,
    FIRST_LOOK_PREFILLS, FIRST_LOOK_SHARE, RELOOK_REQUESTS, CAL_PRIOR, TCONF_EVIDENCE, EDGE_MIN_ROUNDS,
    TCONF_MAX,
)
from .tally import Tally, prompt_octave


def target_confidence(rows: np.ndarray) -> np.ndarray:
    """The target's softmax probability of its own best token in each logits row: [rows] from [rows, V]."""
    x = np.asarray(rows, dtype=np.float32)
    return 1.0 / np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1)


class CostedDrafter(DrafterBase):
    uses_model = True
    min_gain = MODEL_MIN_GAIN

    def __init__(self, costs: CostModel | None):
        self.costs = costs
        self.last_sizes: list[int] = []  # tokens per draft step the last proposal ran (catch-up first)
        self.m_tokens, self.m_seconds = 0.0, 0.0  # recent rounds: expected tokens, seconds (weighted)
        self._round: tuple[int, float, float] | None = None  # (proposals, draft s, catch-up s beyond CATCH_UP)
        # recent rounds: seconds of catch-up over other sources' text beyond a round's usual CATCH_UP
        # tokens (weighted like m_seconds; the prompt's prefill, paid once per request, not counted)
        self.m_catch = 0.0
        self._foreign = False  # another source drafted since its last round
        self.reply_tokens = float(REPLY_PRIOR)  # a reply's length, recent requests weighted
        self.rounds_seen = 0  # rounds it has drafted in this engine (few: its rate is mostly the prior)
        self._prompt_len: int | None = None  # this request's prompt, and the furthest final length
        self._final_len = 0  # its rounds reached (valid_len): the reply's length when the next begins
        self.streak_tokens = float(STREAK_PRIOR)  # tokens its streaks of rounds wrote, recent ones weighted
        self._streak = 0  # tokens of the streak running now (0: the last round did not use it)
        self._ran = False  # it has drafted in this request (its cache holds the prompt)
        self.share = SHARE_PRIOR  # the share of a reply its rounds wrote, recent requests weighted
        self._wrote = 0  # tokens its rounds wrote in this request
        self._others = 0  # tokens other sources' accepted proposals wrote in this request
        self.cold_looks = 0  # cold prompt prefills paid in its first looks in this engine (FIRST_LOOK_PREFILLS)
        self.idle_requests = 0  # requests in a row, up to the last one, in which it did not run
        self._tconf = [0.0, 0]  # this reply: the target's confidence in its tokens, summed, and how many
        self.cal_ok = self.cal_conf = CAL_PRIOR  # its judged tokens: accepted, the target's confidence summed
        self._judged = (0, 0)  # (tokens, accepted) of its own proposal the last verify judged
        self._tally = Tally()  # this request's rounds, its own and the others' (edge)
        self._quoted: int | None = None  # the context length of its last quote, until its next proposal
        self.edges: dict[int, Tally] = {}  # per prompt octave: the same over the requests it ran in (edge)

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
            if self._ran and reply > 0:
                self.share = self.share * REPLY_KEEP + min(1.0, self._wrote / reply) * (1.0 - REPLY_KEEP)
            self.idle_requests = 0 if self._ran else self.idle_requests + 1
            if self._ran and self._tally.both_ran():
                octave = prompt_octave(self._prompt_len)
                self.edges[octave] = self.edges.get(octave, Tally()).folded(self._tally, REPLY_KEEP)
        self._tally, self._quoted = Tally(), None
        self._wrote = self._others = 0
        self._tconf = [0.0, 0]
        self._prompt_len = self._final_len = len(ctx)
        self._end_streak()
        self._ran = False
        if self.costs is not None:
            # start from the old rate, pulled toward the round its long-run acceptance buys at its
            # best chain length (capability_round: one round's worth of evidence): a new text may
            # suit the draft better or worse than the last one
            tokens, seconds = self.capability_round()
            self.m_tokens = self.m_tokens * NEW_REQUEST_KEEP + tokens
            old = self.m_seconds
            self.m_seconds = self.m_seconds * NEW_REQUEST_KEEP + seconds
            # the catch-ups keep their share of a round's seconds: how `auto` mixes sources is a
            # habit of the engine's traffic more than of one text
            self.m_catch = self.m_catch * self.m_seconds / old if old > 0 else 0.0

    def propose(self, ctx, k, params, rng) -> Proposal:
        self.last_sizes = []
        self._round = None
        warm = self._ran
        quoted, self._quoted = self._quoted == len(ctx), None  # `auto` chose it on this round's quote
        if not warm and not quoted and self._prefill_cannot_pay(ctx, k):
            return EMPTY
        if (not warm and self.costs is not None and self.rounds_seen < FIRST_LOOK_ROUNDS
                and self.catch_up_extra(self.catch_up(ctx)) > 0):
            self.cold_looks += 1
        prop = self.draft(ctx, k, params, rng)
        self._ran = True
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
            seconds = self.costs.draft_steps(sizes)
            # a catch-up over text other sources drafted: what returning to it after their rounds
            # costs beyond the usual (not after plain rounds: those are where it did not pay, and
            # counting them would make a marginal draft look worse the less it is used)
            catch = 0.0
            if warm and self._foreign:
                catch = max(0.0, self.costs.draft_steps(self.last_sizes) - seconds)
            self._foreign = False
            self._round = (len(prop.tokens), seconds, catch)
        return prop

    def _prefill_cannot_pay(self, ctx: Sequence[int], k: int) -> bool:
        """Whether its first round in this request should not run: adaptive, past its first looks in
        this engine (FIRST_LOOK_ROUNDS), and the prompt it would first have to read turns a rate that
        beats the target alone's into one over the reply expected (catch_up_rate) that does not.
        Then it proposes nothing, and asks again next round (the reply may run longer than recent
        ones did).

        Why: `--draft model` on retrieval prompts (700-870 prompt tokens, 4-17 token answers) ran at
        0.18x the target alone: the draft read the whole prompt to propose 4 tokens. `auto` never
        chooses it there (the same price is in its quote); alone, nothing else weighed it.
        So a proposal `auto` asks for on this round's quote skips it: that quote priced the prefill
        from this reply's evidence (cold_rate), or was a look meant to pay it. Measured (pinned-cost
        replay, docs/speed.md round ten): with this check second-guessing it from the rate of other
        texts, every relook was declined and `auto` never ran the draft on code writing's second pass.
        Alone, after RELOOK_REQUESTS requests declined in a row it runs one (a look): its rate moves
        only when it runs, so one dip just over the target's kept `--draft model` off for good
        (replayed: no draft from the 21st of 32 prompts on, 1.05x over all of them; 1.12x with the look)."""
        if self.costs is None or not getattr(self, "adaptive", True) or self.rounds_seen < FIRST_LOOK_ROUNDS \
                or self.idle_requests >= RELOOK_REQUESTS:
            return False
        extra = self.catch_up_extra(self.catch_up(ctx))
        if extra <= 0:
            return False
        base = self.costs.target_alone_rate()
        # only where the prefill is what loses: a draft that does not pay even caught up was still
        # asked for (`--draft model`), and its adaptive rounds keep their own cost in check
        return self.rate() >= base > self.catch_up_rate(ctx, k, extra)

    def feedback(self, proposal, accepted, valid_len) -> None:
        self._final_len = max(self._final_len, valid_len)
        if self._round is not None:
            n, seconds, catch = self._round
            self._round = None
            self.rounds_seen += 1
            # expected yield from the confidences as calibrated *before* this verdict is learned
            self.m_tokens = self.m_tokens * RATE_KEEP + self.expected_yield(proposal)
            self.m_seconds = self.m_seconds * RATE_KEEP + seconds + self.costs.verify(n + 1)
            self.m_catch = self.m_catch * RATE_KEEP + catch
            if proposal.source == self.name and proposal.tokens:
                self._judged = (min(len(proposal.tokens), accepted + 1), accepted)
            wrote = (accepted if proposal.source == self.name else 0) + 1
            t = self._tally
            t.own_tokens += wrote
            t.own_seconds += seconds + catch + self.costs.verify(n + 1)
            t.own_rounds += 1
            self._streak += wrote
            self._wrote += wrote
        else:  # a round it did not draft: a streak of its rounds, if one ran, is over
            self._end_streak()
            if proposal.tokens and proposal.source != self.name:
                self._foreign = True
                self._others += accepted
            if self.costs is not None:
                self._tally.other_tokens += accepted + 1
                self._tally.other_seconds += self.costs.verify(len(proposal.tokens) + 1)
        self.learn(proposal, accepted, valid_len)

    def observe(self, rows: np.ndarray, tokens: Sequence[int]) -> None:
        """The target's confidence in each token the round wrote (rows[i], [len(tokens), V], predicts
        the token after tokens[i]): this reply's predictability, and against its own judged tokens
        the calibration of that for this pair (CAL_PRIOR)."""
        judged, accepted = self._judged  # set only by a round it drafted, so only once it has run
        self._judged = (0, 0)
        if self.costs is None or len(rows) == 0:
            return
        # the reply's confidence is read only until it runs in this request (quote's `cold`): after
        # that only its judged rows are scored (each row's softmax costs ~0.3 ms at a 152k vocabulary)
        if not self._ran and self._tconf[1] < TCONF_MAX:
            conf = target_confidence(rows)
            self._tconf[0] += float(conf.sum())
            self._tconf[1] += len(conf)
        elif judged:
            self.cal_conf += float(target_confidence(rows[:judged]).sum())
            self.cal_ok += accepted

    def reply_acceptance(self) -> float:
        """Its acceptance to expect on this reply: the long-run one moved toward what the target's
        confidence in the reply so far predicts (TCONF_EVIDENCE in costed_params.py)."""
        a0 = self.prior_acceptance()
        total, n = self._tconf
        if n == 0:
            return a0
        a = min(1.0, self.cal_ok / self.cal_conf * total / n)
        w = n / (n + TCONF_EVIDENCE)
        return (1.0 - w) * a0 + w * a

    def _end_streak(self) -> None:
        if self._streak:
            self.streak_tokens = self.streak_tokens * STREAK_KEEP + self._streak * (1.0 - STREAK_KEEP)
            self._streak = 0

    def capability_round(self, a: float | None = None) -> tuple[float, float]:
        """One round as its long-run acceptance (or `a`: a reply's, cold_rate) says its adaptive
        rounds go: (expected tokens, seconds) at the best chain length for that acceptance
        (CostModel.best_k, at most PRIOR_K_MAX), its catch-up step and draft steps and the verify.

        Why not a one-token round: under `auto` a draft is used only where its rate clears its margin,
        and a prior that prices it at k = 1 (measured on the dev CPU: 1.10x the target alone, under
        the 15 % margin) kept it from ever being chosen in an engine that had not seen it run
        alone: on code it wrote `auto` down to 1.03x where the draft alone ran 1.22x."""
        a = self.prior_acceptance() if a is None else a
        k = max(1, self.costs.best_k(a, PRIOR_K_MAX)[0])
        sizes = [CATCH_UP] + [1] * (k - 1)
        return expected_tokens(k, a), self.costs.draft_steps(sizes) + self.costs.verify(k + 1)

    def expected_yield(self, proposal: Proposal) -> float:
        """Expected tokens from one of its proposals: 1 + sum over j of P(first j all accepted)."""
        return chain_tokens(self.acceptance(c) for c in (proposal.conf if proposal.source == self.name else ()))

    def rate(self) -> float:
        """Expected tokens per second of one of its rounds, from its recent rounds, counting the
        catch-ups over other sources' text those rounds paid: where `auto` keeps returning to it for
        a round or two between other sources' streaks, each return pays one, and a rate that left
        them out (measured: 5.8 ms of catch-up per decoded token on code, 17 % of `auto`'s decode)
        kept choosing it where the suffix index alone ran 6 % faster."""
        if self.m_seconds <= 0:  # nothing seen yet: i.i.d. acceptance at the prior mean
            return self.costs.best_k(self.prior_acceptance(), 4)[1]
        return self.m_tokens / (self.m_seconds + self.m_catch)

    def cost(self, ctx: Sequence[int]) -> DraftCost | None:
        """Its draft steps' measured seconds: the first one feeds whatever of ctx its cache lacks."""
        if self.costs is None:
            return None
        self._quoted = len(ctx)  # `auto` priced this round: a proposal it asks for is not second-guessed
        one = self.costs.draft_step()
        pending = self.catch_up(ctx)
        return DraftCost(self.costs.draft_step(pending) if pending > 1 else one, one, self.prior_acceptance())

    def quote(self, ctx: Sequence[int], k: int) -> Quote | None:
        """No proposal (that would cost the draft steps): the rate of its recent rounds, which only
        using it can update, hence `probe`, less what its pending catch-up costs (catch_up_rate)."""
        self._quoted = len(ctx)
        if self.costs is None:
            return None
        extra = self.catch_up_extra(self.catch_up(ctx))
        written = self.written(ctx)
        cold = extra > 0 and not self._ran  # its first round in this request would read the prompt
        if cold and written < PREFILL_WAIT:
            return Quote(0.0, self.min_gain, None, probe=False)
        # its first looks in an engine may pay a long catch-up: until FIRST_LOOK_ROUNDS rounds have run,
        # its rate is mostly a prior, which must not decide for good that it never pays (a rate
        # estimate that stays under the margin would never be tested); a cold prompt prefill only
        # FIRST_LOOK_PREFILLS times, or after RELOOK_REQUESTS requests without it, and only in a
        # reply the other sources have not written most of
        young = self.rounds_seen < FIRST_LOOK_ROUNDS
        if cold:
            look = ((young and self.cold_looks < FIRST_LOOK_PREFILLS) or self.idle_requests >= RELOOK_REQUESTS) \
                and self.own_share(written) >= FIRST_LOOK_SHARE
        else:
            look = young
        probe = look or extra <= PROBE_CATCH_UP_STEPS * self.costs.verify(1)
        rate = self.cold_rate() * self.edge() if cold else self.rate()
        gain = max(self.min_gain, PREFILL_MIN_GAIN) if cold and not self._tconf[1] else self.min_gain
        return Quote(self.catch_up_rate(ctx, k, extra, rate), gain, None, probe=probe)

    def cold_rate(self) -> float:
        """Its rounds' rate on this reply before it has run in it: the capability round at the
        acceptance the target's confidence in the reply predicts (reply_acceptance), with the share
        of a round's time its recent catch-ups over other sources' text took.

        Why not its recent rounds' rate: they ran on other texts. Measured: in the bench's second pass
        `auto` never ran the draft on two code-writing replies the draft alone ran 1.26x and 1.34x,
        because its rate still held the chat replies before them."""
        tokens, seconds = self.capability_round(self.reply_acceptance())
        catch = self.m_catch / self.m_seconds if self.m_seconds > 0 else 0.0
        return tokens / (seconds * (1.0 + catch))

    def edge(self) -> float:
        """Its rounds' rate over the other sources' rounds' in recent replies to prompts as long as this
        request's, at most 1 (1 before EDGE_MIN_ROUNDS of its rounds): what a cold quote is scaled by."""
        return self.edges.get(prompt_octave(self._prompt_len or 0), Tally()).edge(EDGE_MIN_ROUNDS)

    def written(self, ctx: Sequence[int]) -> int:
        """Tokens of ctx past this request's prompt: what the reply has written so far."""
        return len(ctx) - (self._prompt_len if self._prompt_len is not None else len(ctx))

    def own_share(self, written: int) -> float:
        """The share of this reply's `written` tokens that other sources' proposals did not write."""
        return max(0.0, 1.0 - self._others / written) if written > 0 else 1.0

    def request_share(self, written: int) -> float:
        """The share of this reply's rest its rounds can expect to write: the recent requests'
        (`share`), moved toward what this reply has shown so far, the tokens other sources' proposals
        did not write (SHARE_EVIDENCE tokens of it weigh as much as the recent requests).

        Why: a copying reply shows itself in its first rounds. Measured on code completion, `auto`
        paid the draft's 190-token prompt prefill for one model round in a reply the suffix index
        then copied whole (its recent requests said the draft writes most of a reply)."""
        if written <= 0:
            return self.share
        own = self.own_share(written)
        w = written / (written + SHARE_EVIDENCE)
        return (1.0 - w) * self.share + w * own

    def catch_up_extra(self, pending: int) -> float:
        """Seconds a catch-up of `pending` tokens costs beyond the CATCH_UP tokens a round always feeds."""
        if pending <= CATCH_UP:
            return 0.0
        chunks = [PREFILL_CHUNK] * (pending // PREFILL_CHUNK) + [pending % PREFILL_CHUNK]
        return max(0.0, self.costs.draft_steps([c for c in chunks if c]) - self.costs.draft_steps([CATCH_UP]))

    def catch_up_rate(self, ctx: Sequence[int], k: int, extra: float, rate: float | None = None) -> float:
        """The rate of its rounds over the rest of this reply, counting the catch-up it must run
        first: `extra` seconds (catch_up_extra) of feeding the tokens its cache lacks (a whole prompt
        when it has not run in this request) beyond a round's usual catch-up. Paid once, that catch-up
        is spread over the tokens the reply is expected still to need (the recent replies' length less
        what this one has written, at least the k + 1 tokens of this round), so R tokens cost
        R / rate + catch-up seconds.

        Why: the rate alone prices a round as if the drafter were already caught up. A draft
        model first used in a request must first read the prompt (a 200-token prompt costs the 0.5B
        draft ~0.6 s on the 2-core dev CPU, some 15 target steps) and on a short reply that prefill
        costs more than the draft's rounds save; on a long one it is paid back.

        Once it has run in this request, what it must catch up on is the text other sources wrote
        since its last round, and `auto` returns to it for a streak of rounds before the next switch:
        that catch-up is spread over the streak its recent streaks ran (STREAK_PRIOR tokens before
        any ended), at most the reply left; a cold prompt prefill over the share of the reply left
        its rounds wrote in recent requests that used it (`share`). Measured: on code, `auto` spent
        5.8 ms per decoded token (17 % of its decode) catching the draft up on text the suffix index
        wrote, and ran 6 % behind the suffix index alone. `rate`: its rounds' rate (default: rate())."""
        rate = self.rate() if rate is None else rate
        if extra <= 0 or rate <= 0:
            return rate
        written = self.written(ctx)
        remaining = self.reply_tokens - written
        if self._ran:  # caught up on the prompt already: this catch-up is over other sources' text
            remaining = max(min(remaining, self.streak_tokens), 1.0)
        else:  # the prompt: paid back over the share of the reply left that its rounds will write
            remaining = max(remaining * self.request_share(written), k + 1.0)
        return remaining / (remaining / rate + extra)
