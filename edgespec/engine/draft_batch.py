"""Drafting for several requests in one batched step per draft runner, on one thread.

The engine loads the draft model as a ModelRunner with one cache slot per request slot
(core/runner.py), and the self-draft as a runner over the target's cache (ModelRunner.skip): a slot
per request slot too. Each slot's drafter drafts on that slot's view (core/slot.py), one sequence's
interface. A proposal is a step plan (drafters/base.py): a generator that yields each
draft step it needs as an ask (runner, tokens, n_logits), is sent that step's logits, and returns
the proposal. In a round (engine/round.py) `run_plans` takes the plans of every request whose
drafter steps a model and drives them in lockstep on the caller's thread: a turn collects every
live plan's next ask, runs them together, sends each plan its rows, and the next turn begins, until
every plan has returned.

    turn 1   A: catch-up [t, u]   B: [v]   C: [w]      -> one draft step
    turn 2   A: [x1]   B: [y1]   (C returned)           -> one draft step
    turn 3   A: [x2]   (B returned)                     -> one draft step (one row)

So a round costs as many draft steps as its longest proposal, not the sum of all of them. An ask
names a slot view; the short rows of a turn on the slots of one runner run as one step of that
runner (`runner.step(rows)`): the draft model's slots in one pass, the self-draft's in one pass of
the layer-skipped graph. A view that is not a runner's slot steps alone. A row of more than
SHORT_ROW tokens (a prompt's catch-up) runs alone in its turn: padding every other row to its length
would make them all pay for it. Which rows share a step follows from the plans alone (a turn is
each live plan's next ask, in the order of the plans), so the grouping, and with the runners'
deterministic mode every row's logits, are the same on every run. A plan that raises, or whose step
raises (the step's exception is thrown into the plans of its rows), ends alone: the others run on,
and `run_plans` raises the first error, in the order of the plans, once every plan is done. Outside a
round (a warm-up, a proposal driven alone) a drafter's slot steps alone.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from ..core.runner import ModelRunner, Slot
from ..core.proposal import Proposal
from ..drafters.base import Ask, StepPlan

SHORT_ROW = 4  # tokens: a catch-up longer than this (a prompt) runs alone rather than padding every row


class DraftBatch:
    """The engine's draft model runner: its slots, one per request slot, which
    `run_plans` steps together (module docstring)."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self._slots = [runner.slot(i) for i in range(runner.slots)]

    def slot(self, i: int) -> Slot:
        """Slot i of the draft runner as one sequence: what slot i's drafter drafts on."""
        return self._slots[i]


def run_plans(plans: Sequence[StepPlan]) -> list[Proposal]:
    """Drives the plans to their end, one batched step per runner a turn; returns what each returned,
    in order. A plan's exception is raised here once every plan has returned or raised."""
    done: list = [None] * len(plans)
    failed: dict[int, Exception] = {}
    resume: dict[int, object] = dict.fromkeys(range(len(plans)))  # plan -> what it is sent (None: start)
    while resume:
        asks: dict[int, Ask] = {}
        for i, got in resume.items():
            plan = plans[i]
            try:
                if got is None:
                    asks[i] = next(plan)
                elif isinstance(got, BaseException):
                    asks[i] = plan.throw(got)
                else:
                    asks[i] = plan.send(got)
            except StopIteration as end:
                done[i] = end.value
            except Exception as e:  # noqa: BLE001 - raised once the other plans are done
                failed[i] = e
        resume = _turn(asks) if asks else {}
    if failed:
        raise failed[min(failed)]
    return done


@runtime_checkable
class RunnerSlot(Protocol):
    """A view that is slot `index` of `runner` (core/slot.Slot; the tests' fake slots): its short
    rows can share one step of that runner with the other slots' rows."""

    runner: Any
    index: int

    def step(self, tokens: Sequence[int], n_logits: int): ...


def _owner(view) -> tuple[object, int | None]:
    """(runner, b) when `view` is slot b of a runner (`runner.slot(b) is view`), else (None, None)."""
    if isinstance(view, RunnerSlot) and isinstance(view.index, int) and view.runner.slot(view.index) is view:
        return view.runner, view.index
    return None, None


def _turn(asks: dict[int, Ask]) -> dict[int, object]:
    """One turn's asks (plan -> ask): the short rows on one runner's slots in one step of that
    runner, each long row (and each view that is no runner's slot) alone; plan -> its logits
    [n_logits, V], or the exception of its step."""
    out: dict[int, object] = {}
    short: dict[int, dict[int, tuple]] = {}  # id(runner) -> {plan: (view, runner, slot, tokens, n_logits)}
    long: list[dict[int, tuple]] = []
    taken: set[tuple[int, int]] = set()
    for i, (view, tokens, n_logits) in asks.items():
        runner, slot = _owner(view)
        if runner is not None:
            if (id(runner), slot) in taken:
                out[i] = ValueError(f"a draft step asked of {view!r}: a slot another proposal of the turn steps")
                continue
            taken.add((id(runner), slot))
        row = (view, runner, slot, list(tokens), n_logits)
        if runner is not None and len(row[3]) <= SHORT_ROW:
            short.setdefault(id(runner), {})[i] = row
        else:
            long.append({i: row})
    for rows in [*short.values(), *long]:
        try:
            if len(rows) == 1:
                ((i, (view, _, _, t, n)),) = rows.items()
                out[i] = view.step(t, n).copy()
            else:
                runner = next(iter(rows.values()))[1]
                got = runner.step({s: t for _, _, s, t, _ in rows.values()})
                out.update({i: got[s][len(got[s]) - n:] for i, (_, _, s, _, n) in rows.items()})
        except BaseException as e:  # noqa: BLE001 - thrown into the plans that asked for the step
            out.update(dict.fromkeys(rows, e))
    return out
