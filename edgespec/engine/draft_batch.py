"""The draft model drafting for several requests in one batched step, on one thread.

A batched engine loads the draft model as a ModelRunner with one cache slot per request slot
(core/runner.py); each slot's ModelDrafter drafts on that slot's view (core/slot.py), one sequence's
interface. A proposal is a step plan (drafters/base.py): a generator that yields each
draft step it needs as an ask (runner, tokens, n_logits), is sent that step's logits, and returns
the proposal. In a round (engine/round.py) `DraftBatch.run` takes the plans of every request whose
drafter steps a model and drives them in lockstep on the caller's thread: a turn collects every
live plan's next ask, runs them together, sends each plan its rows, and the next turn begins, until
every plan has returned.

    turn 1   A: catch-up [t, u]   B: [v]   C: [w]      -> one draft step
    turn 2   A: [x1]   B: [y1]   (C returned)           -> one draft step
    turn 3   A: [x2]   (B returned)                     -> one draft step (one row)

So a round costs as many draft steps as its longest proposal, not the sum of all of them. A row of
more than SHORT_ROW tokens (a prompt's catch-up) runs alone in its turn: padding every other row to
its length would make them all pay for it. Which rows share a step follows from the plans alone (a
turn is each live plan's next ask, in the order of the plans), so the grouping, and with the runners'
deterministic mode every row's logits, are the same on every run. A plan that raises, or whose step
raises (the step's exception is thrown into the plans of its rows), ends alone: the others run on,
and `run` raises the first error, in the order of the plans, once every plan is done. Outside a round
(a warm-up, a proposal driven alone) a drafter's slot steps alone.
"""
from __future__ import annotations

from typing import Sequence

from ..core.runner import ModelRunner, Slot
from ..core.proposal import Proposal
from ..drafters.base import Ask, StepPlan

SHORT_ROW = 4  # tokens: a catch-up longer than this (a prompt) runs alone rather than padding every row


class DraftBatch:
    """Drives the proposals' step plans of a round in lockstep, batching their draft steps (module
    docstring)."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self._slots = [runner.slot(i) for i in range(runner.slots)]

    def slot(self, i: int) -> Slot:
        """Slot i of the draft runner as one sequence: what slot i's drafter drafts on."""
        return self._slots[i]

    def close(self) -> None:
        """Nothing to release: the plans run on the caller's thread."""

    def run(self, plans: Sequence[StepPlan]) -> list[Proposal]:
        """Drives the plans to their end, one batched draft step a turn; returns what each returned,
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
            resume = self._turn(asks) if asks else {}
        if failed:
            raise failed[min(failed)]
        return done

    def _turn(self, asks: dict[int, Ask]) -> dict[int, object]:
        """One turn's asks (plan -> ask): the short rows in one batched step, each long one alone;
        plan -> its logits [n_logits, V], or the exception of its step."""
        out: dict[int, object] = {}
        short: dict[int, tuple[int, list[int], int]] = {}
        groups: list[dict[int, tuple[int, list[int], int]]] = []
        taken: set[int] = set()
        for i, (runner, tokens, n_logits) in asks.items():
            slot = next((b for b, v in enumerate(self._slots) if v is runner), None)
            if slot is None or slot in taken:
                out[i] = ValueError(f"a draft step asked of {runner!r}: not a slot of this draft batch's "
                                    "runner that no other proposal of the turn steps")
                continue
            taken.add(slot)
            row = (slot, list(tokens), n_logits)
            if len(row[1]) <= SHORT_ROW:
                short[i] = row
            else:
                groups.append({i: row})
        for rows in ([short] if short else []) + groups:
            try:
                if len(rows) == 1:
                    ((i, (s, t, n)),) = rows.items()
                    out[i] = self._slots[s].step(t, n).copy()
                else:
                    got = self.runner.step({s: t for s, t, _ in rows.values()})
                    out.update({i: got[s][len(got[s]) - n:] for i, (s, _, n) in rows.items()})
            except BaseException as e:  # noqa: BLE001 - thrown into the plans that asked for the step
                out.update(dict.fromkeys(rows, e))
        return out
