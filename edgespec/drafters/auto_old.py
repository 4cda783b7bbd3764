"""`auto-old`: the replay-tuned `auto` this release replaces, kept as a bench-only mode until the
bench has compared the two (drafters/auto.py is `auto`)."""
from __future__ import annotations

from typing import Sequence

from ..core.costmodel import CostModel
from ..core.proposal import EMPTY, Proposal
from .auto import AutoDrafter
from .base import Drafter


class OldAutoDrafter(AutoDrafter):  # an AutoDrafter to the engine's tree round
    """Per round: one of its sources (n-gram, the draft model, ...) or nothing, whichever promises
    the most tokens per second right now. It reads each source only through `Drafter.quote`:

    - nothing: 1 token per 1-token target step (measured);
    - a free source (n-gram): the lookup's expected tokens (acceptance learned by matched length,
      from every round's lookup, proposed or not) over the measured verify cost;
    - a costly source (the draft model): the tokens per second its recent rounds delivered.

    Never slower than the target alone, by design rather than by luck:
    - a source is chosen only when it promises its margin over a plain step (Quote.min_gain):
      falling back to nothing costs nothing, drafting on a thin promise costs a longer verify
      whenever the promise was noise;
    - but a costed source that drafted the last round keeps drafting while it promises more than a
      plain step at all (STAY_GAIN): enter at a margin, leave at none. Its rate moves only when it
      runs, and once it has left, probes are few and its pending catch-up grows with every plain
      round, so leaving is close to final for the reply, where entering is not. Measured (pinned-cost
      replay, docs/speed.md round sixteen): with the margin to stay as high as to enter, the third
      explaining reply left the draft after one round at 31.0 tokens/s (the target 29.9, the margin
      31.4) and ran 1.00x where the draft alone ran 1.16x; with none to stay, 1.10x;
    - a rate known only from rounds that used the source (Quote.probe) is probed, replacing a
      plain step: first after EARLY_TRIES rounds of a request, then after EXPLORE_EVERY rounds, the
      gap doubling after each probe, at most MAX_PROBES per request, and none after MAX_LOST_PROBES
      probes whose rounds left its rate under a plain step's (a source that keeps losing on this
      text; a probe that clears it goes on drafting, by the margin to stay above). A probe costs about one draft
      catch-up, its draft steps and a slightly longer verify, so the probing of a request is
      bounded by a few target steps whatever the text.
    A free source needs no probe: every round's lookup is scored, used or not.

    A free source's quote is discounted by how far its quotes came true in the rounds that used it
    (`trust`: accepted tokens over the tokens its quotes promised beyond the target's own one, faded,
    at most 1). Its acceptance estimates are learned over every round, but `auto` uses it where the
    other sources had nothing better, which are the harder positions, and where its estimate happens
    to run high: measured on the dev CPU, the recycling drafter's quotes promised about twice the
    tokens its chosen rounds then had accepted (16 % acceptance against ~30 % quoted)."""

    name = "auto-old"
    EXPLORE_EVERY = 8  # rounds without a probed source before its next probe (doubles after each)
    EARLY_TRIES = 2  # a request's first rounds that do not use it before it is probed
    MAX_PROBES = 4  # probes of each source per request
    MAX_LOST_PROBES = 2  # probes after which its rate still did not clear its margin: no more this request
    STAY_GAIN = 0.0  # the margin a costed source that drafted the last round must clear to draft the next
    # (all prompts, both passes, steps only: `auto` / best single source 1.003 -> 1.010, explaining 0.949 -> 0.978)
    TRUST_PRIOR = 4.0  # promised tokens' worth of evidence that a free source's quotes come true
    TRUST_KEEP = 0.95  # per round that used the source: the weight of the earlier ones

    def __init__(self, costs: CostModel, sources: Sequence[Drafter]):
        self.costs = costs
        self.sources = list(sources)  # in order of preference on equal rates
        self._probe: dict[str, _ProbeState] = {}
        self._used: Drafter | None = None  # the source that proposed this round (next round: the last one's)
        self._trust: dict[str, list[float]] = {}  # free source -> [accepted, promised] tokens, faded
        self._promised = 0.0  # tokens beyond the target's own that this round's quote promised

    @property
    def uses_model(self) -> bool:
        return any(s.uses_model for s in self.sources)

    def begin(self, ctx) -> None:
        self._used = None
        for s in self.sources:
            s.begin(ctx)
        for p in self._probe.values():
            p.begin(self.EXPLORE_EVERY - self.EARLY_TRIES - 1, self.EXPLORE_EVERY)

    def prefill(self, ctx) -> None:
        for s in self.sources:
            s.prefill(ctx)

    def set_adaptive(self, on: bool) -> None:
        # the sources always size their proposals from measured costs: a given k only caps them
        for s in self.sources:
            s.set_adaptive(True)

    def reset(self) -> None:
        for s in self.sources:
            s.reset()

    def forget(self) -> None:
        self._trust.clear()
        for s in self.sources:
            s.forget()

    def trust(self, name: str) -> float:
        """How far a free source's quotes have come true when used: in (0, 1], 1 before evidence."""
        got, promised = self._trust.get(name, (0.0, 0.0))
        return min(1.0, (got + self.TRUST_PRIOR) / (promised + self.TRUST_PRIOR))

    def _trusted(self, s: Drafter, q):
        """The quote's rate with the tokens it promises past the target's own discounted by trust,
        and those promised tokens (0 for a costed source: its rate is measured from its own rounds)."""
        if q is None or q.proposal is None or not q.proposal.tokens:
            return (None if q is None else q.rate), 0.0
        verify = self.costs.verify(len(q.proposal.tokens) + 1)
        extra = max(0.0, q.rate * verify - 1.0)
        return (1.0 + self.trust(s.name) * extra) / verify, extra

    def observe(self, rows, tokens) -> None:
        for s in self.sources:  # free sources learn from every verified row, used this round or not
            s.observe(rows, tokens)

    def _gain(self, s: Drafter, q, last: Drafter | None) -> float:
        """The margin over a plain step s's quote must clear: a costed source that drafted the last
        round keeps its streak while it beats a plain step at all (STAY_GAIN); see the class doc."""
        return self.STAY_GAIN if s is last and s.uses_model else q.min_gain

    def propose(self, ctx, k, params, rng) -> Proposal:
        last, self._used = self._used, None
        if k <= 0:
            return EMPTY
        self._promised = 0.0
        r0 = self.costs.target_alone_rate()
        best, best_rate, best_quote, promised = None, r0, None, 0.0
        quotes = {}
        for s in self.sources:
            q = quotes[s.name] = s.quote(ctx, k)
            rate, extra = self._trusted(s, q)
            if rate is not None and rate >= r0 * (1.0 + self._gain(s, q, last)) and rate > best_rate:
                best, best_rate, best_quote, promised = s, rate, q, extra
        for s in self.sources:  # rounds since each probed source was last used
            p = self._probe_state(s)
            if p is None:
                continue
            if p.checking:  # probed last round: did its rate, updated by that round, clear its margin?
                p.checking = False
                q = quotes.get(s.name)
                if q is None or q.rate < r0 * (1.0 + self._gain(s, q, last)):
                    p.losses += 1
            if s is best:
                p.used(self.EXPLORE_EVERY)
                continue
            p.idle += 1
            # probe instead of a plain step (a free round in hand is not given up for a probe), and
            # only where the quote allows it (a cold draft cache would make the probe pay a prefill)
            q = quotes.get(s.name)
            if best is None and q is not None and q.probe and p.due(self.MAX_PROBES, self.MAX_LOST_PROBES):
                p.probed()
                best, best_quote = s, None
        if best is None:
            return EMPTY
        self._used = best
        if best_quote is not None and best_quote.proposal is not None:
            self._promised = promised
            return best_quote.proposal
        return best.propose(ctx, k, params, rng)

    def _probe_state(self, s: Drafter) -> "_ProbeState | None":
        p = self._probe.get(s.name)
        if p is None and s.uses_model:
            p = self._probe[s.name] = _ProbeState()
            p.begin(self.EXPLORE_EVERY - self.EARLY_TRIES - 1, self.EXPLORE_EVERY)
        return p

    def feedback(self, proposal, accepted, valid_len) -> None:
        if self._used is not None and self._promised > 0:
            t = self._trust.setdefault(self._used.name, [0.0, 0.0])
            t[0] = t[0] * self.TRUST_KEEP + accepted
            t[1] = t[1] * self.TRUST_KEEP + self._promised
            self._promised = 0.0
        for s in self.sources:  # every source, used or not, must forget cache rows past valid_len
            s.feedback(proposal, accepted, valid_len)


class _ProbeState:
    """When a source whose rate only using it can measure is next tried (see AutoDrafter)."""

    __slots__ = ("idle", "gap", "probes", "losses", "checking")

    def __init__(self) -> None:
        self.idle = self.gap = self.probes = self.losses = 0
        self.checking = False  # probed in the last round: its next quote says whether the probe won

    def begin(self, idle: int, gap: int) -> None:
        self.idle, self.gap, self.probes, self.losses, self.checking = idle, gap, 0, 0, False

    def used(self, gap: int) -> None:
        self.idle, self.gap = 0, gap

    def due(self, max_probes: int, max_lost: int) -> bool:
        return self.idle >= self.gap and self.probes < max_probes and self.losses < max_lost

    def probed(self) -> None:
        self.probes += 1
        self.checking = True
        self.idle = 0
        if self.probes > 1:  # the early probe is a request's first look, not a failure
            self.gap *= 2
