"""The width of a batched verify: how many tokens each row of the pass may carry.

A batched pass is a rectangle: B rows (requests) by S tokens, every row right-padded to the longest
one (core/runner.py), so its cost T(B, S) is set by the longest row, and one request's long
proposal makes every row pay for S tokens. Each request's drafter sizes its proposal as if the pass
were its own; this module then chooses S for the round as a whole:

    S* = argmax over S of  sum_i E_i[tokens | min(len_i, S - 1) proposals]  /  T(B, S)

and cuts every adaptive row to S* - 1 proposals. S = 1 (no drafting at all) is always a candidate, so
a batched round with drafting is never expected to yield fewer tokens per second than the same batch
with drafting off: the batched `auto` >= batched `none` rule of the batching issue, decided from the
device's measured pass times. A wider S must promise `min_gain` more than the narrowest allowed one,
because the acceptance estimates are noisy and a wrong "wider" costs every row.

Rows with a fixed k (the client asked for it) are never cut: they set the narrowest S allowed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..core.costmodel import chain_tokens

UNKNOWN_ACCEPT = 0.5  # per-token acceptance assumed for a proposal that carries no estimate
WIDTH_MIN_GAIN = 0.05


@dataclass
class RowPlan:
    """One request's proposal in the round. accept[j]: the estimated probability that proposal j is
    accepted given every one before it was (None: no estimate). fixed: the length may not be cut."""

    proposed: int
    accept: Sequence[float] | None = None
    fixed: bool = False


def expected_tokens(row: RowPlan, j: int) -> float:
    """Tokens the row yields with its first j proposals verified: 1 + a0 + a0 a1 + ..."""
    known = list(row.accept or ())
    accs = (known[i] if i < len(known) else UNKNOWN_ACCEPT for i in range(min(j, row.proposed)))
    return chain_tokens(min(1.0, max(0.0, float(a))) for a in accs)


def choose_width(rows: Sequence[RowPlan], pass_seconds: Callable[[int], float],
                 min_gain: float = WIDTH_MIN_GAIN) -> int:
    """S*, the tokens per row of this round's pass (see the module docstring); S - 1 is the most
    proposals an adaptive row keeps. pass_seconds(S) is the measured (or estimated) time of a pass of
    this many rows at width S."""
    if not rows:
        return 1
    narrowest = max([1] + [r.proposed + 1 for r in rows if r.fixed])
    widest = max([narrowest] + [r.proposed + 1 for r in rows])

    def rate(s: int) -> float:
        t = pass_seconds(s)
        return sum(expected_tokens(r, s - 1) for r in rows) / t if t > 0 else 0.0

    floor = rate(narrowest)
    best, best_rate = narrowest, floor
    for s in range(narrowest + 1, widest + 1):
        r = rate(s)
        if r > best_rate and r > floor * (1.0 + min_gain):
            best, best_rate = s, r
    return best
