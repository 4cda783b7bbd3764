"""`auto`: per round, the source that promises the most tokens per second, or none (docs/drafting.md).

The whole policy, in the words of docs/drafting.md: the target alone makes one token per measured
one-token step. A source whose k proposed tokens are each accepted with probability a (given the
ones before were) yields 1 + a + ... + a^k tokens for its drafting seconds plus the measured verify
of k + 1 tokens. The free sources (the suffix index, a grammar's forced text) look up every round at no
model cost and score every lookup against what the target then wrote, so they quote their own
rate for this round's lookup (Drafter.quote). A source that costs model steps (draft model, heads)
is priced before it drafts (Drafter.cost): its measured step seconds, a one-off catch-up (feeding
the draft text it has not seen, e.g. the prompt) spread over the tokens it is expected to serve in
this reply (`served`: its share of recent rounds times the reply left, against the mean length of this
service's replies), and `a` from
a Beta posterior per source: its prior plus every verdict on its proposals in this request, with
earlier requests' evidence kept at REQUEST_KEEP; a round where it drafted and then proposed nothing
counts as a miss (the step was paid for no token). `a` is read optimistically, the posterior mean plus
EXPLORE_SD standard deviations, so a source with little evidence gets tried and one that has shown
itself is judged by what it showed.

The decision is O(number of sources) per round: no arrays, no history beyond two floats a source.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Sequence

from ..core.costmodel import CostModel
from ..core.proposal import EMPTY, Proposal
from .base import Beta, DraftCost, Drafter, DrafterBase, StepPlan, drive
from .ngram import ngram_alternatives

PRIOR_WEIGHT = 4.0  # tokens of evidence a source's prior acceptance is worth: a few verdicts outweigh it,
# so a wrong prior (another pair, another kind of text) costs a round or two, not a reply
REQUEST_KEEP = 0.25  # the weight earlier requests' evidence keeps when a request starts: a new text may
# suit the draft better or worse, so this request's own verdicts soon decide, yet a source that lost on
# the last replies does not start the next one as if unseen (Beta.fade keeps at least one token's worth)
EXPLORE_SD = 1.0  # optimism in posterior standard deviations: with little evidence the bonus is large
# (a source not yet seen gets tried), after n verdicts it is about sqrt(a(1-a)/n), so a source that is
# truly under the target alone stops being chosen within a few rounds
# A one-off catch-up (a prompt the draft has not read) pays only through the tokens the draft then serves
# in this reply: its share of the rounds times the tokens left. A fixed 64 overpriced it where the free
# sources serve most rounds (a summary copying its prompt: the draft served a few dozen tokens of each
# reply and its prompt cost more than they saved) and in short replies.
REPLY_PRIOR = 128.0  # tokens a reply runs before any reply has ended (the bench's and serve's usual cap)
REPLY_KEEP = 0.75  # weight of the earlier replies' mean length when one more reply ends
MIN_LEFT = 8.0  # tokens left at least: a reply past the mean length may go on
SHARE_PRIOR = 0.5  # a model-step source's share of the rounds before any round was seen
SHARE_STEP = 1.0 / 16.0  # each round moves the share this far toward 1 (it would serve it) or 0: ~16 rounds
SHARE_FLOOR = 0.05  # a source that served no recent round may still serve the next ones


@dataclass
class AutoEvidence:
    """What one request's auto hands the next (AutoDrafter.evidence/seed)."""

    posteriors: dict[str, Beta]  # model-step source -> acceptance posterior
    share: dict[str, float]  # model-step source -> its share of recent rounds
    reply: float  # mean tokens of the replies so far (faded)

    def forgotten(self) -> "AutoEvidence":
        """What forget() leaves: the replies' mean length only (it describes the service, not texts)."""
        return AutoEvidence({}, {}, self.reply)


class AutoDrafter(DrafterBase):
    """Per round, the source (or none) with the highest expected tokens per second; see the module
    docstring. `sources` is in order of preference on equal rates (drafters/modes.py auto_rank)."""

    name = "auto"

    def __init__(self, costs: CostModel, sources: Sequence[Drafter]):
        self.costs = costs
        self.sources = list(sources)
        self.posteriors: dict[str, Beta] = {}  # model-step source -> its acceptance posterior
        self._used: Drafter | None = None  # the source whose proposal this round verifies
        # model-step source -> its share of recent rounds: those it would win with its cache in step
        # (its catch-up left out, so a source kept out by one is not judged by the rounds it lost to it)
        self.share: dict[str, float] = {}
        self.reply = REPLY_PRIOR  # mean tokens of this auto's replies (faded)
        self._prompt: int | None = None  # the open request's prompt length (None: no request open)

    @property
    def uses_model(self) -> bool:
        return any(s.uses_model for s in self.sources)

    # -- the interface: passed on to every source -------------------------------------------------------
    def stats(self) -> dict:
        """Its own learnt numbers (each source reports its own): the model-step sources' acceptance
        and share of recent rounds, and the mean length of its replies."""
        return {"acceptance": {n: b.mean for n, b in self.posteriors.items()}, "share": dict(self.share),
                "reply_tokens": self.reply}

    def evidence(self) -> "AutoEvidence":
        """What the next request's auto starts from (the engine builds one per request): its
        posteriors and shares, and the mean length of its replies (end() has counted this one's)."""
        return AutoEvidence(self.posteriors, self.share, self.reply)

    def seed(self, evidence) -> None:
        """Starts from a finished request's evidence (a copy: requests never share it); the posteriors
        are faded at begin."""
        if evidence is None:
            self.posteriors, self.share = {}, {}
            return
        self.posteriors = copy.deepcopy(evidence.posteriors)
        self.share = dict(evidence.share)
        self.reply = evidence.reply

    def attach(self, constraint) -> bool:
        """Its grammar source quotes the forced tokens after another source's; its proposals still
        need them in front (False)."""
        for s in self.sources:
            s.attach(constraint)
        return False

    def begin(self, ctx) -> None:
        self._used = None
        self._prompt = len(ctx)
        for b in self.posteriors.values():
            b.fade(REQUEST_KEEP)
        for s in self.sources:
            s.begin(ctx)

    def prefill(self, ctx) -> None:
        for s in self.sources:
            s.prefill(ctx)

    def set_adaptive(self, on: bool) -> None:
        for s in self.sources:  # a given k only caps them: each sizes its proposal from measured costs
            s.set_adaptive(True)

    def reset(self) -> None:
        for s in self.sources:
            s.reset()

    def set_tree_width(self, width: int) -> None:
        for s in self.sources:
            s.set_tree_width(width)

    def alternatives(self, ctx, k, width) -> list[tuple[list[int], str]]:
        """Its sources' alternatives, then prompt lookup's (free, whichever source drafts)."""
        out = [a for s in self.sources for a in s.alternatives(ctx, k, width)]
        return out + [(c, "ngram") for c in ngram_alternatives(ctx, k, width)]

    def end(self, ctx) -> None:
        """A request ended (any mode's: the engine tells every drafter): the length of this auto's own
        reply joins the mean that `served` reads. Its sources hear the end from the engine themselves."""
        if self._prompt is not None:
            n = max(0, len(ctx) - self._prompt)
            self.reply = REPLY_KEEP * self.reply + (1.0 - REPLY_KEEP) * n
            self._prompt = None

    def forget(self) -> None:
        """Forgets what it learned of texts (acceptance, shares). Not the replies' mean length: like the
        measured step costs it describes the service (a kiosk's answers run a dozen tokens, an editor's
        hundreds), and relearning it after every reset_cache would price each catch-up as if replies ran
        REPLY_PRIOR tokens (a 300-token docs prompt's catch-up took ~1 s of a 5-token answer's decode)."""
        self.posteriors.clear()
        self.share.clear()
        for s in self.sources:
            s.forget()

    def observe(self, rows, tokens) -> None:
        for s in self.sources:  # free sources learn from every verified row, used this round or not
            s.observe(rows, tokens)

    def feedback(self, proposal: Proposal, accepted: int, valid_len: int) -> None:
        used, self._used = self._used, None
        if used is not None and used.name in self.posteriors:
            # accepted tokens are hits, the first rejected one a miss; tokens after it were never judged.
            # A source that drafted and then withdrew (its own confidence said no token pays) proposes
            # nothing: its draft step was paid for no token, the loss of a first token rejected, so it
            # is a miss too. Counting only the proposals it kept would price it by its best rounds
            all_taken = bool(proposal.tokens) and accepted == len(proposal.tokens)
            self.posteriors[used.name].add(accepted, 0 if all_taken else 1)
        for s in self.sources:  # every source, used or not, must forget cache rows past valid_len
            s.feedback(proposal, accepted, valid_len)

    # -- the decision ---------------------------------------------------------------------------------
    def acceptance(self, name: str, prior: float) -> float:
        """A model-step source's acceptance as `auto` reads it: posterior mean + EXPLORE_SD sd, at most 1."""
        b = self.posteriors.get(name)
        if b is None:
            b = self.posteriors[name] = Beta(min(max(prior, 0.01), 0.99), weight=PRIOR_WEIGHT, keep=1.0)
        n = b.a + b.b
        m = b.a / n
        return min(1.0, m + EXPLORE_SD * math.sqrt(m * (1.0 - m) / (n + 1.0)))

    def served(self, name: str, ctx: Sequence[int]) -> float:
        """Tokens a model-step source is expected to serve in the rest of this reply: its share of
        recent rounds times the reply left (the mean reply length less what this one has written)."""
        written = len(ctx) - self._prompt if self._prompt is not None else 0
        left = max(MIN_LEFT, self.reply - written)
        return max(1.0, self.share.get(name, SHARE_PRIOR) * left)

    def priced_rate(self, a: float, c: DraftCost, k: int, served: float) -> float:
        """Tokens per second of the best chain of 1..k drafted tokens at acceptance a: E_j tokens for
        the draft steps, the verify of j + 1, and E_j / served of the one-off catch-up."""
        catch = max(0.0, c.first - c.step)
        best, e, p = 0.0, 1.0, 1.0
        for j in range(1, k + 1):
            p *= a
            e += p
            r = e / (j * c.step + self.costs.verify(j + 1) + catch * e / served)
            best = max(best, r)
        return best

    def choose(self, ctx: Sequence[int], k: int) -> tuple[Drafter | None, Proposal | None]:
        """The source to draft with this round and, for a free one, its ready proposal."""
        best, best_rate, best_prop = None, self.costs.target_alone_rate(), None
        in_step: list[tuple[str, float]] = []  # model-step sources' rates with their catch-up left out
        rates: list[float] = [best_rate]
        for s in self.sources:
            if s.uses_model:
                c = s.cost(ctx)
                if c is None:
                    continue
                a = self.acceptance(s.name, c.prior)
                rate, prop = self.priced_rate(a, c, k, self.served(s.name, ctx)), None
                in_step.append((s.name, rate if c.first <= c.step else self.priced_rate(a, c, k, math.inf)))
            else:
                q = s.quote(ctx, k)
                if q is None or q.proposal is None or not q.proposal.tokens:
                    continue
                rate, prop = q.rate, q.proposal
                rates.append(rate)
            if rate > best_rate:
                best, best_rate, best_prop = s, rate, prop
        for name, r in in_step:  # would it win this round with its cache in step? -> its share
            others = max(rates + [x for m, x in in_step if m != name])
            old = self.share.get(name, SHARE_PRIOR)
            self.share[name] = max(SHARE_FLOOR, old + SHARE_STEP * (float(r > others) - old))
        return best, best_prop

    def propose(self, ctx, k, params, rng) -> Proposal:
        return drive(self.propose_steps(ctx, k, params, rng))

    def propose_steps(self, ctx, k, params, rng, now: bool = False) -> StepPlan:
        """The chosen source's proposal: a free one's quoted proposal, or a model-step one's plan
        (its propose_now's: `auto` priced the round). It has no gate of its own, so `now` changes nothing."""
        self._used = None
        if k <= 0:
            return EMPTY
        best, prop = self.choose(ctx, k)
        if best is None:
            return EMPTY
        self._used = best
        return prop if prop is not None else (yield from best.propose_steps(ctx, k, params, rng, now=True))
