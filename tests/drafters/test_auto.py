"""`auto`'s decisions (drafters/auto.py) with fake step costs and fake sources: deterministic, no timing."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edgespec.core.costmodel import CostModel
from edgespec.core.sampling import SamplingParams
from edgespec.drafters import AutoDrafter, DraftCost, DrafterBase, Proposal, Quote
from edgespec.drafters.auto import (EXPLORE_SD, MIN_LEFT, PRIOR_WEIGHT, REPLY_KEEP, REPLY_PRIOR, REQUEST_KEEP,
                                   SHARE_FLOOR, SHARE_PRIOR, SHARE_STEP)

from helpers.costs import times

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)
# a 2-core CPU's curve: 2 tokens cost barely more than 1 (the int4 kernel works on pairs of rows)
CPU = dict(s1=0.100, s2=0.109, s3=0.138, s4=0.163, s5=0.191, s6=0.206, s7=0.231, s8=0.256, s9=0.278)


def cpu() -> CostModel:
    return CostModel(times(**CPU), times(s1=0.035))


class Free(DrafterBase):
    """A free source quoting a fixed rate for a fixed proposal (None: found nothing)."""

    def __init__(self, name: str, rate: float | None, tokens=(7, 8, 9)):
        self.name, self.rate, self.tokens = name, rate, list(tokens)
        self.fed: list[tuple[int, int]] = []

    def quote(self, ctx, k):
        if self.rate is None:
            return None
        return Quote(self.rate, Proposal(self.tokens[:k], None, self.name))

    def propose(self, ctx, k, params, rng):
        raise AssertionError("a free source's quoted proposal is used as it is")

    def feedback(self, proposal, accepted, valid_len):
        self.fed.append((accepted, valid_len))


class Costly(DrafterBase):
    """A source that costs model steps: fixed step seconds, a prior, proposals of `n` tokens."""

    uses_model = True

    def __init__(self, name: str, *, first: float = 0.035, step: float = 0.035, prior: float = 0.6, n: int = 4):
        self.name, self.first, self.step, self.prior, self.n = name, first, step, prior, n
        self.proposed = 0

    def cost(self, ctx):
        return DraftCost(self.first, self.step, self.prior)

    def propose(self, ctx, k, params, rng):
        self.proposed += 1
        return Proposal(list(range(min(k, self.n))), None, self.name)


def run_round(auto: AutoDrafter, accepted_of) -> Proposal:
    """One round: auto proposes, the verdict is accepted_of(proposal) tokens."""
    ctx = [1, 2, 3]
    prop = auto.propose(ctx, 8, GREEDY, RNG)
    acc = accepted_of(prop) if prop.tokens else 0
    auto.feedback(prop, acc, len(ctx) + acc + 1)
    return prop


def test_nothing_is_drafted_when_no_source_beats_the_target_alone():
    c = cpu()
    r0 = c.target_alone_rate()
    weak = Costly("model", prior=0.05)
    auto = AutoDrafter(c, [Free("suffix", r0 * 0.9), weak, Free("recycle", None)])
    auto.begin([1, 2, 3])
    assert auto.propose([1, 2, 3], 8, GREEDY, RNG).tokens == []
    assert weak.proposed == 0  # a source that costs steps is priced, never run, to find that out


def test_the_best_rate_wins_and_a_free_proposal_is_used_as_quoted():
    c = cpu()
    r0 = c.target_alone_rate()
    model = Costly("model", prior=0.5)
    suffix = Free("suffix", r0 * 3.0, tokens=(40, 41, 42, 43))
    auto = AutoDrafter(c, [suffix, model])
    auto.begin([1, 2, 3])
    prop = auto.propose([1, 2, 3], 8, GREEDY, RNG)
    assert (prop.source, prop.tokens) == ("suffix", [40, 41, 42, 43]) and model.proposed == 0
    suffix.rate = r0 * 1.01  # a copy that barely pays loses to a draft whose prior promises more
    assert auto.propose([1, 2, 3], 8, GREEDY, RNG).source == "model" and model.proposed == 1
    # on equal rates the earlier source in the order of preference is kept
    twin = AutoDrafter(c, [Free("suffix", r0 * 2.0), Free("recycle", r0 * 2.0)])
    assert twin.propose([1, 2, 3], 8, GREEDY, RNG).source == "suffix"


def test_the_acceptance_read_is_the_posterior_mean_plus_its_standard_deviation():
    auto = AutoDrafter(cpu(), [])
    a = auto.acceptance("model", 0.6)
    assert a == pytest.approx(0.6 + EXPLORE_SD * math.sqrt(0.6 * 0.4 / (PRIOR_WEIGHT + 1)))
    auto.posteriors["model"].add(60, 40)  # a hundred verdicts at the same mean: the optimism shrinks
    b = auto.acceptance("model", 0.6)
    assert 0.6 < b < a and b == pytest.approx(0.6 + EXPLORE_SD * math.sqrt(0.24 / (PRIOR_WEIGHT + 101)))


def test_a_verdict_counts_accepted_tokens_as_hits_and_the_first_rejection_as_the_only_miss():
    model = Costly("model", prior=0.9)
    auto = AutoDrafter(cpu(), [model])
    auto.begin([1, 2, 3])
    beta = None
    for accepted, hits, misses in ((2, 2, 1), (4, 4, 0), (0, 0, 1)):
        prop = auto.propose([1, 2, 3], 8, GREEDY, RNG)
        assert prop.source == "model" and len(prop.tokens) == 4
        beta = auto.posteriors["model"]
        a, b = beta.a, beta.b
        auto.feedback(prop, accepted, 3 + accepted + 1)
        assert (beta.a - a, beta.b - b) == pytest.approx((hits, misses))


def test_a_draft_that_drafts_and_then_withdraws_counts_a_miss_and_soon_is_not_chosen():
    """The draft model pays a step and then proposes nothing when its own confidence says no token
    pays. auto pays that step too, so such a round is a miss: priced by its kept proposals alone (all
    accepted) it would be chosen every round and lose a draft step each time."""
    model = Costly("model", prior=0.9, n=0)  # always withdraws after drafting
    auto = AutoDrafter(cpu(), [model])
    auto.begin([1, 2, 3])
    chosen = 0
    for _ in range(20):
        beta = auto.posteriors.get("model")
        before = (beta.a, beta.b) if beta is not None else None
        prop = run_round(auto, lambda p: 0)
        assert prop.tokens == []
        if model.proposed > chosen:  # it was chosen this round: one miss, no hit
            chosen = model.proposed
            beta = auto.posteriors["model"]
            if before is not None:
                assert (beta.a - before[0], beta.b - before[1]) == pytest.approx((0, 1))
    # tried, then dropped for good: on these costs one drafted token breaks even at a = 0.44, and a 0.9
    # prior worth PRIOR_WEIGHT tokens reads under that (mean + one sd) after 8 misses
    assert chosen == 8
    assert auto.posteriors["model"].mean < 0.5


def test_only_the_source_that_drafted_learns_from_the_verdict():
    c = cpu()
    model = Costly("model", prior=0.6)
    suffix = Free("suffix", c.target_alone_rate() * 5)
    auto = AutoDrafter(c, [suffix, model])
    auto.begin([1, 2, 3])
    auto.acceptance("model", 0.6)
    before = (auto.posteriors["model"].a, auto.posteriors["model"].b)
    prop = run_round(auto, lambda p: 0)
    assert prop.source == "suffix" and (auto.posteriors["model"].a, auto.posteriors["model"].b) == before
    assert suffix.fed == [(0, 4)]  # every source hears every verdict (its cache may need rewinding)


def test_an_unseen_draft_is_tried_and_dropped_within_a_few_rounds_when_it_loses():
    model = Costly("model", prior=0.6)
    auto = AutoDrafter(cpu(), [model])
    auto.begin([1, 2, 3])
    sources = [run_round(auto, lambda p: 0).source for _ in range(12)]
    assert sources[0] == "model"  # tried on its prior
    first_plain = sources.index("none")
    assert first_plain <= 6 and set(sources[first_plain:]) == {"none"}


def test_a_draft_that_wins_keeps_drafting():
    model = Costly("model", prior=0.3)  # a pessimistic prior: the optimism still gets it tried
    auto = AutoDrafter(cpu(), [model])
    auto.begin([1, 2, 3])
    sources = [run_round(auto, lambda p: len(p.tokens)).source for _ in range(20)]
    assert sources[0] == "model" and set(sources) == {"model"}


def test_a_new_request_keeps_earlier_evidence_at_its_weight():
    model = Costly("model", prior=0.6)
    auto = AutoDrafter(cpu(), [model])
    auto.begin([1])
    auto.acceptance("model", 0.6)
    auto.posteriors["model"].add(30, 10)
    b = auto.posteriors["model"]
    mean, n = b.mean, b.a + b.b
    auto.begin([1, 2])
    assert b.mean == pytest.approx(mean) and b.a + b.b == pytest.approx(n * REQUEST_KEEP)
    auto.forget()  # Engine.reset_cache(): every source starts from its prior again
    assert auto.posteriors == {}


def test_a_one_off_catch_up_is_spread_over_the_tokens_the_draft_serves():
    c = cpu()
    auto = AutoDrafter(c, [])
    warm = DraftCost(0.035, 0.035, 0.8)
    a = 0.8
    want = max((sum(a ** i for i in range(j + 1))) / (j * 0.035 + c.verify(j + 1)) for j in range(1, 9))
    assert auto.priced_rate(a, warm, 8, 1.0) == pytest.approx(want)  # nothing to catch up: served is moot
    catch = 0.5  # a prompt the draft has not read: half a second beyond its usual first step
    cold = DraftCost(0.035 + catch, 0.035, 0.8)
    e3 = 1 + a + a * a + a ** 3
    assert auto.priced_rate(a, cold, 3, 40.0) == pytest.approx(
        max(sum(a ** i for i in range(j + 1)) / (j * 0.035 + c.verify(j + 1) + catch * sum(a ** i for i in range(j + 1)) / 40.0)
            for j in range(1, 4)))
    assert auto.priced_rate(a, cold, 3, 40.0) >= e3 / (3 * 0.035 + c.verify(4) + catch * e3 / 40.0)
    # the fewer tokens it serves, the more each pays of it
    assert auto.priced_rate(a, cold, 8, 10.0) < auto.priced_rate(a, cold, 8, 40.0) < auto.priced_rate(a, warm, 8, 40.0)


def test_served_is_the_share_of_rounds_times_the_reply_left():
    auto = AutoDrafter(cpu(), [])
    auto.begin(list(range(100)))  # a 100-token prompt
    ctx = list(range(100 + 30))  # 30 tokens of the reply written
    assert auto.served("model", ctx) == pytest.approx(SHARE_PRIOR * (REPLY_PRIOR - 30))
    auto.share["model"] = 0.25
    assert auto.served("model", ctx) == pytest.approx(0.25 * (REPLY_PRIOR - 30))
    # past the mean length a reply may still go on: MIN_LEFT tokens at least
    assert auto.served("model", list(range(100 + 500))) == pytest.approx(0.25 * MIN_LEFT)
    # a reply of 40 tokens ends: the mean moves toward it
    auto.end(list(range(140)))
    assert auto.reply == pytest.approx(REPLY_KEEP * REPLY_PRIOR + (1 - REPLY_KEEP) * 40)
    auto.end(list(range(999)))  # another mode's request (this auto has none open) changes nothing
    assert auto.reply == pytest.approx(REPLY_KEEP * REPLY_PRIOR + (1 - REPLY_KEEP) * 40)
    # forgetting the texts keeps the service's reply length (a kiosk's short answers stay known)
    auto.forget()
    assert auto.share == {} and auto.reply == pytest.approx(REPLY_KEEP * REPLY_PRIOR + (1 - REPLY_KEEP) * 40)


def test_the_share_counts_rounds_the_draft_would_win_in_step_even_when_its_catch_up_keeps_it_out():
    """A source kept out by its catch-up must not lose its share for that alone: else a prompt's
    catch-up, priced over a shrinking share, would keep the draft out of every reply for good."""
    c = cpu()
    model = Costly("model", first=0.035 + 30.0, prior=0.9)  # a catch-up no reply repays
    auto = AutoDrafter(c, [model])
    auto.begin([1, 2, 3])
    best, _ = auto.choose([1, 2, 3], 8)
    assert best is None and model.proposed == 0
    # in step it beats the target alone: its share moves toward 1 by SHARE_STEP
    assert auto.share["model"] == pytest.approx(SHARE_PRIOR + SHARE_STEP * (1 - SHARE_PRIOR))
    # a free source that beats it in step too: the share falls, never under the floor
    auto.sources.insert(0, Free("suffix", c.target_alone_rate() * 50))
    for _ in range(200):
        auto.choose([1, 2, 3], 8)
    assert auto.share["model"] == pytest.approx(SHARE_FLOOR)


def test_a_catch_up_that_pays_over_a_long_reply_does_not_pay_near_its_end():
    c = cpu()
    model = Costly("model", first=0.035 + 0.4, prior=0.9)
    auto = AutoDrafter(c, [model])
    auto.begin(list(range(50)))
    auto.share["model"] = 1.0
    assert auto.choose(list(range(50 + 1)), 8)[0] is model  # ~127 tokens left to serve
    auto.begin(list(range(50)))
    assert auto.choose(list(range(50 + 120)), 8)[0] is None  # MIN_LEFT tokens left: 0.4 s does not pay
