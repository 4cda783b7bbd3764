"""The grammar drafter: the tokens a request's JSON schema or grammar forces, proposed for free.

In a schema-constrained answer many tokens are forced: braces, quotes, keys, the rest of an enum
value once its first token is out. Proposing them costs no model step, and the masked target accepts
them unless it tokenizes the same text differently (rare: the grammar allows any tokenization of its
text, and a forced run is the canonical one). Without a constraint it proposes nothing.

Two ways in:
- `GrammarDrafter`: a free source like the n-gram lookup (mode "grammar", and one of `auto`'s sources,
  which prices it by its quote);
- `with_grammar(drafter, constraint)`: every other mode's proposals under a constraint start with the
  forced tokens and go on with the mode's own drafter from there, inside the same round (the model
  drafts the free text between the forced runs, the forced runs cost it nothing).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.constraint import Constraint
from ..core.proposal import EMPTY, Proposal
from .base import Beta, DrafterBase, Drafter, Quote, StepPlan, drive

FORCED_PRIOR = 0.95  # a forced token is accepted unless the target picks another tokenization of its text
MIN_GAIN = 0.02  # free and nearly certain: a small margin over a plain step is enough


class GrammarDrafter(DrafterBase):
    name = "grammar"

    def __init__(self, costs=None, constraint: Constraint | None = None, acc: Beta | None = None):
        self.costs = costs
        self.constraint = constraint
        self.acc = acc if acc is not None else Beta(FORCED_PRIOR)  # a forced token's acceptance (learned)
        self._start = 0  # len(ctx) when the request began: the constraint has consumed ctx[start:start+consumed]
        self._mine: Proposal | None = None

    def attach(self, constraint: Constraint | None) -> bool:
        """The request's constraint (None: an unconstrained request, nothing to propose); it is
        what this drafter drafts from, so no wrapper is needed."""
        self.constraint = constraint
        return True

    def begin(self, ctx: Sequence[int]) -> None:
        self._start = len(ctx)

    def forced(self, ctx: Sequence[int], k: int) -> list[int]:
        """At most k tokens the grammar forces after ctx (ctx may run ahead of the constraint's state:
        `auto` and `with_grammar` ask after other tokens of the same round)."""
        c = self.constraint
        if c is None or k <= 0:
            return []
        at = self._start + c.consumed
        return c.forced(list(ctx[at:]))[:k]

    def propose(self, ctx, k, params, rng) -> Proposal:
        tokens = self.forced(ctx, k)
        if not tokens:
            self._mine = None
            return EMPTY
        self._mine = Proposal(tokens, None, "grammar", accept=[self.acc.mean] * len(tokens))
        return self._mine

    def quote(self, ctx: Sequence[int], k: int) -> Quote | None:
        prop = self.propose(ctx, k, None, None)
        if not prop.tokens or self.costs is None:
            return None
        a = self.acc.mean
        expected = 1.0 + sum(a ** (j + 1) for j in range(len(prop.tokens)))
        rate = expected / self.costs.verify(len(prop.tokens) + 1)
        return Quote(rate, prop) if rate >= self.costs.target_alone_rate() * (1.0 + MIN_GAIN) else None

    def feedback(self, proposal: Proposal, accepted: int, valid_len: int) -> None:
        if self._mine is not None and proposal is self._mine:
            hit = min(accepted, len(proposal.tokens))
            self.acc.add(hit, 1.0 if hit < len(proposal.tokens) else 0.0)
        self._mine = None


class WithGrammar(DrafterBase):
    """A drafter under a constraint: each round proposes the forced tokens first, then what `inner`
    proposes after them (a sampled proposal's distributions get one-hot rows for the forced
    positions, where the proposal is deterministic)."""

    def __init__(self, inner: Drafter, grammar: GrammarDrafter):
        self.inner = inner
        self.grammar = grammar
        self.name = inner.name
        self._last: tuple[Proposal, Proposal] = (EMPTY, EMPTY)  # this round's (forced, inner's) proposals

    @property
    def uses_model(self) -> bool:
        return self.inner.uses_model

    def begin(self, ctx) -> None:
        self.grammar.begin(ctx)
        self.inner.begin(ctx)

    def prefill(self, ctx) -> None:
        self.inner.prefill(ctx)

    def set_adaptive(self, on: bool) -> None:
        self.inner.set_adaptive(on)

    def reset(self) -> None:
        self.inner.reset()

    def forget(self) -> None:
        self.inner.forget()

    def observe(self, rows, tokens) -> None:
        self.inner.observe(rows, tokens)

    def propose(self, ctx, k, params, rng) -> Proposal:
        return drive(self.propose_steps(ctx, k, params, rng))

    def propose_steps(self, ctx, k, params, rng, now: bool = False) -> StepPlan:
        """The forced tokens, then inner's plan after them (its model steps, if any, are yielded)."""
        forced = self.grammar.propose(ctx, k, params, rng)
        f = forced.tokens
        rest = EMPTY
        if len(f) < k:
            rest = yield from self.inner.propose_steps(list(ctx) + f, k - len(f), params, rng, now=now)
        self._last = (forced, rest)
        if not f or not rest.tokens:
            return rest if not f else forced
        q = None
        if rest.q is not None:
            q = np.zeros((len(f) + rest.q.shape[0], rest.q.shape[1]), dtype=rest.q.dtype)
            q[np.arange(len(f)), f] = 1.0
            q[len(f):] = rest.q
        accept = forced.accept + rest.accept if rest.accept else []
        return Proposal(f + rest.tokens, q, f"grammar+{rest.source}", conf=rest.conf, ngram=rest.ngram,
                        accept=accept)

    def feedback(self, proposal, accepted, valid_len) -> None:
        forced, rest = self._last
        nf = len(forced.tokens)
        if nf:
            self.grammar.feedback(forced, min(accepted, nf), valid_len)
        self.inner.feedback(rest, max(0, accepted - nf), valid_len)
        self._last = (EMPTY, EMPTY)


def with_grammar(drafter: Drafter, constraint: Constraint | None, shared: GrammarDrafter | None = None) -> Drafter:
    """The drafter a request runs with: `drafter` itself when unconstrained or when it is the target
    alone (mode none: no drafts at all); the grammar drafter (mode grammar) attached to the
    constraint; any other mode wrapped so its proposals start with the forced tokens. A grammar
    source of `auto` is attached too, so it can quote the forced tokens after another source's.
    `shared`: the engine's grammar drafter, whose acceptance estimate the wrapper's shares."""
    if drafter.attach(constraint) or constraint is None:  # (Drafter.attach)
        return drafter
    acc = shared.acc if shared is not None else None
    return WithGrammar(drafter, GrammarDrafter(shared.costs if shared is not None else None, constraint, acc))
