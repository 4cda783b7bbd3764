"""One speculative round of one sequence on a runner's slot (core/slot.Slot), as the batch of one (engine/round.py's
public run_round, OneSlot, Seq and Conditions), for tests that drive a bare proposer (a drafter
with only propose and feedback) against fake runners."""
from __future__ import annotations

import numpy as np

from edgespec.core.constraint import Constraint
from edgespec.core.sampling import SamplingParams
from edgespec.core.speculative import Round
from edgespec.engine.results import GenerationStats
from edgespec.engine.round import Conditions, OneSlot, Seq, run_round


def speculative_round(target, drafter, ctx: list[int], k: int, params: SamplingParams,
                      rng: np.random.Generator, usable: int, constraint: Constraint | None = None) -> Round:
    """One round of `drafter` (it needs only propose and feedback: core/proposal.Proposer); ctx is
    not extended (the caller extends it with the round's tokens)."""
    s = Seq(0, ctx, _Bare(drafter), _Bare(drafter), k, params, rng, GenerationStats(), constraint=constraint)
    return run_round(OneSlot(target), [s], Conditions(usable))[0]


class _Bare:
    """A bare Proposer (tests) as a Drafter: the rest of the interface does nothing."""

    def __init__(self, p):
        self.p = p
        self.uses_model = bool(getattr(p, "uses_model", False))

    def propose(self, ctx, k, params, rng):
        return self.p.propose(ctx, k, params, rng)

    def feedback(self, proposal, accepted, valid_len):
        self.p.feedback(proposal, accepted, valid_len)

    def observe(self, rows, tokens):
        observe = getattr(self.p, "observe", None)
        if observe is not None:
            observe(rows, tokens)
