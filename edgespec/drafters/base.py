"""The drafter interface: everything the engine and `auto` ask of a drafter, and nothing else, in
two parts. A request's drafter is a `Session`: the round and `auto` call these while the request runs.

    begin(ctx)                                 a new request starts (may share a prefix with the last)
    prefill(ctx)                               prompt processing the drafter wants before decoding
    propose(ctx, k, params, rng) -> Proposal   at most k tokens that may follow ctx
    propose_now(ctx, k, params, rng)           the same, skipping any gate of its own on whether
                                               drafting pays (`auto` priced the round itself)
    propose_steps(ctx, k, params, rng, now)    propose (now: propose_now) as a step plan: a generator
                                               that yields each model step it needs (`drive`)
    feedback(proposal, accepted, valid_len)    learn from the verdict; forget cache rows past valid_len
    observe(rows, tokens)                      the target's verified logits rows (free candidates to keep)
    reset()                                    forget any cache (the engine's caches were invalidated)
    uses_model                                 drafting costs model steps (a power limit may forbid it)
    quote(ctx, k) -> Quote | None              a free drafter: its proposal and its rate, for `auto`
    cost(ctx) -> DraftCost | None              a drafter that costs model steps: their seconds, for `auto`
    set_tree_width(width)                      the next proposal may be widened into a tree of this
                                               many children per node (0: a chain): record runners-up
    alternatives(ctx, k, width)                other continuations a tree may verify beside the
                                               proposal's chain: [(tokens, source label)]
    attach(constraint) -> bool                 the request's grammar; True: it drafts under it itself,
                                               False: its proposals get the forced tokens in front
    end(ctx)                                   a request ended (whatever mode ran it): its final text
    evidence() -> object | None                what this request learned that the next may start from

What carries across requests is the `Learner` part: the engine (engine/batch_drafters.py, one per
engine) builds each request's drafters from the mode table (drafters/modes.py), seeds them with
what the last finished request of the mode handed on, and keeps a slot's model-backed drafters
(`per_slot` rows) across its requests, so those are sessions and learners at once.

    seed(evidence)                             start from a finished request's evidence
    set_adaptive(on)                           choose k per round from measured costs, or use k as given
    warmup()                                   time the steps its proposals run (at engine open)
    forget()                                   forget what earlier requests taught (Engine.reset_cache)
    stats() -> dict                            its learnt numbers, plain values (/metrics, the bench)
    state() -> dict / load_state(state)        what it has learnt, copied out and put back (the bench
                                               runs each mode as if it were the engine's only one)

Proposals are lossless whatever they contain: the target accepts only what it would have produced
(greedy) or corrects the distribution (rejection sampling, core/speculative.py). Drafters only
decide speed. `DrafterBase` gives the no-op defaults, so a drafter writes only what it does.

A step plan is how a proposal that steps a model is run by whoever owns the steps. It yields each
step it needs as an ask, `(runner, tokens, n_logits)`: feed `tokens` to `runner` (one sequence's
interface, core/slot.py) and send back the logits of the last n_logits of them, [n_logits, V]; it returns the
Proposal. Alone, `drive` runs each ask on its runner in turn (a lone request's round, a warm-up);
the engine runs the asks of every request drafting in a round together, one batched draft step
per turn (engine/draft_batch.py). The free drafters run no model step: the default plan returns
their proposal without yielding.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Generator, Protocol, Sequence, runtime_checkable

import numpy as np

from ..core.proposal import EMPTY, Proposal
from ..core.sampling import SamplingParams

NEW_REQUEST_KEEP = 0.25  # weight of past requests' evidence when a request starts
MIN_EVIDENCE = 1.0  # fading stops at one observation's worth of evidence

Ask = tuple[Any, list[int], int]  # a step plan's model step: (runner, tokens, n_logits)
StepPlan = Generator[Ask, np.ndarray, Proposal]  # yields asks, is sent their logits, returns the proposal


def drive(plan: Generator[Ask, np.ndarray, Any]) -> Any:
    """Runs a step plan alone, each ask on the runner it names, and returns what the plan returns.
    A step's exception is raised inside the plan, where the step was asked for."""
    try:
        ask = next(plan)
        while True:
            runner, tokens, n_logits = ask
            try:
                logits = runner.step(tokens, n_logits)
            except BaseException as e:  # noqa: BLE001 - raised where the plan asked for the step
                ask = plan.throw(e)
            else:
                ask = plan.send(logits)
    except StopIteration as done:
        return done.value


@dataclass
class Quote:
    """What one round of a free drafter would buy, so `auto` can compare it with the others.

    rate: expected tokens per second if this proposal is verified this round (from the drafter's
      own acceptance estimates and the measured verify cost).
    proposal: the lookup's proposal, ready-made: looking it up cost no model step."""

    rate: float
    proposal: Proposal


@dataclass(frozen=True)
class DraftCost:
    """What drafting this round would cost a drafter whose proposals cost model steps, so `auto`
    can price it before paying (drafters/auto.py).

    first: seconds of the step that drafts the first token, feeding the draft whatever of ctx it
      has not seen (its cache's catch-up: the prompt on its first round of a request).
    step: seconds of each further drafted token (0 when one run drafts the whole chain: heads).
    prior: its acceptance per token before `auto` has seen any verdict (the export's measured
      agreement of the pair where the bundle records one)."""

    first: float
    step: float
    prior: float


@runtime_checkable
class Session(Protocol):
    """A request's drafter, as the round and `auto` use it (the module docstring, first table)."""

    name: str

    def begin(self, ctx: Sequence[int]) -> None: ...

    def prefill(self, ctx: Sequence[int]) -> None: ...

    def propose(self, ctx: Sequence[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Proposal: ...

    def propose_now(self, ctx: Sequence[int], k: int, params: SamplingParams,
                    rng: np.random.Generator) -> Proposal: ...

    def propose_steps(self, ctx: Sequence[int], k: int, params: SamplingParams,
                      rng: np.random.Generator, now: bool = False) -> StepPlan: ...

    def feedback(self, proposal: Proposal, accepted: int, valid_len: int) -> None: ...

    def observe(self, rows: np.ndarray, tokens: Sequence[int]) -> None: ...

    def reset(self) -> None: ...

    @property
    def uses_model(self) -> bool: ...

    def quote(self, ctx: Sequence[int], k: int) -> Quote | None: ...

    def cost(self, ctx: Sequence[int]) -> DraftCost | None: ...

    def set_tree_width(self, width: int) -> None: ...

    def alternatives(self, ctx: Sequence[int], k: int, width: int) -> list[tuple[list[int], str]]: ...

    def attach(self, constraint) -> bool: ...

    def end(self, ctx: Sequence[int]) -> None: ...

    def evidence(self) -> object | None: ...


@runtime_checkable
class Learner(Protocol):
    """What a drafter carries across requests, as the engine's BatchDrafters, /metrics and the
    bench use it (the module docstring, second table)."""

    def seed(self, evidence: object | None) -> None: ...

    def set_adaptive(self, on: bool) -> None: ...

    def warmup(self) -> None: ...

    def forget(self) -> None: ...

    def stats(self) -> dict: ...

    def state(self) -> dict: ...

    def load_state(self, state: dict) -> None: ...


@runtime_checkable
class Drafter(Session, Learner, Protocol):
    """Both parts: what a row of the mode table builds (`DrafterBase` gives every method a no-op)."""


class DrafterBase:
    """No-op defaults for every method of the interface: proposes nothing, learns nothing."""

    name = "none"
    uses_model = False

    def begin(self, ctx: Sequence[int]) -> None:
        """A new request starts; ctx is its prompt."""

    def prefill(self, ctx: Sequence[int]) -> None:
        """Prompt processing done with the target's prefill (counted in the time to first token)."""

    def propose(self, ctx: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Proposal:
        return EMPTY

    def propose_now(self, ctx: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Proposal:
        """propose() without a drafter's own gate on whether drafting pays (the draft model's skip
        gate): for `auto`, which priced the round before choosing this drafter."""
        return self.propose(ctx, k, params, rng)

    def propose_steps(self, ctx: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator,
                      now: bool = False) -> StepPlan:
        """propose() (now: propose_now()) as a step plan (the module docstring). This one steps no
        model: it returns the proposal without yielding, so a free drafter writes only propose()."""
        return (self.propose_now if now else self.propose)(ctx, k, params, rng)
        yield  # never reached: it makes this a generator, a plan that asks for no step

    def feedback(self, proposal: Proposal, accepted: int, valid_len: int) -> None:
        """`accepted` of proposal.tokens were accepted; the first `valid_len` tokens of the context
        are now final, so any cache rows past them are stale."""

    def observe(self, rows: np.ndarray, tokens: Sequence[int]) -> None:
        """The target's verified logits: rows[i] ([len(tokens), V]) is its prediction after
        tokens[i], all in the final context (the round's last token and its accepted proposals).
        The recycling drafter keeps the top candidates; the others ignore it."""

    def set_adaptive(self, on: bool) -> None:
        """Whether proposals are sized from measured costs each round (else k is used as given)."""

    def reset(self) -> None:
        """The engine's caches were invalidated: drop whatever cache this drafter keeps."""

    def forget(self) -> None:
        """Engine.reset_cache(): drop what earlier requests' text taught (an index, a table), so a
        benchmark times every mode from the same start."""

    def quote(self, ctx: Sequence[int], k: int) -> Quote | None:
        return None

    def set_tree_width(self, width: int) -> None:
        """A tree round asks the next proposal to record up to width - 1 runners-up per drafted
        position (Proposal.alts; 0: a chain). Only a drafter with logits of its own has any."""

    def alternatives(self, ctx: Sequence[int], k: int, width: int) -> list[tuple[list[int], str]]:
        """Up to `width` other continuations of ctx (at most k tokens each) that a tree round may
        verify beside the proposal's chain, each with its source label (engine/tree_round.py prices
        and learns them by label). Only free lookups offer any."""
        return []

    def end(self, ctx: Sequence[int]) -> None:
        """The request ended, whatever mode ran it; ctx is its whole text (the suffix index keeps it)."""

    def warmup(self) -> None:
        """Times the steps its proposals run once at engine open, so its costs are this device's
        from the first request; leaves no cache behind."""

    def cost(self, ctx: Sequence[int]) -> DraftCost | None:
        """None: drafting costs no model step (or it cannot draft at all)."""
        return None

    def evidence(self) -> object | None:
        """What this request's verdicts taught (acceptance estimates), for the next request's drafter
        of the same mode to start from (`seed`); None: nothing to hand on. Handed on as is: the
        drafter that returned it is not used again, and `seed` copies it."""
        return None

    def seed(self, evidence: object | None) -> None:
        """Start from what `evidence()` of a finished request's drafter returned (None: from the
        priors). The engine builds fresh drafters per request and seeds them so (engine/batch_drafters.py);
        a slot's kept drafters (modes.py `per_slot`) live across its requests."""

    def attach(self, constraint) -> bool:
        """The request's grammar (core/constraint.Constraint; None: unconstrained). True: this
        drafter drafts under it by itself (or drafts nothing); False: its proposals need the
        grammar's forced tokens in front (drafters/grammar.with_grammar wraps it)."""
        return False

    def stats(self) -> dict:
        """What this drafter has learnt, as plain numbers keyed by name (/metrics and the bench read
        these, never its attributes). Nothing by default: a drafter that learns says what."""
        return {}

    def state(self) -> dict:
        """A copy of what this drafter has learnt, for `load_state` later: every attribute deep-copied
        except what is not learnt, which stays the same object (module `shared`: runners and their
        sessions, suffix indexes, cost models, step times, documents, the other drafters)."""
        return copy.deepcopy(vars(self), _memo(self))

    def load_state(self, state: dict) -> None:
        """Back to what `state()` returned (copied again, so one state can be loaded many times)."""
        vars(self).update(copy.deepcopy(state, _memo(self)))


def shared(v: Any) -> bool:
    """Whether a drafter's attribute is kept as the same object by state()/load_state(): it is not
    learnt (a model runner and its onnxruntime session, a suffix index whose text is the engine's,
    a cost model and its step times, documents) or it is another drafter, with a state of its own."""
    from ..core.costmodel import CostModel
    from ..core.slot import SkipGraph, Slot
    from ..core.steptimes import StepTimes
    from .suffix_index import SuffixIndex

    mod = type(v).__module__
    return (isinstance(v, (DrafterBase, Slot, SkipGraph, SuffixIndex, CostModel, StepTimes))
            or mod.startswith("onnxruntime") or mod.startswith("edgespec.docs"))


def _memo(d: DrafterBase) -> dict[int, Any]:
    """deepcopy's memo that keeps `d`, and what `shared` names among its attributes (and one level
    into their lists, tuples and dicts: `auto`'s sources), as the same objects."""
    memo: dict[int, Any] = {id(d): d}
    for v in vars(d).values():
        inner = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
        for x in inner:
            if shared(x):
                memo[id(x)] = x
    return memo


class NoDrafter(DrafterBase):
    """Proposes nothing: plain target decoding through the same loop (k = 0 is the baseline)."""

    name = "none"

    def attach(self, constraint) -> bool:
        return True  # no drafts to put forced tokens in front of


class Beta:
    """A running acceptance probability: a Beta posterior whose old evidence fades (weight `keep`
    per update), so the estimate follows the text as it changes from prose to code and back."""

    __slots__ = ("a", "b", "keep")

    def __init__(self, mean: float, weight: float = 4.0, keep: float = 0.97):
        self.a, self.b, self.keep = mean * weight, (1.0 - mean) * weight, keep

    @property
    def mean(self) -> float:
        return self.a / (self.a + self.b)

    def fade(self, keep: float) -> None:
        """Keeps the estimate but weakens its evidence, so new evidence moves it faster; never
        below MIN_EVIDENCE (an estimate that sees no evidence for many requests, e.g. a rarely used
        bin, must not fade to 0/0)."""
        total = self.a + self.b
        if total * keep < MIN_EVIDENCE:
            keep = min(1.0, MIN_EVIDENCE / total) if total > 0 else 1.0
        self.a *= keep
        self.b *= keep

    def add(self, hits: float, misses: float) -> None:
        self.a = self.a * self.keep + hits
        self.b = self.b * self.keep + misses
