"""Drafters propose the next few tokens cheaply; the target checks them all in one pass.

One small interface for all of them:

    propose(ctx, k, params, rng) -> Proposal   # at most k tokens that may follow ctx
    feedback(proposal, accepted, valid_len)    # learn from the verdict; forget cache rows past valid_len
    begin(ctx)                                 # a new request starts (may share a prefix with the last)

- `NoDrafter`     proposes nothing: plain target decoding through the same loop.
- `NgramDrafter`  prompt lookup: the longest suffix of ctx (n = max_n .. 1) that occurred earlier in
                  prompt + output proposes what followed it then. Costs no model step at all.
- `ModelDrafter`  runs the small draft model on its own KV cache. With `adaptive`, it stops drafting
                  as soon as its own confidence says one more token is not worth its cost.
- `AutoDrafter`   per round, picks n-gram, model or nothing by expected tokens per second from the
                  measured costs (costmodel.py) and the acceptance it has seen, and keeps learning.

Proposals are lossless whatever they contain: the target accepts only what it would have produced
(greedy) or corrects the distribution (rejection sampling, speculative.py). Drafters only decide
speed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .costmodel import CostModel
from .runner import ModelRunner
from .sampling import SamplingParams, probs, sample

DRAFT_MODES = ("auto", "model", "ngram", "none")
MODEL_RATE_KEEP = 0.9  # per model round: the weight of the earlier rounds in its rate estimate
# Drafting must promise this much more than a plain target step before a round drafts: the
# estimates are noisy (step times under interference, acceptance from few rounds), a wrong "yes"
# costs a longer verify (and draft steps), a wrong "no" costs nothing against the target alone.
NGRAM_MIN_GAIN = 0.10
MODEL_MIN_GAIN = 0.15
NEW_REQUEST_KEEP = 0.25  # weight of past requests' evidence when a request starts
PREFILL_CHUNK = 512  # tokens per prefill step: bounds activation memory on long prompts


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    # Draft distributions the tokens were sampled from, [len(tokens), usable]; None means the
    # proposal is deterministic (greedy model drafts, n-gram): rejection sampling then uses q one-hot.
    q: np.ndarray | None = None
    source: str = "none"  # "model" | "ngram" | "none"
    conf: list[float] = field(default_factory=list)  # draft's probability of each token (model)
    ngram: int = 0  # length of the matched suffix (ngram)


EMPTY = Proposal()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


class Beta:
    """A running acceptance probability: a Beta posterior whose old evidence fades (weight `keep`
    per update), so the estimate follows the text as it changes from prose to code and back."""

    __slots__ = ("a", "b", "keep")

    def __init__(self, mean: float, weight: float = 4.0, keep: float = 0.97):
        self.a, self.b, self.keep = mean * weight, (1.0 - mean) * weight, keep

    @property
    def mean(self) -> float:
        return self.a / (self.a + self.b)

    def fade(self, keep: float) -> None:
        """Keeps the estimate but weakens its evidence, so new evidence moves it faster."""
        self.a *= keep
        self.b *= keep

    def add(self, hits: float, misses: float) -> None:
        self.a = self.a * self.keep + hits
        self.b = self.b * self.keep + misses


class Drafter:
    name = "none"

    def begin(self, ctx: Sequence[int]) -> None:
        """A new request starts; ctx is its prompt."""

    def propose(self, ctx: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Proposal:
        return EMPTY

    def feedback(self, proposal: Proposal, accepted: int, valid_len: int) -> None:
        """`accepted` of proposal.tokens were accepted; the first `valid_len` tokens of the context
        are now final, so any cache rows past them are stale."""


class NoDrafter(Drafter):
    name = "none"


# --- n-gram prompt lookup ------------------------------------------------------------------------
def ngram_lookup(ctx: Sequence[int] | np.ndarray, k: int, max_n: int = 5, min_n: int = 1) -> tuple[list[int], int]:
    """Finds the longest suffix of ctx (max_n down to min_n tokens) that occurred earlier and returns
    up to k tokens that followed its latest earlier occurrence, preferring one with k tokens after
    it, and the matched length n. ([], 0) when nothing matches."""
    tokens, n, _ = ngram_match(ctx, k, max_n, min_n)
    return tokens, n


def ngram_match(ctx: Sequence[int] | np.ndarray, k: int, max_n: int = 5, min_n: int = 1
                ) -> tuple[list[int], int, int]:
    """ngram_lookup, plus where the proposal is copied from: the index in ctx of its first token
    (-1 when nothing matches). len(ctx) - that index is the copy's distance back, the same from
    round to round while the text keeps copying one span."""
    a = np.asarray(ctx, dtype=np.int64)
    length = a.shape[0]
    if k <= 0 or length < 2:
        return [], 0, -1
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = sliding_window_view(a[: length - 1], n)  # [length-n, n]; window i = a[i:i+n], followed by a[i+n]
        hits = np.flatnonzero((windows == a[length - n :]).all(axis=1))
        if hits.size == 0:
            continue
        full = hits[hits + n + k <= length]
        i = int(full[-1] if full.size else hits[-1])
        return a[i + n : i + n + k].tolist(), n, i + n
    return [], 0, -1


class NgramDrafter(Drafter):
    """Proposes what followed the longest earlier match of the context's suffix.

    With `adaptive`, it proposes only as many tokens as pay off given how often matches of this
    length were right (an n-gram copy either is being copied or not: the first token is the
    uncertain one, hence separate first/next acceptance). Lookups cost nothing, so every round's
    lookup is scored against the text the target then verified, whether or not it was proposed:
    the estimates stay current even while another drafter is in use.

    A match that copies from the same distance back as the last round's match continues the span
    the text is copying (a refactor resuming after an edited name, a quoted block): its first token
    is far more likely right than a fresh match of the same length, so it has its own estimate."""

    name = "ngram"

    def __init__(self, costs: CostModel | None = None, *, adaptive: bool = True, max_n: int = 5):
        self.costs = costs
        self.adaptive = adaptive and costs is not None
        self.max_n = max_n
        self.min_gain = NGRAM_MIN_GAIN
        # priors: a one-token match is a weak hint, three or more tokens a strong one
        self.first = {n: Beta(m) for n, m in ((1, 0.2), (2, 0.35), (3, 0.45), (4, 0.5), (5, 0.55))}
        self.next = Beta(0.75)
        self.cont = Beta(0.7)  # first token of a match that continues the last match's span
        self.use_cont = True
        self._distance: int | None = None  # len(ctx) - source index of the last match
        self.last_cont = False  # the last lookup continued the span before it
        # (position, lookup, first-token estimate) of the last lookup, to score next round
        self._pending: tuple[int, list[int], Beta] | None = None

    def first_beta(self, n: int) -> Beta:
        return self.first[min(n, max(self.first))]

    def begin(self, ctx) -> None:
        # a new text copies more or less than the last one: start from the old estimates, but
        # let this request's own lookups take over quickly
        self._pending = None
        self._distance = None
        for b in (*self.first.values(), self.next, self.cont):
            b.fade(NEW_REQUEST_KEEP)

    def lookup(self, ctx: Sequence[int], k: int) -> tuple[list[int], int]:
        """The lookup for this round; also scores the previous round's lookup against what the
        target verified since (ctx[pos:])."""
        self._score(ctx)
        tokens, n, src = ngram_match(ctx, k, self.max_n)
        self.last_cont = False
        if tokens:
            d = len(ctx) - src
            self.last_cont = self.use_cont and d == self._distance
            self._distance = d
        self._pending = (len(ctx), tokens, self._first_estimate(n)) if tokens else None
        return tokens, n

    def _first_estimate(self, n: int) -> Beta:
        return self.cont if self.last_cont else self.first_beta(n)

    def _score(self, ctx: Sequence[int]) -> None:
        if self._pending is None:
            return
        pos, tokens, first = self._pending
        self._pending = None
        seen = ctx[pos : pos + len(tokens)]
        if not seen:
            return
        if seen[0] != tokens[0]:
            first.add(0, 1)
            return
        first.add(1, 0)
        hits = 1
        while hits < len(seen) and seen[hits] == tokens[hits]:
            hits += 1
        # tokens past what was verified are unknown: only a mismatch within it counts as a miss
        self.next.add(hits - 1, hits < len(seen))

    def plan(self, tokens: list[int], n: int) -> tuple[int, float]:
        """How many of a lookup's tokens to propose, and the expected tokens per second (right
        after the lookup: it reads whether that lookup continued a span)."""
        if not tokens:
            return 0, self.costs.target_alone_rate() if self.costs else 0.0
        if not self.adaptive:
            return len(tokens), 0.0
        return self.costs.best_k(self._first_estimate(n).mean, len(tokens), draft_cost=0.0, chain=self.next.mean,
                                 min_gain=self.min_gain)

    def propose(self, ctx, k, params, rng) -> Proposal:
        tokens, n = self.lookup(ctx, k)
        use, _ = self.plan(tokens, n)
        return Proposal(tokens[:use], None, "ngram", ngram=n) if use else EMPTY


# --- the draft model -----------------------------------------------------------------------------
# Acceptance is learned per bin of the draft's own probability for the token it proposed: a
# confident draft is usually right, an unsure one usually wrong, and that is known *before* paying
# for the next draft step and the longer verify.
_CONF_EDGES = np.array([0.2, 0.4, 0.6, 0.75, 0.85, 0.92, 0.97, 0.99])


def _conf_bin(c: float) -> int:
    return int(np.searchsorted(_CONF_EDGES, c, side="right"))


class ModelDrafter(Drafter):
    """The small draft model on its own in-place KV cache (a ModelRunner).

    Its cache holds a prefix of the context; `_sync` feeds whatever is missing in one step (the
    target's last token, or a whole new prompt), so rewinding after a rejection is free."""

    name = "model"

    def __init__(self, runner: ModelRunner, usable: int, costs: CostModel | None = None, *, adaptive: bool = True):
        self.runner = runner
        self.usable = usable  # the target's vocabulary: q rows are this long
        # A draft may score only a prefix of the vocabulary (a pruned lm_head, see docs/speed.md):
        # it then proposes only those ids, and q is zero past them, which keeps sampling exact.
        self.scored = min(usable, runner.vocab_size)
        self.costs = costs
        self.adaptive = adaptive and costs is not None
        self.tokens: list[int] = []  # exactly what the draft cache holds
        mids = np.concatenate([[0.1], (_CONF_EDGES[:-1] + _CONF_EDGES[1:]) / 2, [0.995]])
        self.by_conf = [Beta(float(m) * 0.9) for m in mids]
        self.mean = Beta(0.6, weight=8.0)
        self.last_seconds = 0.0  # wall time of the last proposal (draft steps and picking)
        self.last_sizes: list[int] = []  # tokens per draft step the last proposal ran (catch-up first)

    @property
    def last_steps(self) -> int:
        return len(self.last_sizes)

    def begin(self, ctx) -> None:
        n = common_prefix(self.tokens, ctx)
        self.runner.rewind(n)
        del self.tokens[n:]

    def _sync(self, ctx: Sequence[int]) -> np.ndarray:
        """Makes the draft cache hold ctx and returns the logits row predicting the next token."""
        n = min(common_prefix(self.tokens, ctx), len(ctx) - 1)
        self.runner.rewind(n)
        del self.tokens[n:]
        row = None
        while n < len(ctx):
            chunk = list(ctx[n : n + PREFILL_CHUNK])
            row = self.runner.step(chunk, 1)[0]
            self.last_sizes.append(len(chunk))
            self.tokens.extend(chunk)
            n += len(chunk)
        return row

    def prefill(self, ctx: Sequence[int]) -> None:
        """Feeds the prompt now (the engine does it with the target's prefill, so it counts as
        prompt processing, not as a cost of the first rounds)."""
        if len(ctx) <= self.runner.max_len:
            self._sync(ctx)

    def acceptance(self, conf: float) -> float:
        return self.by_conf[_conf_bin(conf)].mean

    def propose(self, ctx, k, params, rng) -> Proposal:
        t0 = time.perf_counter()
        self.last_sizes = []
        try:
            return self._propose(ctx, k, params, rng)
        finally:
            self.last_seconds = time.perf_counter() - t0

    def _propose(self, ctx, k, params, rng) -> Proposal:
        if k <= 0 or len(ctx) + k - 1 > self.runner.max_len:
            return EMPTY
        row = self._sync(ctx)
        tokens: list[int] = []
        confs: list[float] = []
        qs: list[np.ndarray] = []
        # greedy drafting under the round's figure of merit: expected tokens / seconds
        d = self.costs.draft_step() if self.adaptive else 0.0
        p_all, e_tok, best_j, best_rate = 1.0, 1.0, 0, 0.0
        if self.adaptive:
            best_rate = 1.0 / (d + self.costs.verify(1))  # submitting nothing after one draft step
        for j in range(k):
            t, c, q = self._pick(row, params, rng)
            if q is not None:
                qs.append(q)
            tokens.append(t)
            confs.append(c)
            if not self.adaptive:
                if j + 1 < k:
                    row = self._step(t)
                continue
            p_all *= self.acceptance(c)
            e_tok += p_all
            spent = (j + 1) * d
            rate = e_tok / (spent + self.costs.verify(j + 2))
            if rate > best_rate:
                best_j, best_rate = j + 1, rate
            if j + 1 == k:
                break
            # one more draft step pays if the next token's expected value beats its cost
            more = (e_tok + p_all * self.mean.mean) / (spent + d + self.costs.verify(j + 3))
            if more <= best_rate:
                break
            row = self._step(t)
        if self.adaptive:
            del tokens[best_j:], confs[best_j:], qs[best_j:]
        if not tokens:
            return EMPTY
        return Proposal(tokens, np.stack(qs) if qs else None, "model", confs)

    def _pick(self, row: np.ndarray, params: SamplingParams, rng) -> tuple[int, float, np.ndarray | None]:
        """The draft's token from its logits row, the draft's probability for it, and (sampling
        only) the distribution q it was drawn from, [usable]."""
        if params.greedy:
            x = row[: self.scored]
            t = int(np.argmax(x))
            return t, float(1.0 / np.exp(x - x[t]).sum()), None
        q = probs(row, params, self.scored)
        t = sample(q, rng)
        c = float(q[t])
        if self.scored < self.usable:
            q = np.concatenate([q, np.zeros(self.usable - self.scored)])
        return t, c, q

    def _step(self, t: int) -> np.ndarray:
        row = self.runner.step([t], 1)[0]
        self.tokens.append(t)
        self.last_sizes.append(1)
        return row

    def feedback(self, proposal, accepted, valid_len) -> None:
        if valid_len < len(self.tokens):
            self.runner.rewind(valid_len)
            del self.tokens[valid_len:]
        if proposal.source != "model" or not proposal.tokens:
            return
        judged = proposal.conf[: accepted + 1]  # tokens after the first rejection were never judged
        for i, c in enumerate(judged):
            ok = i < accepted
            self.by_conf[_conf_bin(c)].add(ok, not ok)
            self.mean.add(ok, not ok)


# --- auto ----------------------------------------------------------------------------------------
class AutoDrafter(Drafter):
    """Per round: an n-gram hit, the draft model, or nothing, whichever promises the most tokens per
    second right now.

    - nothing: 1 token per 1-token target step (measured);
    - n-gram: the lookup's expected tokens (acceptance learned by matched length, from every
      round's lookup, proposed or not) over the measured verify cost; free to propose;
    - model: the tokens per second its recent rounds delivered (their expected yield from the
      draft's calibrated confidences over the measured cost of their draft steps and verify),
      which already includes how well its confidence-based stopping works on this text.

    Never slower than the target alone, by design rather than by luck:
    - drafting is chosen only when it promises a margin over a plain step (NGRAM_MIN_GAIN,
      MODEL_MIN_GAIN): falling back to nothing costs nothing, drafting on a thin promise costs a
      longer verify whenever the promise was noise;
    - the model's rate is known only from rounds that used it, so while it is not chosen it is
      probed, replacing a plain step: first after EARLY_TRIES rounds of a request, then after
      EXPLORE_EVERY rounds, the gap doubling after each probe, at most MAX_PROBES per request.
      A probe costs about one draft catch-up, its draft steps and a slightly longer verify, so
      the probing of a request is bounded by a few target steps whatever the text.
    The n-gram estimates need no probe: every round's lookup is scored, used or not."""

    name = "auto"
    EXPLORE_EVERY = 8  # rounds without the model before the next probe (doubles after each)
    EARLY_TRIES = 2  # a request's first rounds that do not use the model before it is probed
    MAX_PROBES = 4  # probes of the model per request
    CATCH_UP = 2  # tokens a draft catch-up step holds when the model is used round after round

    def __init__(self, costs: CostModel, ngram: NgramDrafter, model: ModelDrafter | None = None):
        self.costs = costs
        self.ngram = ngram
        self.model = model
        self.idle = 0  # rounds since the model was last used
        self.gap = self.EXPLORE_EVERY  # rounds without the model before the next probe
        self.probes = 0  # probes of the model in this request
        # recent model rounds: tokens yielded and seconds spent, both exponentially weighted
        self.m_tokens, self.m_seconds = 0.0, 0.0
        self._m_round: tuple[int, float] | None = None  # (proposals, draft seconds) of this round

    def begin(self, ctx) -> None:
        self.ngram.begin(ctx)
        self.probes = 0
        self.gap = self.EXPLORE_EVERY
        self.idle = self.gap - self.EARLY_TRIES - 1
        if self.model is not None:
            self.model.begin(ctx)
            # start from the old estimate, pulled toward what the model's long-run acceptance
            # predicts for a one-token proposal (one round's worth of evidence): a new text may
            # suit the draft better or worse than the last one
            a = self.model.mean.mean
            self.m_tokens = self.m_tokens * NEW_REQUEST_KEEP + 1.0 + a
            self.m_seconds = (self.m_seconds * NEW_REQUEST_KEEP + self.costs.draft_steps([self.CATCH_UP])
                              + self.costs.verify(2))

    def expected_yield(self, proposal: Proposal) -> float:
        """Expected tokens from a model proposal: 1 + sum over j of P(first j all accepted)."""
        e, p = 1.0, 1.0
        for c in proposal.conf if proposal.source == "model" else ():
            p *= self.model.acceptance(c)
            e += p
        return e

    def model_rate(self) -> float:
        """Expected tokens per second of a model round."""
        if self.model is None:
            return 0.0
        if self.m_seconds <= 0:  # nothing seen yet: i.i.d. acceptance at the prior mean
            return self.costs.best_k(self.model.mean.mean, 4)[1]
        return self.m_tokens / self.m_seconds

    def choose(self, ng_k: int, ng_rate: float) -> str:
        """The source of this round: "ngram" (a lookup planned ng_k > 0 tokens at ng_rate),
        "model" or "none"; counts probes."""
        r0 = self.costs.target_alone_rate()
        options = [("none", r0)]
        if ng_k and ng_rate >= r0 * (1.0 + self.ngram.min_gain):
            options.append(("ngram", ng_rate))
        if self.model is not None:
            m = self.model_rate()
            if m >= r0 * (1.0 + MODEL_MIN_GAIN):
                options.append(("model", m))
        choice = max(options, key=lambda c: c[1])[0]
        if choice == "model":
            self.idle, self.gap = 0, self.EXPLORE_EVERY
        elif self.model is not None:
            self.idle += 1
            # probe instead of a plain step (an n-gram round in hand is not given up for a probe)
            if choice == "none" and self.idle >= self.gap and self.probes < self.MAX_PROBES:
                choice = "model"
                self.probes += 1
                self.idle = 0
                if self.probes > 1:  # the early probe is a request's first look, not a failure
                    self.gap *= 2
        return choice

    def propose(self, ctx, k, params, rng) -> Proposal:
        if k <= 0:
            return EMPTY
        tokens, n = self.ngram.lookup(ctx, k)
        ng_k, ng_rate = self.ngram.plan(tokens, n) if tokens else (0, 0.0)
        choice = self.choose(ng_k, ng_rate)
        if choice == "ngram":
            return Proposal(tokens[:ng_k], None, "ngram", ngram=n)
        if choice == "model":
            prop = self.model.propose(ctx, k, params, rng)
            # its cost from the (median) step times, not its own wall time: one burst of another
            # process must not turn the drafter off for the rest of the request. The catch-up step
            # is costed as it would be if the model were used every round (CATCH_UP tokens): the
            # question the estimate answers is whether using it from now on pays.
            sizes = list(self.model.last_sizes)
            if sizes and sizes[0] > 1:
                sizes[0] = min(sizes[0], self.CATCH_UP)
            self._m_round = (len(prop.tokens), self.costs.draft_steps(sizes))
            return prop
        return EMPTY

    def feedback(self, proposal, accepted, valid_len) -> None:
        if self._m_round is not None:
            n, seconds = self._m_round
            self._m_round = None
            # the round's *expected* yield from the draft's confidences (calibrated over all past
            # verdicts) rather than its actual yield: far less noisy, so the choice between the
            # model and nothing does not flip on one unlucky rejection
            self.m_tokens = self.m_tokens * MODEL_RATE_KEEP + self.expected_yield(proposal)
            self.m_seconds = self.m_seconds * MODEL_RATE_KEEP + seconds + self.costs.verify(n + 1)
        if self.model is not None:
            self.model.feedback(proposal, accepted, valid_len)
