"""A draft that does not draft costs nothing (drafters/model.py's skip gate, and `auto` paying the
draft's catch-up only in a round that drafts with it): fake step costs and a fake draft runner that
counts its steps, so every decision is deterministic and no model runs."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edgespec.core.costmodel import CostModel
from edgespec.core.sampling import SamplingParams
from edgespec.drafters import AutoDrafter, Beta, ModelDrafter, Proposal, Quote
from edgespec.drafters.base import DrafterBase
from edgespec.drafters.model import CATCH_UP_WINDOW, MODEL_MIN_GAIN, PROBE_SHARE, PROBE_WINDOW

from helpers.costs import times

GREEDY = SamplingParams()
V = 50
# a 2-core CPU's target curve; a draft step of 0.035 s, and of 0.149 s for PROBE_WINDOW tokens
CPU = dict(s1=0.100, s2=0.109, s3=0.138, s4=0.163, s5=0.191, s6=0.206, s7=0.231, s8=0.256, s9=0.278)
DRAFT = {"s1": 0.035, "s2": 0.04, f"s{PROBE_WINDOW}": 0.149, f"s{CATCH_UP_WINDOW}": 0.9}


class CountingRunner:
    """A draft runner whose logits always put the next id (last token + 1, mod V) far ahead, so the
    draft is sure of it; it records the size of every step it runs."""

    def __init__(self, max_len: int = 4096):
        self.max_len, self.vocab_size, self.length = max_len, V, 0
        self.steps: list[int] = []

    def step(self, tokens, n):
        self.steps.append(len(tokens))
        self.length += len(tokens)
        row = np.zeros(V, dtype=np.float32)
        row[(tokens[-1] + 1) % V] = 40.0
        return row[None, :]

    def rewind(self, n):
        self.length = min(self.length, n)

    def reset(self):
        self.length = 0


def costs() -> CostModel:
    return CostModel(times(**CPU), times(**DRAFT))


def drafter(runner=None) -> ModelDrafter:
    return ModelDrafter(runner or CountingRunner(), V, costs(), prior=0.6)


def round_of(d, ctx: list[int], right: bool) -> tuple[Proposal, int]:
    """One serial round: propose, the target accepts every token (right) or none, then writes its own
    token. Returns the proposal and the draft steps it ran."""
    before = len(d.runner.steps)
    p = d.propose(ctx, 4, GREEDY, None)
    acc = len(p.tokens) if right else 0
    ctx.extend(p.tokens[:acc] + [7])
    d.feedback(p, acc, len(ctx) - 1)
    return p, len(d.runner.steps) - before


def test_a_draft_that_does_not_pay_makes_no_step_in_the_rounds_it_skips_and_probes_at_the_stated_rate():
    d = drafter()
    ctx = list(range(40))
    log = [round_of(d, ctx, right=False) for _ in range(400)]
    skipped = [steps for p, steps in log if not p.tokens]
    drafted = [i for i, (p, steps) in enumerate(log) if steps]
    assert all(steps == 0 for steps in skipped)  # a skipped round runs no draft step
    assert len(skipped) > 350
    # a probe is due when the skipped rounds' target time times PROBE_SHARE covers its catch-up: a
    # PROBE_WINDOW-token step of 0.149 s against 0.1 s a round -> every 50 skipped rounds
    gap = math.ceil(0.149 / (0.1 * PROBE_SHARE))
    assert gap == 50
    late = [b - a - 1 for a, b in zip(drafted, drafted[1:])][-4:]
    assert late == [gap] * 4
    # a probe reads only the last PROBE_WINDOW tokens afresh, then drafts one token at least
    probe = log[drafted[-1]]
    assert probe[1] == 1 and len(probe[0].tokens) == 1
    assert d.runner.steps[-1] == PROBE_WINDOW


def test_a_draft_whose_acceptance_recovers_drafts_again_after_a_probe():
    d = drafter()
    ctx = list(range(40))
    for _ in range(200):
        round_of(d, ctx, right=False)
    assert not d.pays(4)
    log = [round_of(d, ctx, right=True) for _ in range(150)]
    first = next(i for i, (p, _) in enumerate(log) if p.tokens)
    assert first <= math.ceil(0.149 / (0.1 * PROBE_SHARE))  # the next probe, at the latest
    assert all(p.tokens for p, _ in log[first:])  # from then on it drafts every round
    assert d.pays(4)


@pytest.mark.parametrize("acceptance, drafts", [(0.48, False), (0.56, True)])
def test_the_gate_drafts_only_for_a_gain_of_model_min_gain(acceptance, drafts):
    """At these costs a 1-token chain is the best: (1 + a) tokens for a 0.035 s draft step and a
    0.109 s verify against 0.1 s a token alone. At 0.48 it promises 2.8 % more, under MODEL_MIN_GAIN:
    skipped; at 0.56, 8.3 %: drafted."""
    d = drafter()
    d.rounds = Beta(acceptance, weight=1000.0)
    gain = (1 + acceptance) / (0.035 + 0.109) * 0.100 - 1
    assert (gain >= MODEL_MIN_GAIN) is drafts and gain > 0
    assert d.pays(4) is drafts
    assert d.costs.best_k(acceptance, 4)[0] == 1  # without the margin both would draft


def test_a_new_request_s_own_misses_stop_the_draft_within_a_few_rounds():
    """Earlier requests left a per-round acceptance of 0.6 with the evidence of ~33 rounds (Beta's
    0.97 keep, a verdict a round): a new request (begin) whose first two rounds are rejected stops
    drafting; without weakening the earlier evidence at begin the same two misses leave it drafting."""
    def taught():
        d = drafter()
        d.rounds = Beta(0.6, weight=33.0)
        return d, list(range(40))

    d, ctx = taught()
    d.begin(ctx)
    assert [bool(round_of(d, ctx, right=False)[0].tokens) for _ in range(3)] == [True, True, False]
    d, ctx = taught()
    assert [bool(round_of(d, ctx, right=False)[0].tokens) for _ in range(3)] == [True, True, True]


def test_a_draft_that_pays_drafts_every_round_and_catches_up_one_token_a_round():
    d = drafter()
    ctx = list(range(40))
    log = [round_of(d, ctx, right=True) for _ in range(30)]
    assert all(p.tokens for p, _ in log)
    assert d.runner.steps[0] == 40  # the prompt, once, on the first round that drafts
    assert max(d.runner.steps[1:]) <= 2  # then the target's token (with the last drafted one)


def test_a_fixed_k_draft_is_not_gated():
    d = ModelDrafter(CountingRunner(), V, costs(), adaptive=False)
    for b in (d.rounds, *d.by_conf):
        b.add(0, 500)  # never right: still a fixed k drafts every round
    ctx = list(range(10))
    assert all(round_of(d, ctx, right=False)[0].tokens for _ in range(20))


class Suffix(DrafterBase):
    """A free source that always quotes a high rate."""

    name = "suffix"

    def __init__(self, rate: float):
        self.rate = rate

    def quote(self, ctx, k):
        return Quote(self.rate, Proposal([1, 2], None, self.name))


def test_auto_choosing_suffix_over_a_long_prompt_pays_no_draft_catch_up():
    c = costs()
    runner = CountingRunner()
    model = ModelDrafter(runner, V, c, prior=0.9)
    auto = AutoDrafter(c, [Suffix(c.target_alone_rate() * 5), model])
    prompt = list(range(3000))
    auto.begin(prompt)
    auto.prefill(prompt)
    ctx = list(prompt)
    for _ in range(50):
        p = auto.propose(ctx, 4, GREEDY, None)
        assert p.source == "suffix"
        ctx.extend(p.tokens + [7])
        auto.feedback(p, len(p.tokens), len(ctx) - 1)
    assert runner.steps == []  # not one draft step: not the prompt, not the suffix's text
    # the catch-up it would pay is priced at its window, not the 3,000-token prompt
    assert model.catch_up(ctx) == CATCH_UP_WINDOW
    assert model.cost(ctx).first == pytest.approx(0.9)


def test_auto_drafts_with_the_model_past_its_own_gate_and_pays_the_catch_up_then():
    c = costs()
    runner = CountingRunner()
    model = ModelDrafter(runner, V, c, prior=0.9)
    model.rounds.add(0, 500)  # the model's own gate would skip every round ...
    assert not model.pays(4)
    auto = AutoDrafter(c, [model])
    auto.posteriors["model"] = Beta(0.95, 500, keep=1.0)
    ctx = list(range(300))
    auto.begin(ctx)
    p = auto.propose(ctx, 4, GREEDY, None)  # ... but auto priced the round and chose it
    assert p.source == "model" and p.tokens
    assert runner.steps[0] == CATCH_UP_WINDOW  # the catch-up, in one step, in the round that drafts
