"""One speculative round for a batch of sequences: draft -> verify -> accept -> rewind.

    rounds = run_round(target, seqs, conditions)      # seqs: [Seq], one per sequence; -> [Round]

The engine (batch.BatchEngine) runs one for all the requests generating, however many slots it
has. What a round does, in order:

1. limits: the governor's (max k, free drafts only, no drafts, pacing), read once per round; under
   "free drafts only" a sequence whose drafter uses a model drafts with its free fallback instead;
2. propose: each sequence's drafter proposes at most its k tokens (`Seq.k`, already capped by the
   cache and max_new_tokens), cut at the first id past the usable vocabulary. Where several
   sequences' drafters step a model, they propose as step plans (drafters/base.py) driven together
   in lockstep (engine/draft_batch.run_plans: one batched step a turn per draft runner, the draft
   model's or the self-draft's, for every sequence drafting with it); a sequence drafting alone
   with a model proposes with a plain call.
   A sequence with a tree verifier of its own (`Conditions.verifier(slot)`: with one slot, every
   request's; with several, the slot's of a tree="on" request) proposes through it and may widen
   its proposal into a tree (engine/tree_round.py);
3. width: in a batch of several chains, the pass is as wide as its longest row, so adaptive rows are
   cut to the width with the most expected tokens per second for the batch (round_shape.py);
4. verify: one target pass over every chain row (`Target.step`); each tree is verified by its
   verifier, alone on its own slot (step_tree, then compact);
5. accept (core/speculative.accept, the one place logits become accept decisions), rewind the sequence's cache to
   what it accepted, feedback and observe to its drafter, count the round in its stats;
6. the governor hears of the tokens, and paces.

A round does not know which drafter it drives: it meets them through drafters.base.Session only.

Every sequence accepts exactly what it would alone: greedy rows are the target's argmax whatever
their neighbours; a sampled row draws from its own RNG in its own order (bitwise with the runners'
deterministic mode, where a row does not depend on the other rows of the pass).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from ..core import speculative as spec
from ..core.constraint import Constraint
from ..core.proposal import EMPTY, Proposal
from ..core.sampling import SamplingParams
from ..core.speculative import Round, usable_draft
from ..drafters.base import Session
from .draft_batch import run_plans
from .results import GenerationStats
from .round_shape import RowPlan, choose_width


class RoundLimits(Protocol):
    max_k: int | None  # cap on proposals per round (None: no cap)
    drafting: str  # "any" | "ngram" (free drafts only) | "none"
    pace_s: float  # pause after each round (0: none)


class Governor(Protocol):
    """What a round asks of a power/thermal governor (edgespec.edge.governor.Governor is the real one)."""

    def limits(self) -> RoundLimits: ...

    def on_tokens(self, n: int) -> None: ...

    def mark(self): ...

    def j_per_token_since(self, mark) -> float | None: ...

    def close(self) -> None: ...


class Target(Protocol):
    """The target as a round sees it: a cache slot per sequence, one pass for all their rows.
    core/runner.ModelRunner is one (the engine's); OneSlot puts one core/slot.Slot behind it."""

    def step(self, rows: Mapping[int, Sequence[int]]) -> Mapping[int, np.ndarray]: ...  # {slot: [s, V]}

    def rewind(self, slot: int, length: int) -> None: ...


class OneSlot:
    """One sequence (a core/slot.Slot) as a round's only one (slot 0): a bare target for a round
    outside the engine (tests that drive one proposer)."""

    def __init__(self, runner):
        self.runner = runner

    def step(self, rows: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        ((slot, tokens),) = rows.items()
        return {slot: self.runner.step(tokens, n_logits=len(tokens))}  # a view, read before the next step

    def rewind(self, slot: int, length: int) -> None:
        self.runner.rewind(length)


@dataclass
class Seq:
    """One sequence's part in a round. Invariant between rounds (core/speculative.py): ctx[-1] is the
    newest token, not yet in the target's cache, which holds ctx[:-1] in slot `slot`."""

    slot: int
    ctx: list[int]
    drafter: Session
    fallback: Session  # what a "free drafts only" limit drafts with for a drafter that uses a model
    k: int  # most proposals this round (capped by the free cache and max_new_tokens)
    params: SamplingParams
    rng: np.random.Generator
    stats: GenerationStats
    fixed_k: bool = False  # the client chose k: a batch's width choice never cuts it
    tree: str = "off"  # "auto" | "on" | "off": only a sequence with a tree verifier widens
    constraint: Constraint | None = None  # the request's grammar (core/constraint.py): rows masked, drafts cut


@dataclass
class Conditions:
    """What the engine lends every round."""

    usable: int  # ids >= usable are never accepted (logits padding rows)
    governor: Governor | None = None
    # {slot: engine/tree_round.TreeVerifier} (the engine's: with one slot, its request's; with several,
    # the slots whose requests asked for trees), or one TreeVerifier for every sequence (a bare round);
    # a sequence with one may verify a tree
    tree: object = None
    pass_seconds: Callable[[int], float] | None = None  # a batched pass's seconds by width (round_shape.py)

    def verifier(self, slot: int):
        """The tree verifier of the sequence in `slot` (None: it verifies chains)."""
        return self.tree.get(slot) if isinstance(self.tree, Mapping) else self.tree


def run_round(target: Target, seqs: Sequence[Seq], cond: Conditions) -> list[Round]:
    """One round for every sequence (see the module docstring); returns each one's Round, in order.
    The caller extends each ctx with its round's tokens."""
    gov = cond.governor
    lim = gov.limits() if gov is not None else None
    usable = cond.usable
    ks, drafters = [], []
    for s in seqs:
        k, d = s.k, s.drafter
        if lim is not None:
            if lim.max_k is not None:
                k = min(k, lim.max_k)
            if lim.drafting == "none":
                k = 0
            elif lim.drafting == "ngram" and d.uses_model:
                d = s.fallback
        ks.append(max(0, k))
        drafters.append(d)
    # propose: each sequence with a tree verifier of its own through it (a tree, or its chain), the
    # others as chains whose model steps may run batched
    trees: list = [None] * len(seqs)
    tvs = [cond.verifier(s.slot) if s.tree != "off" and d is s.drafter else None for s, d in zip(seqs, drafters)]
    made: list = [None] * len(seqs)
    for i, (s, tv) in enumerate(zip(seqs, tvs)):
        if tv is not None:
            prop, draft, trees[i] = tv.propose(drafters[i], s.ctx, ks[i], s.params, s.rng, usable, s.tree)
            made[i] = (prop, draft)
    wants = [i for i, (d, k) in enumerate(zip(drafters, ks)) if k > 0 and d.uses_model and tvs[i] is None]
    if len(wants) > 1:
        plans = [drafters[i].propose_steps(seqs[i].ctx, ks[i], seqs[i].params, seqs[i].rng) for i in wants]
        for i, p in zip(wants, run_plans(plans)):
            made[i] = (p, usable_draft(p, ks[i], usable))
    props = []
    for i, (s, k) in enumerate(zip(seqs, ks)):
        if made[i] is None:
            prop = _propose(drafters[i], s, k)
            made[i] = (prop, usable_draft(prop, k, usable))
        props.append(made[i])
    # a constrained row ends at its first token the grammar forbids (it could never be accepted);
    # cuts: that row's length and, for a sampled proposal, the forbidden token's draft distribution
    cuts: list = [(0, None)] * len(seqs)
    for i, s in enumerate(seqs):
        if s.constraint is not None and trees[i] is None:
            draft, q = spec.grammar_draft(props[i][0], props[i][1], s.constraint)
            props[i], cuts[i] = (props[i][0], draft), (len(draft), q)
    chained = [i for i in range(len(seqs)) if trees[i] is None]
    if len(chained) > 1 and cond.pass_seconds is not None:  # a tree is verified alone: not cut to the width
        for i, p in zip(chained, _shape([seqs[i] for i in chained], [props[i] for i in chained],
                                        cond.pass_seconds)):
            props[i] = p
    # verify: the chains in one pass
    chains = {s.slot: [s.ctx[-1], *props[i][1]] for i, s in enumerate(seqs) if trees[i] is None}
    out = target.step(chains) if chains else {}
    rounds: list[Round] = []
    for i, s in enumerate(seqs):
        prop, draft = props[i]
        d = drafters[i]
        if trees[i] is not None:  # alone on its slot: step_tree, then the accepted path compacted
            r = tvs[i].verify(d, s.ctx, prop, draft, trees[i], s.params, s.rng, usable)
        else:
            # a row the width cut shorter was cut whatever its tokens: no residual owed there
            cut = cuts[i][1] if len(draft) == cuts[i][0] else None
            r = _accept(target, s, d, prop, draft, out[s.slot], usable, cut)
        count(s.stats, r)
        rounds.append(r)
    if gov is not None:
        gov.on_tokens(sum(len(r.tokens) for r in rounds))
        if lim is not None and lim.pace_s > 0:
            time.sleep(lim.pace_s)  # the governor's pacing: a deliberate pause, not a wait for anything
    return rounds


def _propose(d: Session, s: Seq, k: int) -> Proposal:
    return d.propose(s.ctx, k, s.params, s.rng) if k > 0 else EMPTY


def _accept(target: Target, s: Seq, d: Session, prop: Proposal, draft: list[int], logits: np.ndarray,
            usable: int, cut_q: np.ndarray | None = None) -> Round:
    base = len(s.ctx) - 1  # == the slot's length before the pass
    # the one place logits become the accept decision (core/speculative.accept; under a constraint
    # on rows masked by the grammar, which advances by what is accepted)
    n, nxt = spec.accept(logits, prop, draft, s.params, s.rng, usable, s.constraint, cut_q)
    target.rewind(s.slot, base + 1 + n)  # forget the rejected proposals' cache rows ...
    d.feedback(prop, n, base + 1 + n)  # ... and the drafter forgets its own the same way
    d.observe(logits[: n + 1], [s.ctx[-1], *draft[:n]])  # the rows of the final context only
    return Round(draft[:n] + [nxt], len(draft), n, prop.source)


def count(stats: GenerationStats, r: Round) -> None:
    """A round in its sequence's stats: passes, proposals, acceptance, by source."""
    stats.target_passes += 1
    stats.rounds += 1
    stats.drafted += r.drafted
    stats.accepted += r.accepted
    stats.rounds_by_source[r.source] = stats.rounds_by_source.get(r.source, 0) + 1
    if r.accepted:
        stats.accepted_by_source[r.source] = stats.accepted_by_source.get(r.source, 0) + r.accepted


def _shape(seqs: Sequence[Seq], props: list, pass_seconds: Callable[[int], float]) -> list:
    """Cuts the adaptive rows to the round's width (round_shape.py): the pass is as wide as its
    longest row, so the width is chosen for the batch, not by each sequence alone."""
    plans = [RowPlan(len(draft), prop.accept or None, s.fixed_k) for s, (prop, draft) in zip(seqs, props)]
    keep = choose_width(plans, pass_seconds) - 1
    out = []
    for s, (prop, draft) in zip(seqs, props):
        if not s.fixed_k and len(draft) > keep:
            prop = replace(prop, tokens=draft[:keep], accept=prop.accept[:keep], q=None if prop.q is None
                           else prop.q[:keep], conf=prop.conf[:keep], alts=prop.alts[:keep])
            draft = draft[:keep]
        out.append((prop, draft))
    return out
