"""The cost model: step costs from measured times, and the margin a drafting choice must clear."""
from __future__ import annotations

import pytest

from edgespec.core.costmodel import CostModel
from edgespec.core.runner import StepTimes
from helpers.costs import times


def test_draft_steps_by_size_interpolate_up_to_the_prompt_prefill():
    cm = CostModel(times(s1=0.10), times(s1=0.04, s2=0.05, s97=0.42))
    assert cm.draft_step() == pytest.approx(0.04)
    assert cm.draft_step(2) == pytest.approx(0.05)
    assert cm.draft_step(49) == pytest.approx(0.05 + (0.42 - 0.05) * 47 / 95)
    assert cm.draft_step(194) == pytest.approx(0.84)  # past the longest: its cost per token
    assert cm.draft_steps([2, 1, 1]) == pytest.approx(0.13)


def test_draft_step_priors_before_any_draft_step_ran():
    cm = CostModel(times(s1=0.10))
    assert cm.draft_step() == pytest.approx(0.035)  # PRIOR_DRAFT_RATIO of a target step
    assert cm.draft_step(2) == pytest.approx(0.035 * 1.09)
    only_one = CostModel(times(s1=0.10), times(s1=0.04))
    assert only_one.draft_step(3) == pytest.approx(0.04 * 1.38)


def test_min_gain_turns_a_thin_promise_into_k0():
    cm = CostModel(times(s1=0.10, s2=0.11, s3=0.12))
    k, rate = cm.best_k(0.2, 2, draft_cost=0.0)  # 1.2 tokens for 1.1 steps: +9 %
    assert k == 1 and rate == pytest.approx(1.2 / 0.11)
    k, rate = cm.best_k(0.2, 2, draft_cost=0.0, min_gain=0.1)
    assert k == 0 and rate == pytest.approx(10.0)
    assert cm.best_k(0.9, 2, draft_cost=0.0, min_gain=0.1)[0] == 2  # a clear gain stays


def test_costs_are_memoised_until_a_median_changes():
    """A round reads verify() and draft_step() some 30 times; they are recomputed only when a step
    moves a median (StepTimes.version), or when the batch engine points `target` at another table."""
    t, d = times(s1=0.1, s2=0.12), times(s1=0.03)
    cm = CostModel(t, d)
    assert cm.verify(1) == 0.1 and cm.verify(3) == pytest.approx(0.14) and cm.draft_step(1) == 0.03
    v = t.version
    t.add(1, 0.1)  # the median stays: nothing changes, not even the version
    assert t.version == v
    t._recent[1].extend([0.5] * 8)  # behind its back: the memo answers (it is one)
    assert cm.verify(1) == 0.1 and cm.measured() == {1: 0.1, 2: 0.12}
    t.add(1, 0.5)  # a median moves: recomputed, and the 2-token step with it (kept as 1.2x the 1-token)
    assert t.version == v + 1 and cm.verify(1) == 0.5 and cm.measured() == pytest.approx({1: 0.5, 2: 0.6})
    assert cm.verify(3) == pytest.approx(0.7)  # the slope past size 2
    d.add(1, 0.09), d.add(1, 0.09), d.add(1, 0.09)  # the draft's table is watched too
    assert cm.draft_step(1) == 0.09
    cm.target = times(s1=0.2, s2=0.25)  # another table (batch.py: one per pass size)
    assert cm.verify(1) == 0.2 and cm.verify(2) == 0.25 and cm.measured() == {1: 0.2, 2: 0.25}


def test_a_burst_of_load_does_not_leave_longer_steps_priced_high_after_it_passes():
    """Steps of 2-5 tokens timed during a burst of load (everything 3x slower) must come back down
    when the burst ends, though only 1-token steps run after it: a chain priced out by a stale cost
    never runs again to correct it (StepTimes' docstring). Negative control: the seconds themselves
    stay at the burst's."""
    t = StepTimes()
    for _ in range(9):  # quiet: 1-token 40 ms, n tokens 40 ms x (1 + 0.15 (n - 1))
        for n in range(1, 6):
            t.add(n, 0.040 * (1 + 0.15 * (n - 1)))
    for _ in range(20):  # a burst: 1-token steps run most, and every size runs a few times
        for _ in range(3):
            t.add(1, 0.120)
        for n in range(2, 6):
            t.add(n, 0.120 * (1 + 0.15 * (n - 1)))
    assert t.recent(1) == pytest.approx(0.120) and t.recent(3) == pytest.approx(0.120 * 1.3)
    for _ in range(9):  # the burst is over; only 1-token steps run (nothing longer is proposed)
        t.add(1, 0.040)
    cm = CostModel(t)
    for n in range(1, 6):
        assert cm.verify(n) == pytest.approx(0.040 * (1 + 0.15 * (n - 1)))
    assert sorted(t._recent[3])[4] == pytest.approx(0.120 * 1.3)  # what the seconds alone would say
