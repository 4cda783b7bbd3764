"""The width of a batched verify (engine/round_shape.py): chosen for the batch, never worse than
no drafting by the batch's own measured pass times."""
from __future__ import annotations

import pytest

from edgespec.engine.round_shape import RowPlan, choose_width, expected_tokens


def linear(fixed: float, per_token: float):
    """A pass of width S costs fixed + per_token * S (seconds)."""
    return lambda s: fixed + per_token * s


def test_expected_tokens_counts_the_accepted_prefix():
    row = RowPlan(3, [0.5, 0.5, 0.5])
    assert expected_tokens(row, 0) == 1.0
    assert expected_tokens(row, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(row, 9) == pytest.approx(1 + 0.5 + 0.25 + 0.125)  # only what was proposed
    assert expected_tokens(RowPlan(2, None), 2) == pytest.approx(1 + 0.5 + 0.25)  # no estimate: 0.5 each


def test_sure_copies_widen_a_cheap_pass():
    rows = [RowPlan(4, [0.95] * 4), RowPlan(4, [0.9] * 4)]
    assert choose_width(rows, linear(0.05, 0.005)) == 5


def test_doubtful_proposals_on_an_expensive_pass_are_dropped():
    """Each extra token of width costs every row: guesses at 0.3 do not pay for two rows of it."""
    rows = [RowPlan(4, [0.3] * 4), RowPlan(0)]
    assert choose_width(rows, linear(0.03, 0.02)) == 1


def test_one_long_row_is_cut_when_the_others_pay_for_its_padding():
    """A sure 8-token copy alone would go wide; among three rows with nothing to propose, the
    padding it forces on them makes a shorter width better."""
    copy = RowPlan(8, [0.95] * 8)
    alone = choose_width([copy], linear(0.05, 0.002))
    shared = choose_width([copy, RowPlan(0), RowPlan(0), RowPlan(0)], linear(0.05, 0.02))  # 4 rows per token
    assert alone == 9 and 1 <= shared < alone


def test_fixed_rows_set_the_narrowest_width():
    """A client's fixed k is never cut: the width is at least its row's."""
    rows = [RowPlan(3, [0.01] * 3, fixed=True), RowPlan(6, [0.01] * 6)]
    assert choose_width(rows, linear(0.03, 0.05)) == 4


def test_a_wider_pass_must_promise_the_margin():
    """Noisy estimates: a width that promises less than min_gain over the narrowest is not taken."""
    t = linear(0.05, 0.01)
    rows = [RowPlan(1, [0.2])]
    r1 = 1 / t(1)
    r2 = (1 + 0.2) / t(2)
    assert r2 > r1 and r2 < r1 * 1.2  # better, but by less than the margin below
    assert choose_width(rows, t, min_gain=0.2) == 1
    assert choose_width(rows, t, min_gain=0.0) == 2


def test_no_rows_is_width_one():
    assert choose_width([], linear(1, 1)) == 1
