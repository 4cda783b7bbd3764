"""Drafters and the cost model: n-gram lookup, the draft model's cache bookkeeping, and the choices
the adaptive drafters make from measured costs."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from edgespec.models.bundle import Bundle
from edgespec.core.costmodel import CostModel, expected_tokens, expected_tokens_chain
from edgespec.drafters import (EMPTY, OldAutoDrafter as AutoDrafter, Beta, CostedDrafter, DrafterBase, ModelDrafter, NgramDrafter, Proposal,
                               Quote, common_prefix, ngram_lookup)
from edgespec.drafters.model import conf_bin
from edgespec.drafters.tally import Tally, prompt_octave
from edgespec.engine.build import load_runner
from edgespec.core.runner import StepTimes
from edgespec.core.sampling import SamplingParams

from helpers.costs import times

GREEDY = SamplingParams()


# --- n-gram lookup -------------------------------------------------------------------------------
def test_ngram_prefers_the_longest_match():
    ctx = [1, 2, 3, 9, 9, 7, 2, 3, 4, 5, 6, 1, 2, 3]
    # suffix [1,2,3] occurred at 0 (followed by 9 9 7); suffix [2,3] also at 6 (followed by 4 5 6)
    assert ngram_lookup(ctx, 3) == ([9, 9, 7], 3)
    assert ngram_lookup(ctx, 3, max_n=2) == ([4, 5, 6], 2)


def test_ngram_takes_the_latest_occurrence_with_a_full_continuation():
    ctx = [5, 1, 1, 5, 2, 2, 5, 3, 5]
    assert ngram_lookup(ctx, 2) == ([3, 5], 1)
    assert ngram_lookup(ctx, 3) == ([2, 2, 5], 1)  # the latest one would give only [3, 5]


def test_ngram_no_match_and_edges():
    assert ngram_lookup([1, 2, 3, 4], 3) == ([], 0)
    assert ngram_lookup([1], 3) == ([], 0)
    assert ngram_lookup([1, 1, 1, 1], 0) == ([], 0)
    toks, n = ngram_lookup([7, 7, 7, 7], 3)
    assert toks == [7] * len(toks) and 1 <= len(toks) <= 3 and n == 3


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([9], [1]) == 0


# --- cost model ----------------------------------------------------------------------------------
def test_expected_tokens():
    assert expected_tokens(0, 0.7) == 1.0
    assert expected_tokens(3, 1.0) == 4.0
    assert expected_tokens(2, 0.5) == pytest.approx(1.75)
    assert expected_tokens_chain(0.5, 1.0, 3) == pytest.approx(2.5)


def test_cost_model_uses_measurements_and_fills_gaps():
    cm = CostModel(times(s1=0.10, s3=0.14), times(s1=0.03))
    assert cm.verify(1) == pytest.approx(0.10)
    assert cm.verify(3) == pytest.approx(0.14)
    assert cm.verify(5) == pytest.approx(0.10 * (1 + 0.2 * 4))  # slope fitted through s=3
    assert cm.draft_step() == pytest.approx(0.03)
    blank = CostModel(StepTimes())
    assert blank.verify(1) == 1.0 and blank.draft_step() == pytest.approx(0.35)


def test_best_k_follows_the_hardware():
    cpu = CostModel(times(s1=0.07, s2=0.088, s3=0.106, s4=0.124, s5=0.13), times(s1=0.026))
    gpu = CostModel(times(s1=0.02, s2=0.0201, s3=0.0202, s4=0.0203, s5=0.0204), times(s1=0.004))
    # a mediocre draft does not pay on the CPU but pays on the GPU-like device
    assert cpu.best_k(0.5, 8)[0] == 0
    k_gpu, rate = gpu.best_k(0.5, 8)
    assert k_gpu >= 1 and rate > gpu.target_alone_rate()
    # free proposals that are usually right pay even on the CPU
    assert cpu.best_k(0.9, 4, draft_cost=0.0)[0] >= 2


# --- draft model ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def draft_runner(tiny_bundle):
    b = Bundle.open(tiny_bundle)
    return load_runner(b.model_path("draft"), b.draft, 64), b.manifest.tokenizer.usable_vocab


def test_model_drafter_proposes_the_drafts_greedy_continuation(draft_runner):
    runner, usable = draft_runner
    runner.reset()
    d = ModelDrafter(runner, usable, adaptive=False)
    ctx = [5, 17, 42, 8]
    p = d.propose(ctx, 4, GREEDY, None)
    # reference: plain greedy decoding with the same runner from scratch
    runner.reset()
    row = runner.step(ctx, 1)[0]
    ref = []
    for _ in range(4):
        ref.append(int(np.argmax(row[:usable])))
        row = runner.step([ref[-1]], 1)[0]
    assert p.tokens == ref and p.source == "model" and p.q is None
    assert all(0 < c <= 1 for c in p.conf)


def test_model_drafter_cache_follows_the_context(draft_runner):
    runner, usable = draft_runner
    runner.reset()
    d = ModelDrafter(runner, usable, adaptive=False)
    ctx = [5, 17, 42, 8]
    p = d.propose(ctx, 3, GREEDY, None)
    assert d.tokens == ctx + p.tokens[:2] and runner.length == len(d.tokens)
    d.feedback(p, 1, len(ctx) + 1)  # one accepted, the round's own token will follow
    assert d.tokens == ctx + p.tokens[:1]
    ctx2 = ctx + p.tokens[:1] + [99]
    p2 = d.propose(ctx2, 2, GREEDY, None)
    assert d.tokens[: len(ctx2)] == ctx2
    # a different conversation: the cache is rewound to the common prefix, then refilled
    d.begin([5, 17, 1])
    assert d.tokens == [5, 17]
    p3 = d.propose([5, 17, 1], 2, GREEDY, None)
    fresh = ModelDrafter(runner, usable, adaptive=False)
    runner.reset()
    assert fresh.propose([5, 17, 1], 2, GREEDY, None).tokens == p3.tokens
    assert p2.tokens  # proposals keep coming after rewinds


def test_model_drafter_refuses_to_overflow_its_cache(draft_runner):
    runner, usable = draft_runner
    runner.reset()
    d = ModelDrafter(runner, usable, adaptive=False)
    assert d.propose(list(range(1, 63)), 4, GREEDY, None).tokens == []  # 62 + 3 > 64
    assert runner.length <= runner.max_len


def test_adaptive_model_drafter_stops_when_unsure(draft_runner):
    runner, usable = draft_runner
    runner.reset()
    cm = CostModel(times(s1=0.07, s2=0.088, s3=0.106, s4=0.124, s5=0.13, s6=0.15), times(s1=0.026))
    d = ModelDrafter(runner, usable, cm, adaptive=True)
    for b in d.by_conf:  # this draft is never right
        b.add(0, 50)
    d.mean.add(0, 50)
    assert d.propose([5, 17, 42, 8], 6, GREEDY, None).tokens == []
    d = ModelDrafter(runner, usable, cm, adaptive=True)
    for b in d.by_conf:  # a draft that is always right
        b.add(500, 0)
    d.mean.add(500, 0)
    assert len(d.propose([5, 17, 42, 8], 6, GREEDY, None).tokens) >= 3


def test_model_drafter_takes_its_confidence_at_its_word_until_evidence(draft_runner):
    """Before any verdict a bin's acceptance is its middle confidence (CONF_PRIOR_SCALE = 1). It was
    0.9 times that: measured on the real pair, the bins at 0.92+ accept 99.8-100 %, so a 4-token
    chain of confident tokens was priced at 4.05 tokens instead of ~5, `auto`'s estimate of the
    draft stayed 15 % under what it ran alone (it learns the bins only from the rounds it drafts), and
    the pinned-cost replay left code writing at 0.85x the draft alone."""
    from edgespec.drafters.model import CONF_PRIOR_SCALE

    runner, usable = draft_runner
    d = ModelDrafter(runner, usable)
    assert CONF_PRIOR_SCALE == 1.0
    assert d.acceptance(0.995) == pytest.approx(0.995)  # the top bin, [0.99, 1]
    assert d.acceptance(0.5) == pytest.approx(0.5)  # [0.4, 0.6)
    assert d.acceptance(0.05) == pytest.approx(0.1)  # [0, 0.2)


def test_model_drafter_learns_by_confidence(draft_runner):
    runner, usable = draft_runner
    d = ModelDrafter(runner, usable)
    p = Proposal([1, 2, 3], None, "model", [0.99, 0.5, 0.1])
    before = [b.mean for b in d.by_conf]
    d.feedback(p, 1, 0)  # first accepted, second rejected, third never judged
    after = [b.mean for b in d.by_conf]
    assert after[conf_bin(0.99)] > before[conf_bin(0.99)]
    assert after[conf_bin(0.5)] < before[conf_bin(0.5)]
    assert after[conf_bin(0.1)] == before[conf_bin(0.1)]


# --- auto ----------------------------------------------------------------------------------------
class StubModel(CostedDrafter):
    """Stands in for ModelDrafter in AutoDrafter tests: the real rate bookkeeping (CostedDrafter), a
    fixed acceptance, and a record of being asked."""

    name = "model"

    def __init__(self, a, costs=None):
        super().__init__(costs)
        self.mean = Beta(a, weight=1000)
        self.asked = 0

    def acceptance(self, conf):
        return self.mean.mean

    def prior_acceptance(self):
        return self.mean.mean

    def draft(self, ctx, k, params, rng):
        self.asked += 1
        self.last_sizes = [1, 1]
        return Proposal([1] * k, None, "model", [0.9] * k)


def auto_with(costs, ngram, model):
    """An AutoDrafter over an n-gram drafter and (optionally) a costed drafter sharing its costs."""
    if model is not None:
        model.costs = costs
    return AutoDrafter(costs, [d for d in (ngram, model) if d is not None])


class FixedQuote(DrafterBase):
    """A free drafter whose quote is set by the test."""

    name = "ngram"

    def __init__(self, rate, min_gain=0.10):
        self.rate, self.min_gain = rate, min_gain

    def quote(self, ctx, k):
        return Quote(self.rate, self.min_gain, Proposal([7], None, "ngram", ngram=1))


def test_auto_picks_nothing_when_drafting_cannot_pay():
    cpu = CostModel(times(s1=0.07, s2=0.09, s3=0.11, s4=0.13, s5=0.15), times(s1=0.05))
    model = StubModel(0.3)
    auto = auto_with(cpu, NgramDrafter(cpu), model)
    picks = [auto.propose([1, 2, 3, 4, 5, 6], 4, GREEDY, None).source for _ in range(50)]
    assert picks.count("none") >= 45  # only the occasional exploration round drafts
    assert 1 <= model.asked <= 3


def test_auto_uses_the_model_when_it_pays_and_ngram_on_a_repeat():
    gpu = CostModel(times(s1=0.02, s2=0.0201, s3=0.0202, s4=0.0203, s5=0.0204), times(s1=0.003))
    model = StubModel(0.8)
    auto = auto_with(gpu, NgramDrafter(gpu), model)
    assert auto.propose([1, 2, 3, 4, 5, 6], 4, GREEDY, None).source == "model"
    ng = NgramDrafter(gpu)
    ng.first_beta(4).add(100, 0)
    ng.next.add(100, 0)
    auto = auto_with(gpu, ng, StubModel(0.3))
    p = auto.propose([10, 11, 12, 13, 14, 15, 16, 10, 11, 12, 13], 4, GREEDY, None)
    assert p.source == "ngram" and p.tokens == [14, 15, 16, 10]


def test_ngram_drafter_learns_from_what_the_target_verified():
    """Every lookup is scored against the text that followed it, proposed or not."""
    cm = CostModel(times(s1=0.07, s2=0.088, s3=0.106, s4=0.124))
    ng = NgramDrafter(cm)
    ctx = [1, 2, 3, 4, 5, 6, 9, 1, 2]  # suffix [1, 2] (n=2) predicts 3 4 5
    before, nxt = ng.first_beta(2).mean, ng.next.mean
    assert ng.lookup(ctx, 3) == ([3, 4, 5], 2)
    ng.lookup(ctx + [7, 7], 3)  # the target wrote 7: the lookup was wrong
    assert ng.first_beta(2).mean < before and ng.next.mean == nxt
    before = ng.first_beta(2).mean
    ng.lookup(ctx, 3)
    ng.lookup(ctx + [3, 4, 5, 6], 3)  # right, and so were the next two
    assert ng.first_beta(2).mean > before and ng.next.mean > nxt


def test_auto_tracks_the_model_rate_from_confidence():
    cm = CostModel(times(s1=0.07, s2=0.08, s3=0.1), times(s1=0.02))
    model = StubModel(0.9)
    auto = auto_with(cm, NgramDrafter(cm), model)
    auto.begin([1, 2, 3])
    p = Proposal([5, 6], None, "model", [0.9, 0.9])
    assert model.expected_yield(p) == pytest.approx(1 + 0.9 + 0.81)
    # a request starts from the round its long-run acceptance buys at its best k (capability_round)
    k = cm.best_k(0.9, 4)[0]
    tok, sec = model.capability_round()
    assert k > 1 and tok == pytest.approx(expected_tokens(k, 0.9)) and model.rate() == pytest.approx(tok / sec)
    for _ in range(60):  # then follows its rounds: 2.71 expected tokens per 0.14 s (two draft steps, a 3-token verify)
        model.propose([1, 2, 3], 2, GREEDY, None)
        auto.feedback(p, 2, 5)
    assert model.rate() == pytest.approx(2.71 / 0.14, rel=0.01)


def test_auto_keeps_a_drafting_model_while_it_beats_a_plain_step():
    """Enter at a margin, leave at none (AutoDrafter.STAY_GAIN): a draft whose rate sits between the
    target's and its margin keeps drafting once it drafts, and is not chosen after a plain round (its
    probes aside). Replayed: on the third explaining prompt the draft's rate read 31.0 tokens/s against
    the target's 29.9 and its margin's 31.4; `auto` left it after one round and ran plain steps for 98
    of 127 tokens, where the draft alone ran 1.16x."""
    cpu = CostModel(times(s1=0.07, s2=0.075, s3=0.08), times(s1=0.02))
    r0 = cpu.target_alone_rate()
    model = StubModel(0.7)
    auto = auto_with(cpu, FixedQuote(0.0), model)
    auto.begin([1, 2, 3])
    p = Proposal([5, 6], None, "model", [0.9, 0.9])

    def set_rate(x):  # its recent rounds: x times the target alone (propose/feedback leave it there)
        model.m_tokens, model.m_seconds, model.m_catch = x * r0, 1.0, 0.0

    def round_(expect):
        set_rate(1.03)  # over a plain step, under its 5 % margin
        q = auto.propose([1, 2, 3], 2, GREEDY, None)
        assert q.source == expect
        auto.feedback(p if q.source == "model" else q, 2 if q.source == "model" else 0, 5)

    assert model.min_gain > 0.03 and auto.STAY_GAIN < 0.03
    round_("none")  # not drafting: under its margin, and too early for a probe (EARLY_TRIES)
    set_rate(1.2)
    q = auto.propose([1, 2, 3], 2, GREEDY, None)
    assert q.source == "model"  # clears its margin: it drafts
    auto.feedback(q, 2, 5)
    for _ in range(5):
        round_("model")  # it drafted the last round: it stays while it beats a plain step
    model.m_tokens = 0.99 * r0 * model.m_seconds  # under a plain step: it leaves
    q = auto.propose([1, 2, 3], 2, GREEDY, None)
    assert q.source == "none"
    auto.feedback(q, 0, 5)
    round_("none")  # back at 3 % over: a source that is not drafting must clear its margin again
    auto.begin([1, 2, 3, 4])  # and a new request starts without a streak
    round_("none")


# --- auto: never slower than the target alone ----------------------------------------------------
def test_auto_probes_the_model_a_bounded_number_of_times_per_request():
    cpu = CostModel(times(s1=0.07, s2=0.09, s3=0.11, s4=0.13, s5=0.15), times(s1=0.03, s2=0.035))
    model = StubModel(0.3)
    auto = auto_with(cpu, NgramDrafter(cpu), model)
    for _ in range(3):  # three requests of 400 rounds each
        auto.begin([1, 2, 3])
        asked = model.asked
        picks = []
        for _ in range(400):
            p = auto.propose([1, 2, 3, 4, 5, 6], 4, GREEDY, None)
            picks.append(p.source)
            auto.feedback(p, 0, 6)
        # every probe lost (nothing accepted, its rate under the margin): it stops after MAX_LOST_PROBES
        assert model.asked - asked == AutoDrafter.MAX_LOST_PROBES < AutoDrafter.MAX_PROBES
        probes = [i for i, s in enumerate(picks) if s == "model"]
        # the first after EARLY_TRIES plain rounds, then the gap doubles
        assert probes[0] == AutoDrafter.EARLY_TRIES
        gaps = np.diff(probes)
        assert list(gaps) == [AutoDrafter.EXPLORE_EVERY * 2 ** i for i in range(len(gaps))]


def test_auto_does_not_probe_a_cold_draft_cache():
    """A probe must not pay a prompt prefill or a long catch-up: while feeding the tokens the draft's
    cache lacks would cost more than PROBE_CATCH_UP_STEPS target steps beyond a round's usual
    catch-up, the model is not probed; it is used only if its estimate (with that catch-up priced in)
    clears the margin. No cold prefill at all before the reply has written PREFILL_WAIT tokens."""
    from edgespec.drafters.costed import FIRST_LOOK_PREFILLS, FIRST_LOOK_ROUNDS, PREFILL_WAIT, PROBE_CATCH_UP_STEPS

    assert FIRST_LOOK_PREFILLS == 1

    class ColdModel(StubModel):
        cold = 400

        def catch_up(self, ctx):
            return self.cold

    cpu = CostModel(times(s1=0.07, s2=0.09, s3=0.11, s4=0.13, s5=0.15), times(s1=0.03, s2=0.035))
    model = ColdModel(0.3)
    auto = auto_with(cpu, NgramDrafter(cpu), model)
    auto.begin([1, 2, 3])
    early = [1, 2, 3] + list(range(10, 10 + PREFILL_WAIT - 1))  # 7 reply tokens: a cold prefill is held
    ctx = early + [99]  # 8: it may be paid
    # its first looks in an engine pay the cold catch-up (its rate is mostly the prior until
    # FIRST_LOOK_ROUNDS rounds have run), but only once the reply has shown who writes it
    picks = [auto.propose(early, 4, GREEDY, None).source for _ in range(3)]
    assert picks == ["none"] * 3 and model.asked == 0
    auto.begin([1, 2, 3])
    picks = [auto.propose(ctx, 4, GREEDY, None) for _ in range(3)]
    assert [p.source for p in picks] == ["none", "none", "model"]
    auto.feedback(picks[-1], 0, len(ctx))
    assert model.rounds_seen == 1 and model.cold_looks == 1
    # one cold prefill is all its first looks pay (FIRST_LOOK_PREFILLS): the next request must be
    # won by its estimate
    auto.begin([1, 2, 3])
    assert [auto.propose(ctx, 4, GREEDY, None).source for _ in range(12)] == ["none"] * 12
    assert model.asked == 1
    model.rounds_seen = FIRST_LOOK_ROUNDS
    model.asked = 0
    # the cost bound in tokens on this curve: 12 tokens cost < 1 target step more than 2, 13 more
    assert model.catch_up_extra(12) <= PROBE_CATCH_UP_STEPS * cpu.verify(1) < model.catch_up_extra(13)
    for cold in (400, 13):
        model.cold = cold
        picks = [auto.propose(ctx, 4, GREEDY, None).source for _ in range(40)]
        assert model.asked == 0 and set(picks) == {"none"}
    model.cold = 12  # a short catch-up within a request: probing resumes
    picks = [auto.propose(ctx, 4, GREEDY, None).source for _ in range(40)]
    assert model.asked >= 1
    model.cold = 40  # a new request with a short prompt, cold again, and a draft that now clears the
    auto.begin([1, 2, 3])  # cold round's margin (10 %: no reply evidence here) with the prefill paid
    model.mean = Beta(0.99, weight=1000)
    model.reply_tokens, model.share = 128.0, 1.0  # recent replies: 128 tokens, all the draft's
    assert auto.propose(early, 4, GREEDY, None).source == "none"  # ... after PREFILL_WAIT reply tokens
    assert auto.propose(ctx, 4, GREEDY, None).source == "model"


def test_a_first_look_is_not_spent_on_a_reply_other_sources_write():
    """In a fresh engine the draft's first looks may pay a cold prompt prefill, but not in a reply
    whose first tokens other sources' proposals wrote more than FIRST_LOOK_SHARE of (measured: a
    chat-only replay that began with summaries paid the 190-token prefill in three of them for one
    model round each, 0.74x the suffix index alone)."""
    from edgespec.drafters.costed import FIRST_LOOK_SHARE, PREFILL_WAIT

    cpu = CostModel(times(s1=0.07, s2=0.09), times(s1=0.03, s2=0.035))
    model = StubModel(0.3, cpu)
    model.catch_up = lambda ctx: 400
    prompt = list(range(100))
    ctx = prompt + [7] * 10  # 10 reply tokens, past PREFILL_WAIT
    assert PREFILL_WAIT < 10
    model.begin(prompt)
    assert model.quote(ctx, 4).probe
    model.feedback(Proposal([1] * 5, None, "suffix"), 5, len(ctx))  # others wrote 5 of 10: half
    assert model.own_share(10) == 1 - FIRST_LOOK_SHARE and model.quote(ctx, 4).probe
    model.feedback(Proposal([1], None, "suffix"), 1, len(ctx))  # 6 of 10
    assert model.own_share(10) == pytest.approx(0.4) and not model.quote(ctx, 4).probe


def test_a_draft_left_unused_gets_another_look():
    """Past its first looks a cold draft is not probed, and its estimate only moves when it runs: once
    given up it stayed unused for good (the bench's second pass over the `code` set never ran it).
    After RELOOK_REQUESTS requests without it, one look may pay the prefill again, in a reply the
    other sources have not written most of."""
    from edgespec.drafters.costed import FIRST_LOOK_ROUNDS, PREFILL_WAIT, RELOOK_REQUESTS

    cpu = CostModel(times(s1=0.07, s2=0.09), times(s1=0.03, s2=0.035))
    model = StubModel(0.3, cpu)
    model.catch_up = lambda ctx: 400
    model.rounds_seen = FIRST_LOOK_ROUNDS
    prompt = list(range(100))
    ctx = prompt + list(range(1000, 1000 + PREFILL_WAIT))
    for idle in range(RELOOK_REQUESTS):
        model.begin(prompt)
        assert model.idle_requests == idle and not model.quote(ctx, 4).probe
        model.feedback(EMPTY, 0, len(ctx))
    model.begin(prompt)
    assert model.idle_requests == RELOOK_REQUESTS and model.quote(ctx, 4).probe
    model.feedback(Proposal([1] * 5, None, "suffix"), 5, len(ctx))  # others wrote 5 of its 8 tokens
    assert not model.quote(ctx, 4).probe
    model.catch_up = lambda ctx: 2
    model.feedback(model.propose(ctx, 4, GREEDY, None), 0, len(ctx))  # it runs in this request ...
    model.begin(prompt)
    assert model.idle_requests == 0  # ... so the count starts over


def test_a_reply_is_scored_for_at_most_tconf_max_tokens():
    """The target's confidence in a reply costs a softmax over the vocabulary per token, paid on every
    token of a reply the draft never runs in (`auto`'s loop: 1.1 ms per token against the suffix index
    alone's 0.5); past TCONF_MAX tokens the reply's estimate stays where it was."""
    from edgespec.drafters.costed import TCONF_MAX

    cpu = CostModel(times(s1=0.07, s2=0.09), times(s1=0.01, s2=0.012))
    model = StubModel(0.6, cpu)
    model.begin(list(range(50)))
    model.observe(logits_with_confidence([0.99] * (TCONF_MAX - 4)), [0] * (TCONF_MAX - 4))
    model.observe(logits_with_confidence([0.99] * 8), [0] * 8)  # crosses the cap: this round still counts
    sure = model.reply_acceptance()
    assert model._tconf[1] == TCONF_MAX + 4 and sure > 0.85
    model.observe(logits_with_confidence([0.05] * 40), [0] * 40)  # unscored: the estimate does not move
    assert model._tconf[1] == TCONF_MAX + 4 and model.reply_acceptance() == sure
    model.begin(list(range(50)))  # a new reply is scored again
    model.observe(logits_with_confidence([0.05] * 8), [0] * 8)
    assert model._tconf[1] == 8 and model.reply_acceptance() < 0.6


def test_a_choice_auto_priced_is_not_declined_by_the_drafter():
    """Alone, a cold draft whose prompt prefill would not pay back over the reply its recent requests
    suggest declines its first round (`_prefill_cannot_pay`: retrieval prompts ran 0.18x the target).
    Under `auto` the same check second-guessed a choice already priced from this reply's evidence
    (the target's confidence in it), with the rate of other texts: replayed, every relook of the second
    pass over code writing was declined and the draft never ran there (0.88 of the draft alone). A
    proposal asked for right after its own quote runs."""
    from edgespec.drafters.costed import FIRST_LOOK_ROUNDS, TCONF_EVIDENCE

    cpu = CostModel(times(s1=0.07, s2=0.075, s3=0.08, s4=0.085, s5=0.09), times(s1=0.03, s2=0.035))
    prompt = list(range(100))
    n = int(TCONF_EVIDENCE)
    ctx = prompt + list(range(1000, 1000 + n))  # nothing for the n-gram lookup to copy

    def cold_model():
        model = StubModel(0.8)
        model.catch_up = lambda c: 30  # its cache lacks 30 tokens
        auto = auto_with(cpu, NgramDrafter(cpu), model)
        model.rounds_seen = FIRST_LOOK_ROUNDS  # past its first looks, and used in the last request
        auto.begin(prompt)
        model.m_tokens, model.m_seconds = 1.03 / cpu.verify(1), 1.0  # its recent rounds: 3 % over the target
        model.reply_tokens = 60.0
        auto.observe(logits_with_confidence([0.99] * n, vocab=16), [0] * n)  # a reply the target is sure of
        return model, auto

    model, _ = cold_model()
    assert model._prefill_cannot_pay(ctx, 4)  # from its recent rate, the prefill does not pay
    assert model.propose(ctx, 4, GREEDY, None) is EMPTY and model.asked == 0  # alone: declined
    model, auto = cold_model()
    q = model.quote(ctx, 4)
    assert not q.probe and q.rate * cpu.verify(1) > 1.2  # not a look: a rate from this reply's evidence
    pick = auto.propose(ctx, 4, GREEDY, None)
    assert pick.source == "model" and model.asked == 1 and len(pick.tokens) >= 1
    # the quote is good for its own round only: a later proposal without one is checked again
    model2, _ = cold_model()
    model2.quote(ctx, 4)
    assert model2.propose(ctx + [5], 4, GREEDY, None) is EMPTY and model2.asked == 0


def test_a_draft_used_alone_is_not_declined_for_good():
    """`--draft model`: a cold draft whose prefill would not pay back over the reply expected declines
    its rounds, but its rate moves only when it runs: replayed, a dip just over the target's rate kept
    it off from the 21st prompt on, in both passes. After RELOOK_REQUESTS declined requests it runs."""
    from edgespec.drafters.costed import FIRST_LOOK_ROUNDS, RELOOK_REQUESTS

    cpu = CostModel(times(s1=0.07, s2=0.09), times(s1=0.03, s2=0.035))
    prompt = list(range(100))
    ctx = prompt + list(range(1000, 1010))
    model = StubModel(0.9, cpu)
    model.catch_up = lambda c: 400
    model.rounds_seen = FIRST_LOOK_ROUNDS
    for idle in range(RELOOK_REQUESTS):
        model.begin(prompt)
        model.reply_tokens, model.share = 40.0, 0.3  # short replies: the prefill would not pay back
        assert model.idle_requests == idle
        assert model.propose(ctx, 4, GREEDY, None) is EMPTY  # declined, and nothing learned
        model.feedback(EMPTY, 0, len(ctx))
    model.begin(prompt)
    model.reply_tokens, model.share = 40.0, 0.3
    assert model.idle_requests == RELOOK_REQUESTS
    prop = model.propose(ctx, 4, GREEDY, None)
    assert prop.source == "model" and model.asked == 1  # the look: it runs, and its rate can move
    model.feedback(prop, 2, len(ctx) + 3)
    model.begin(prompt)
    assert model.idle_requests == 0


def logits_with_confidence(confs, vocab=8) -> np.ndarray:
    """Logits rows whose best token (id 0) has softmax probability confs[i], the rest spread evenly."""
    rows = np.empty((len(confs), vocab), dtype=np.float32)
    for i, c in enumerate(confs):
        rows[i] = np.log(np.maximum(np.r_[c, np.full(vocab - 1, (1 - c) / (vocab - 1))], 1e-30))
    return rows


def test_target_confidence_is_the_softmax_probability_of_the_best_token():
    from edgespec.drafters.costed import target_confidence

    got = target_confidence(logits_with_confidence([0.5, 0.9, 0.99]))
    assert got == pytest.approx([0.5, 0.9, 0.99], abs=1e-6)


def test_the_target_confidence_in_a_reply_moves_the_drafts_expected_acceptance():
    """Before the draft runs in a reply, the target's confidence in the tokens it wrote says how the
    reply suits the draft (measured on the real pair: agreement ~= that confidence, token by token).
    Its judged tokens calibrate the ratio; TCONF_EVIDENCE tokens weigh as much as its long-run
    acceptance."""
    from edgespec.drafters.costed import CAL_PRIOR, TCONF_EVIDENCE

    cpu = CostModel(times(s1=0.07, s2=0.075, s5=0.09), times(s1=0.03, s2=0.035))
    model = StubModel(0.6, cpu)
    model.begin([1, 2, 3])
    blind = model.cold_rate()
    assert model.reply_acceptance() == 0.6
    n = int(TCONF_EVIDENCE)
    model.observe(logits_with_confidence([0.95] * n), [0] * n)
    assert model.reply_acceptance() == pytest.approx(0.5 * 0.6 + 0.5 * 0.95, abs=1e-6)
    assert model.cold_rate() > 1.1 * blind
    # its own proposal of 4, 1 accepted: 2 judged tokens (the rejection included), where the target
    # was sure: the draft agrees less than the target's confidence says, and the ratio learns it
    mine = model.propose([1, 2, 3, 4], 4, GREEDY, None)
    assert len(mine.tokens) == 4
    model.feedback(mine, 1, 5)
    model.observe(logits_with_confidence([1.0, 1.0]), [4, 1])
    assert (model.cal_ok, model.cal_conf) == pytest.approx((CAL_PRIOR + 1, CAL_PRIOR + 2), abs=1e-5)
    model.begin([1, 2, 3])  # a new reply: no evidence of its own yet, the calibration stays
    assert model.reply_acceptance() == 0.6 and model.cal_conf == pytest.approx(CAL_PRIOR + 2, abs=1e-5)
    model.observe(logits_with_confidence([0.3] * n), [0] * n)
    cal = (CAL_PRIOR + 1) / (CAL_PRIOR + 2)
    assert model.reply_acceptance() == pytest.approx(0.5 * 0.6 + 0.5 * cal * 0.3, abs=1e-6)
    assert model.cold_rate() < 0.95 * blind


def test_auto_pays_a_cold_prefill_for_a_reply_the_target_is_sure_of():
    """A cold draft, past its first looks, whose recent rounds ran 3 % over the target (under its 5 %
    margin): in a reply the target wrote with confidence 0.99 `auto` runs it, in one written at 0.3 it
    does not. Negative control: priced from its recent rounds (the rule before the reply's evidence
    was read), the sure reply gets no draft either."""
    from edgespec.drafters.costed import FIRST_LOOK_ROUNDS, MODEL_MIN_GAIN, TCONF_EVIDENCE

    cpu = CostModel(times(s1=0.07, s2=0.075, s3=0.08, s4=0.085, s5=0.09), times(s1=0.03, s2=0.035))
    prompt = list(range(100))
    n = int(TCONF_EVIDENCE)
    ctx = prompt + list(range(1000, 1000 + n))

    def pick(conf, evidence=True):
        model = StubModel(0.8)
        model.catch_up = lambda c: 3  # cold: its cache lacks the reply (a catch-up of ~0.005 s)
        auto = auto_with(cpu, NgramDrafter(cpu), model)
        if not evidence:
            model.cold_rate = model.rate
        model.rounds_seen = FIRST_LOOK_ROUNDS  # past its first looks: its estimate decides
        auto.begin(prompt)
        model.m_tokens, model.m_seconds = 1.03 / cpu.verify(1), 1.0  # 3 % over the target
        auto.observe(logits_with_confidence([conf] * n, vocab=16), [0] * n)
        quoted = model.quote(ctx, 4).rate * cpu.verify(1)  # over the target alone's rate
        return auto.propose(ctx, 4, GREEDY, None).source, quoted

    assert MODEL_MIN_GAIN == 0.05
    (sure, r_sure), (unsure, r_unsure), (blind, r_blind) = pick(0.99), pick(0.3), pick(0.99, evidence=False)
    assert (sure, unsure, blind) == ("model", "none", "none")
    assert r_sure > 1.10 and r_blind < 1.05 and r_unsure < 1.0


class Overpromise(DrafterBase):
    """A free drafter whose quote promises `a` acceptance per token of a 3-token proposal."""

    def __init__(self, name, costs, a):
        self.name, self.costs, self.a, self.min_gain = name, costs, a, 0.10

    def quote(self, ctx, k):
        e = expected_tokens(3, self.a)
        return Quote(e / self.costs.verify(4), self.min_gain, Proposal([7, 8, 9], None, self.name))


def test_auto_discounts_a_free_source_whose_quotes_do_not_come_true():
    """A source quoting 90 % acceptance whose chosen rounds then see nothing accepted loses auto's
    trust within a few rounds and is no longer used; one whose quotes come true keeps full trust, and
    reset_cache (forget) restores it."""
    cm = CostModel(times(s1=0.10, s2=0.11, s3=0.12, s4=0.13))
    liar = Overpromise("recycle", cm, 0.9)
    auto = AutoDrafter(cm, [liar])
    picks = []
    for _ in range(30):
        p = auto.propose([1, 2, 3], 4, GREEDY, None)
        picks.append(p.source)
        auto.feedback(p, 0, 4)
    assert picks[:3] == ["recycle"] * 3 and picks[-10:] == ["none"] * 10, picks
    assert auto.trust("recycle") < 0.3
    auto.forget()
    assert auto.trust("recycle") == 1.0
    honest = Overpromise("suffix", cm, 0.9)
    auto = AutoDrafter(cm, [honest])
    for _ in range(30):
        p = auto.propose([1, 2, 3], 4, GREEDY, None)
        assert p.source == "suffix"
        auto.feedback(p, 3, 7)  # every token accepted: more than the quote promised
    assert auto.trust("suffix") == 1.0


def test_auto_needs_a_margin_before_it_drafts():
    cm = CostModel(times(s1=0.10, s2=0.12, s3=0.14))
    r0 = cm.target_alone_rate()
    ctx = [1, 2, 3, 4]
    auto = AutoDrafter(cm, [FixedQuote(r0 * 1.05)])
    assert auto.propose(ctx, 4, GREEDY, None).source == "none"  # a thin promise is not worth the risk
    auto = AutoDrafter(cm, [FixedQuote(r0 * 1.5)])
    assert auto.propose(ctx, 4, GREEDY, None).source == "ngram"
    model = StubModel(0.9)
    auto = auto_with(cm, FixedQuote(0.0), model)
    model.m_tokens, model.m_seconds = 1.03, 1.0 / r0  # the model's rounds deliver 3 % more
    # not chosen on its rate: plain steps until its probe is due, and from the probe on it drafts
    # while it beats a plain step (the margin to stay, AutoDrafter.STAY_GAIN)
    picks = [auto.propose(ctx, 4, GREEDY, None).source for _ in range(10)]
    assert picks == ["none"] * auto.EARLY_TRIES + ["model"] * (10 - auto.EARLY_TRIES)
    model.m_tokens = 1.5
    assert auto.propose(ctx, 4, GREEDY, None).source == "model"


def test_ngram_plan_asks_for_the_margin_too():
    cm = CostModel(times(s1=0.10, s2=0.12, s3=0.14, s4=0.16))
    ng = NgramDrafter(cm)
    for b in (ng.first_beta(3), ng.next):
        b.a, b.b = 0.0, 0.0
    ng.first_beta(3).add(250, 750)  # one proposal: 1.25 tokens for 1.2 x the step, 4 % more
    ng.next.add(500, 500)
    k, rate = ng.plan([7, 8, 9], 3)
    assert k == 0 and rate == pytest.approx(cm.target_alone_rate())
    ng.min_gain = 0.0
    k, rate = ng.plan([7, 8, 9], 3)
    assert k == 1 and rate == pytest.approx(1.25 / 0.12)


class SimModel(CostedDrafter):
    """A draft model for the simulator: proposes the true next tokens, each right with
    probability `a` (then a wrong one), learns its acceptance from the verdicts like the real one,
    and reports the sizes of the draft steps a proposal ran (catch-up first). Its rate for `auto` is
    kept by the real bookkeeping (CostedDrafter)."""

    name = "model"

    def __init__(self, truth, a, rng, costs):
        super().__init__(costs)
        self.truth, self.a, self.rng = truth, a, rng
        self.mean = Beta(0.6, weight=8.0)
        self.seen = 0  # context tokens the fake draft cache holds

    def acceptance(self, conf):
        return self.mean.mean

    def prior_acceptance(self):
        return self.mean.mean

    def begin(self, ctx):
        self.seen = min(self.seen, len(ctx))
        super().begin(ctx)

    def catch_up(self, ctx):
        return len(ctx) - self.seen

    def draft(self, ctx, k, params, rng):
        self.last_sizes = [max(1, len(ctx) - self.seen)]
        toks = []
        for j in range(min(k, 3)):
            pos = len(ctx) - self.prompt_len + j
            right = self.rng.random() < self.a and pos < len(self.truth)
            toks.append(self.truth[pos] if right else -5)
            if j:
                self.last_sizes.append(1)
        self.seen = len(ctx) + len(toks) - 1
        return Proposal(toks, None, "model", [0.9] * len(toks))

    def learn(self, prop, accepted, valid_len):
        self.seen = min(self.seen, valid_len)
        if prop.source == "model" and prop.tokens:
            for i in range(min(accepted + 1, len(prop.tokens))):
                self.mean.add(i < accepted, i >= accepted)


def simulate(costs: CostModel, truth, prompt, a_model, *, seed=0, rounds_max=10_000):
    """Runs AutoDrafter against a known continuation `truth`, paying the cost model's seconds for
    every step; returns (tokens per second, the same for the target alone, rounds by source)."""
    rng = np.random.default_rng(seed)
    model = None if a_model is None else SimModel(truth, a_model, rng, costs)
    auto = auto_with(costs, NgramDrafter(costs), model)
    return simulate_request(auto, model, costs, truth, prompt, rng, rounds_max=rounds_max)


def simulate_request(auto, model, costs, truth, prompt, rng, *, rounds_max=10_000):
    """One request of `simulate` on drafters that may have served earlier ones."""
    if model is not None:
        model.truth, model.prompt_len = truth, len(prompt)
    ctx, pos, seconds, by = list(prompt), 0, 0.0, {}
    auto.begin(ctx)
    while pos < len(truth) - 1 and rounds_max:
        rounds_max -= 1
        p = auto.propose(ctx + [truth[pos]], 8, GREEDY, rng)  # ctx[-1] is the newest token
        ctx.append(truth[pos])
        pos += 1
        draft = p.tokens
        n = common_prefix(draft, truth[pos : pos + len(draft)])
        seconds += costs.verify(len(draft) + 1)
        if p.source == "model":
            seconds += costs.draft_steps(model.last_sizes)
        new = truth[pos : pos + n]
        ctx.extend(new)
        pos += n
        auto.feedback(p, n, len(ctx))
        by[p.source] = by.get(p.source, 0) + 1
    return pos / seconds, costs.target_alone_rate(), by


CPU = dict(s1=0.107, s2=0.151, s3=0.184, s4=0.193, s5=0.24, s6=0.27, s7=0.30, s8=0.33, s9=0.36)
GPU = dict(s1=0.02, s2=0.0201, s3=0.0202, s4=0.0203, s5=0.0204, s6=0.0205, s7=0.0206, s8=0.0207, s9=0.0208)


@pytest.mark.parametrize("a_model", [None, 0.3, 0.6, 0.8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_is_never_much_slower_than_the_target_on_text_that_does_not_repeat(a_model, seed):
    """The worst case for auto: nothing repeats, the draft model is mediocre and costs 45 % of a
    target step, a 2-token verify 41 % more (the dev machine). It must notice and stay at >= 0.95x."""
    rng = np.random.default_rng(100 + seed)
    truth = rng.integers(1000, 1_000_000, 300).tolist()
    prompt = rng.integers(1000, 1_000_000, 60).tolist()
    costs = CostModel(times(**CPU), times(s1=0.048, s2=0.06, s3=0.07, s97=0.42))
    rate, base, by = simulate(costs, truth, prompt, a_model, seed=seed)
    assert rate >= 0.95 * base, by


def test_auto_finds_the_gain_where_there_is_one():
    rng = np.random.default_rng(7)
    prompt = rng.integers(1000, 1_000_000, 120).tolist()
    # an edit of the prompt: long copied spans with a few changes
    truth = prompt[:40] + [5, 6] + prompt[42:100] + [7] + prompt[101:120]
    cpu = CostModel(times(**CPU), times(s1=0.048, s2=0.06, s3=0.07, s97=0.42))
    rate, base, by = simulate(cpu, truth, prompt, 0.3)
    assert rate >= 1.5 * base and by["ngram"] > by.get("model", 0), by
    # a GPU-like device where a verify costs one step and the draft is good: the model pays
    truth = rng.integers(1000, 1_000_000, 300).tolist()
    gpu = CostModel(times(**GPU), times(s1=0.003, s2=0.0031, s3=0.0032))
    rate, base, by = simulate(gpu, truth, prompt, 0.85)
    assert rate >= 1.5 * base and by["model"] > 100, by


def test_auto_weighs_a_cold_drafts_prompt_against_the_reply_left():
    """A draft model that pays once caught up (1.25x on this cost curve) is first used in a request
    only where its prompt prefill is paid back within the reply: after a short prompt, yes; after a
    2000-token prompt (4 s of draft prefill against ~2.7 s saved over a 128-token reply), no. Without
    the catch-up in its quote auto paid that prefill and ran at 0.88x the target alone."""
    rng = np.random.default_rng(3)
    costs = CostModel(times(**CPU), times(s1=0.02, s2=0.024, s3=0.028, s97=0.2))
    model = SimModel([], 0.8, rng, costs)
    auto = auto_with(costs, NgramDrafter(costs), model)
    model.mean = Beta(0.8, weight=50)  # its long-run acceptance is known from earlier requests
    for _ in range(2):  # short prompts: the model is used and pays
        model.seen = 0
        rate, base, by = simulate_request(auto, model, costs, rng.integers(1000, 10**6, 128).tolist(),
                                          rng.integers(1000, 10**6, 40).tolist(), rng)
        assert rate >= 1.1 * base and by.get("model", 0) > 20, by
    warm = copy.deepcopy((auto, model))
    model.seen = 0
    long_prompt = rng.integers(1000, 10**6, 2000).tolist()
    rate, base, by = simulate_request(auto, model, costs, rng.integers(1000, 10**6, 128).tolist(), long_prompt, rng)
    assert rate >= 0.97 * base and "model" not in by, by
    # the same prompt where recent replies ran ~2000 tokens: a long reply ahead pays the prefill back
    auto, model = warm
    model.seen, model.reply_tokens = 0, 2000.0
    rate, base, by = simulate_request(auto, model, costs, rng.integers(1000, 10**6, 1000).tolist(), long_prompt, rng)
    assert rate >= 1.1 * base and by.get("model", 0) > 100, by


def _mixed_run(kind: str, *, a=0.8, plen=400, copy=40, fresh=8, reps=6, seed=1) -> tuple[float, dict]:
    """Four requests (after two of fresh text that teach the draft its worth) whose replies alternate
    copies of the prompt (40 tokens) and fresh text (8): decode rate over the target alone's, and
    rounds by source. kind: "auto" (n-gram + draft model), "ngram" or "model" alone."""
    rng, r = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    costs = CostModel(times(**CPU), times(s1=0.015, s2=0.018, s3=0.021, s97=0.2))
    model = SimModel([], a, r, costs)
    model.mean, model.rounds_seen = Beta(a, weight=50), 100
    drafter = {"auto": lambda: auto_with(costs, NgramDrafter(costs), model),
               "ngram": lambda: auto_with(costs, NgramDrafter(costs), None), "model": lambda: model}[kind]()
    for _ in range(2):
        model.seen = 0
        simulate_request(drafter, model, costs, rng.integers(1000, 10**6, 128).tolist(),
                         rng.integers(1000, 10**6, 40).tolist(), r)
    tokens = seconds = 0.0
    by: dict = {}
    for _ in range(4):
        prompt = rng.integers(1000, 10**6, plen).tolist()
        truth = rng.integers(1000, 10**6, fresh).tolist()
        for _ in range(reps):
            s = int(rng.integers(0, plen - copy))
            truth += prompt[s : s + copy] + rng.integers(1000, 10**6, fresh).tolist()
        model.seen = 0
        rate, base, got = simulate_request(drafter, model, costs, truth, prompt, r)
        tokens += len(truth) - 1
        seconds += (len(truth) - 1) / rate
        for key, n in got.items():
            by[key] = by.get(key, 0) + n
    return tokens / seconds / base, by


def test_auto_keeps_up_with_its_best_source_when_the_draft_must_catch_up_on_copies():
    """Replies that copy 40 tokens of the prompt, then write 8 fresh ones, over and over: the n-gram
    copies, and the draft model (good on fresh text) must first read every copy the n-gram wrote.
    Pricing that catch-up as if the draft were then used for the rest of the reply, auto returned to
    it after every copy and ran at 0.975x the n-gram alone; with the catch-ups its returns paid
    counted in its rate (CostedDrafter.m_catch) and a pending one spread over its usual streak, auto
    keeps >= 0.98x its best single source."""
    auto, by = _mixed_run("auto")
    best = max(_mixed_run("ngram")[0], _mixed_run("model")[0])
    # seeded and simulated: the figures docs/speed.md quotes (the old rule: 0.975x, 90 model rounds).
    # With the draft's margin at 5 % (was 15 %: costed.MODEL_MIN_GAIN) auto returns to it between copies
    # more often here (0.996 -> 0.964 of its best source), the price of using it where it gains 5-15 %
    # on real text (the pinned-cost replay of the shipped sets: 0.966 -> 0.982 overall). Holding the
    # cold prefill until PREFILL_WAIT reply tokens alone made it 0.949 here (the first fresh 8 tokens
    # go undrafted, the prefill is paid later all the same); with a cold prefill's own margin
    # (PREFILL_MIN_GAIN, 10 %: this simulation calls no `observe`, so the draft's cold quote has no
    # evidence from the reply) it is 0.963: fewer model rounds (83 -> 55), as many copies. With a cold
    # quote scaled by how its rounds did against the n-gram's in replies to prompts this long
    # (CostedDrafter.edge: they lost here), 0.993: the draft's prefill is no longer bet on these replies
    assert auto / best == pytest.approx(0.993, abs=0.005), (auto, best, by)
    assert by["ngram"] == 123 and by["model"] == 16  # the copies stay the n-gram's


def test_a_costed_drafter_counts_the_catch_ups_over_other_sources_text():
    cm = CostModel(times(s1=0.1, s2=0.12), times(s1=0.01, s2=0.012, s97=0.2))
    model = SimModel([], 0.8, np.random.default_rng(0), cm)
    model.truth, model.prompt_len = list(range(100, 400)), 10
    ctx = list(range(10))
    model.begin(ctx)
    model.feedback(model.propose(ctx, 3, GREEDY, None), 3, 14)  # the prompt's prefill: not counted
    assert model.m_catch == 0.0
    ctx = ctx + list(range(100, 105))
    model.feedback(Proposal([1], None, "ngram"), 1, 16)  # another source drafted 2 tokens ...
    ctx = ctx + [105, 106, 107, 108, 109, 110, 111]
    model.feedback(model.propose(ctx, 3, GREEDY, None), 0, len(ctx) + 1)  # ... and more: its return pays
    assert model.m_catch > 0 and model.rate() < model.m_tokens / model.m_seconds
    plain = model.m_catch
    model.feedback(EMPTY, 0, len(ctx) + 2)  # plain rounds only since: not counted
    model.feedback(model.propose(ctx + [112, 113, 114], 3, GREEDY, None), 0, len(ctx) + 4)
    assert model.m_catch < plain


def test_draft_model_alone_skips_a_prompt_prefill_a_short_reply_cannot_pay_back():
    """`--draft model` on retrieval prompts (800 tokens, 10-token answers, as recent replies were):
    reading the prompt costs the draft more than its rounds save, so it proposes nothing (measured
    before: 0.18x the target alone); after a short prompt, or with long replies expected, it drafts."""
    rng = np.random.default_rng(4)
    costs = CostModel(times(**CPU), times(s1=0.02, s2=0.024, s3=0.028, s97=0.2))
    model = SimModel([], 0.8, rng, costs)
    model.mean, model.rounds_seen = Beta(0.8, weight=50), 100
    model.m_tokens, model.m_seconds = 3.0, 0.22  # it pays once caught up: ~1.3x the target alone
    model.reply_tokens = 12.0
    prompt = rng.integers(1000, 10**6, 800).tolist()
    model.seen = 0
    rate, base, by = simulate_request(model, model, costs, rng.integers(1000, 10**6, 10).tolist(), prompt, rng)
    assert by == {"none": 9} and rate == pytest.approx(base)
    model.seen = 0  # a short prompt: its prefill is cheap, the draft runs
    rate, base, by = simulate_request(model, model, costs, rng.integers(1000, 10**6, 10).tolist(), prompt[:20], rng)
    assert by.get("model", 0) >= 2, by
    model.seen, model.reply_tokens = 0, 2000.0  # long replies expected: the prefill is paid back
    rate, base, by = simulate_request(model, model, costs, rng.integers(1000, 10**6, 300).tolist(), prompt, rng)
    assert rate > 1.1 * base and by.get("model", 0) > 50, by


def test_costed_drafter_learns_how_long_replies_run():
    from edgespec.drafters.costed import PREFILL_WAIT, REPLY_KEEP, REPLY_PRIOR

    model = StubModel(0.8, CostModel(times(s1=0.1, s2=0.12), times(s1=0.02)))
    assert model.reply_tokens == REPLY_PRIOR
    model.begin(list(range(50)))
    model.feedback(EMPTY, 0, 51)
    model.feedback(EMPTY, 0, 60)  # the reply ran 10 tokens
    model.begin(list(range(30)))
    assert model.reply_tokens == pytest.approx(REPLY_PRIOR * REPLY_KEEP + 10 * (1 - REPLY_KEEP))
    # the catch-up is spread over what is left of the expected reply, never less than this round
    model.m_tokens, model.m_seconds = 2.0, 0.1
    model.catch_up = lambda ctx: 400
    early = model.quote(list(range(30 + PREFILL_WAIT)), 4).rate
    late = model.quote(list(range(30 + 200)), 4).rate
    assert 0 < late < early < model.rate()
    assert model.quote(list(range(30 + PREFILL_WAIT - 1)), 4).rate == 0  # the cold prefill is held
    model.catch_up = lambda ctx: 2
    assert model.quote(list(range(31)), 4).rate == pytest.approx(model.rate())


def test_ngram_match_that_continues_a_copied_span_has_its_own_estimate():
    cm = CostModel(times(s1=0.10, s2=0.11, s3=0.12, s4=0.13))
    ng = NgramDrafter(cm)
    src = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    ctx = src + [0, 11, 12]  # starts copying src
    assert ng.lookup(ctx, 2) == ([13, 14], 2) and not ng.last_cont
    first_before, cont_before = ng.first_beta(2).mean, ng.cont.mean
    ctx += [13, 14, 15]  # the copy went on: the next match is the same span, same distance back
    toks, n = ng.lookup(ctx, 2)
    assert toks == [16, 17] and ng.last_cont
    assert ng.first_beta(2).mean > first_before and ng.cont.mean == cont_before  # scored as a fresh match
    ctx += [16, 99]  # an edit: the continuation's first token was right, the second not
    ng.lookup(ctx, 2)
    assert ng.cont.mean > cont_before
    ng.use_cont = False
    ng.lookup(src + [0, 11, 12], 2)
    ng.lookup(src + [0, 11, 12, 13, 14, 15], 2)
    assert not ng.last_cont


def test_beta_fading_keeps_some_evidence():
    """A request start fades every estimate; a bin that sees no evidence for thousands of requests
    must keep its mean (it once faded to 0/0: a ZeroDivisionError on a long-running server)."""
    from edgespec.drafters.base import MIN_EVIDENCE, Beta

    b = Beta(0.3)
    for _ in range(5000):
        b.fade(0.25)
    assert b.mean == pytest.approx(0.3)
    assert b.a + b.b == pytest.approx(MIN_EVIDENCE)
    b.add(1, 0)
    assert b.mean > 0.5  # new evidence moves it fast


def test_a_cold_prefill_is_priced_over_the_share_this_reply_shows_the_draft_can_write():
    """A reply whose first 32 tokens the suffix index copied (30 of them) leaves the draft little to
    write: its cold prompt prefill is spread over that small share, not over the recent requests'."""
    from edgespec.drafters.costed import SHARE_EVIDENCE

    cm = CostModel(times(s1=0.1, s2=0.12), times(s1=0.02, s2=0.024, s97=0.3))
    model = StubModel(0.8, cm)
    model.share = 0.9  # recent requests: it wrote 90 % of their replies
    ctx = list(range(200))
    model.begin(ctx)
    assert model.request_share(0) == 0.9
    for _ in range(3):
        model.feedback(Proposal([1] * 10, None, "suffix"), 10, 0)  # 30 tokens the suffix index wrote
    w = 32 / (32 + SHARE_EVIDENCE)
    assert model.request_share(32) == pytest.approx((1 - w) * 0.9 + w * (2 / 32))
    model.catch_up = lambda c: len(c)  # cold: the whole prompt to read
    copying = model.quote(ctx + list(range(32)), 4).rate
    model._others = 0  # the same reply, written by plain steps: the draft could have written it all
    fresh = model.quote(ctx + list(range(32)), 4).rate
    assert copying < fresh < model.rate()


def test_a_cold_prefill_is_not_bet_where_the_drafts_rounds_lost_to_the_others_in_replies_this_long():
    """Its rounds' rate over the other sources' rounds' in the same replies is kept per octave of prompt
    length, and scales a cold quote where under 1. After two replies to 200-token prompts where the
    suffix index's rounds wrote 5 tokens per verify beside its 4, its cold prefill on the next 200-token
    prompt no longer clears the margin; after replies where the others were plain steps (negative
    control) it still does, and an 80-token prompt is priced from its own octave, with no evidence:
    edge 1 in both. Measured: `auto` paid the draft's prefill in every refactoring and summary reply
    (128+ token prompts) and ran 0.94 and 0.81 of the suffix index alone there."""
    from edgespec.drafters.costed import PREFILL_WAIT

    def engine(copying: bool):
        cm = CostModel(times(s1=0.1, s2=0.12, s3=0.14, s4=0.16, s5=0.18), times(s1=0.02, s2=0.024, s200=0.6))
        model = StubModel(0.9, cm)
        for _ in range(2):
            ctx = list(range(200))
            model.begin(ctx)
            for _ in range(10):  # its round: 4 tokens in 2 draft steps and a 5-token verify ...
                prop = model.propose(ctx, 4, GREEDY, None)
                ctx += [1] * 4
                model.feedback(prop, 3, len(ctx))
                if copying:  # ... beside a copy of 5 tokens in one 5-token verify
                    ctx += [1] * 5
                    model.feedback(Proposal([1] * 4, None, "suffix"), 4, len(ctx))
                else:  # ... or a plain step
                    ctx += [1]
                    model.feedback(EMPTY, 0, len(ctx))
        model.catch_up = lambda ctx: len(ctx)  # cold: the whole prompt to read
        return model, cm

    lost, cm = engine(True)
    won, _ = engine(False)
    margin = cm.target_alone_rate() * 1.10  # a cold round without reply evidence asks 10 %
    for model in (lost, won):
        model.begin(list(range(200)))
    ctx = list(range(200)) + [5] * PREFILL_WAIT
    assert lost.edge() == pytest.approx((70 / 3.85) / (87.5 / 3.15))  # 18.2 tokens/s against 27.8
    assert won.edge() == 1.0  # its rounds beat the plain steps: no discount above 1
    assert lost.quote(ctx, 4).rate < margin < won.quote(ctx, 4).rate
    assert prompt_octave(80) != prompt_octave(200)
    for model in (lost, won):
        model.begin(list(range(80)))
        assert model.edge() == 1.0 and model.quote(list(range(80)) + [5] * PREFILL_WAIT, 4).rate > margin


def test_a_tally_sums_recent_requests_and_compares_the_drafts_rounds_with_the_others():
    """`folded` weights the requests already in the record by `keep` and adds the new one; `edge` is the
    draft's rounds' tokens per second over the others', capped at 1, and 1 until `min_rounds` of its
    rounds are in (or where either side never ran)."""
    t = Tally().folded(Tally(4, 1.0, 2, 6, 1.0), 0.75)
    assert t == Tally(4, 1.0, 2, 6, 1.0) and t.edge(2) == pytest.approx(4.0 / 6.0) and t.edge(3) == 1.0
    t = t.folded(Tally(8, 2.0, 8, 0, 0.0), 0.75)
    assert t == Tally(11.0, 2.75, 9.5, 4.5, 0.75)
    assert t.edge(8) == pytest.approx(4.0 / 6.0) and t.edge(10) == 1.0  # 4 tokens/s against 6
    assert Tally(4, 1.0, 9, 0, 0.0).edge(8) == 1.0  # no other source ran: nothing to compare with
    assert Tally(6, 1.0, 9, 4, 1.0).edge(8) == 1.0  # its rounds were faster: no discount above 1
    assert [prompt_octave(n) for n in (0, 1, 63, 64, 127, 128)] == [1, 1, 6, 7, 7, 8]


@pytest.mark.parametrize("value, want", [(0.7623, 0.7623), (1, None), (0.0, None), (True, None), ("0.7", None),
                                         (None, None)])
def test_the_drafts_starting_acceptance_is_the_exports_measured_agreement(value, want):
    from edgespec.models.manifest import Manifest

    m = Manifest(name="x", models={}, tokenizer=None, files={}, drafting={} if value is None else {"draft_agreement": value})
    assert m.draft_agreement == want
