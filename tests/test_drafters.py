"""Drafters and the cost model: n-gram lookup, the draft model's cache bookkeeping, and the choices
the adaptive drafters make from measured costs."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.bundle import Bundle
from edgespec.costmodel import CostModel, expected_tokens, expected_tokens_chain
from edgespec.drafters import AutoDrafter, ModelDrafter, NgramDrafter, Proposal, common_prefix, ngram_lookup
from edgespec.runner import StepTimes, load_runner
from edgespec.sampling import SamplingParams

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
def times(**by_size) -> StepTimes:
    t = StepTimes()
    for s, sec in by_size.items():
        for _ in range(3):
            t.add(int(s[1:]), sec)
    return t


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


def test_model_drafter_learns_by_confidence(draft_runner):
    runner, usable = draft_runner
    d = ModelDrafter(runner, usable)
    p = Proposal([1, 2, 3], None, "model", [0.99, 0.5, 0.1])
    before = [b.mean for b in d.by_conf]
    d.feedback(p, 1, 0)  # first accepted, second rejected, third never judged
    after = [b.mean for b in d.by_conf]
    from edgespec.drafters import _conf_bin

    assert after[_conf_bin(0.99)] > before[_conf_bin(0.99)]
    assert after[_conf_bin(0.5)] < before[_conf_bin(0.5)]
    assert after[_conf_bin(0.1)] == before[_conf_bin(0.1)]


# --- auto ----------------------------------------------------------------------------------------
class StubModel:
    """Stands in for ModelDrafter in AutoDrafter tests (records being asked)."""

    def __init__(self, a):
        from edgespec.drafters import Beta

        self.mean = Beta(a, weight=1000)
        self.asked = 0
        self.last_seconds = 0.05
        self.last_steps = 2

    def acceptance(self, conf):
        return self.mean.mean

    def begin(self, ctx):
        pass

    def propose(self, ctx, k, params, rng):
        self.asked += 1
        return Proposal([1] * k, None, "model", [0.9] * k)

    def feedback(self, *a):
        pass


def test_auto_picks_nothing_when_drafting_cannot_pay():
    cpu = CostModel(times(s1=0.07, s2=0.09, s3=0.11, s4=0.13, s5=0.15), times(s1=0.05))
    model = StubModel(0.3)
    auto = AutoDrafter(cpu, NgramDrafter(cpu), model)
    picks = [auto.propose([1, 2, 3, 4, 5, 6], 4, GREEDY, None).source for _ in range(50)]
    assert picks.count("none") >= 45  # only the occasional exploration round drafts
    assert 1 <= model.asked <= 3


def test_auto_uses_the_model_when_it_pays_and_ngram_on_a_repeat():
    gpu = CostModel(times(s1=0.02, s2=0.0201, s3=0.0202, s4=0.0203, s5=0.0204), times(s1=0.003))
    model = StubModel(0.8)
    auto = AutoDrafter(gpu, NgramDrafter(gpu), model)
    assert auto.propose([1, 2, 3, 4, 5, 6], 4, GREEDY, None).source == "model"
    ng = NgramDrafter(gpu)
    ng.first_beta(4).add(100, 0)
    ng.next.add(100, 0)
    auto = AutoDrafter(gpu, ng, StubModel(0.3))
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
    auto = AutoDrafter(cm, NgramDrafter(cm), model)
    auto.begin([1, 2, 3])
    p = Proposal([5, 6], None, "model", [0.9, 0.9])
    assert auto.expected_yield(p) == pytest.approx(1 + 0.9 + 0.81)
    auto._m_round = (2, 0.04)
    before = auto.model_rate()
    auto.feedback(p, 2, 5)
    assert auto.model_rate() > before  # (2.71 tokens in 0.14 s) beats the start estimate
