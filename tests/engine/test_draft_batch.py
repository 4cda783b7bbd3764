"""The draft steps of a round's proposals run in lockstep (engine/draft_batch.py), on fake
ModelRunners: which rows share a step follows from the plans alone, one pass per runner (the draft
model's, the self-draft's), a long catch-up runs alone, a failing plan or step fails alone, each plan
gets what it would alone, and no thread is started."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from edgespec.core.steptimes import BatchTimes
from edgespec.drafters.base import drive
from edgespec.engine.draft_batch import SHORT_ROW, DraftBatch, run_plans

V = 8


class FakeRunner:
    """A ModelRunner's batched interface: logits row j of slot s after token t is one-hot at (t + s) % V.
    on_step(rows) is called before each pass; it may raise (a failing step)."""

    def __init__(self, slots: int, on_step=None):
        self.slots, self.max_len, self.vocab_size, self.deterministic = slots, 64, V, False
        self.lengths = [0] * slots
        self.times = BatchTimes()
        self.passes: list[dict[int, int]] = []  # slot -> tokens, per pass
        self.on_step = on_step
        self._slots = [FakeSlot(self, i) for i in range(slots)]

    def slot(self, i):
        return self._slots[i]

    def _rows(self, slot, tokens):
        out = np.zeros((len(tokens), V), dtype=np.float32)
        for j, t in enumerate(tokens):
            out[j, (t + slot) % V] = 1.0
        return out

    def step(self, rows):
        if self.on_step is not None:
            self.on_step(rows)
        self.passes.append({s: len(t) for s, t in rows.items()})
        out = {}
        for s, t in rows.items():
            self.lengths[s] += len(t)
            out[s] = self._rows(s, t)
        return out

    def rewind(self, slot, length):
        self.lengths[slot] = length

    def reset(self, slot=None):
        for s in range(self.slots) if slot is None else (slot,):
            self.lengths[s] = 0


class FakeSlot:
    """Slot `index` of a FakeRunner as one sequence: a step is its runner's step of that row alone."""

    def __init__(self, runner: FakeRunner, index: int):
        self.runner, self.index = runner, index

    def step(self, tokens, n_logits=1):
        return self.runner.step({self.index: tokens})[self.index][len(tokens) - n_logits:]


def _drafting(runner, steps: int, first: list[int]):
    """A drafter's plan: a catch-up of `first`, then `steps` one-token steps, each fed its last argmax."""
    row = (yield runner, first, 1)[0]
    got = [int(np.argmax(row))]
    for _ in range(steps):
        got.append(int(np.argmax((yield runner, [got[-1]], 1)[0])))
    return got


def test_steps_are_grouped_by_turn_and_each_plan_gets_its_own_rows():
    runner = FakeRunner(3)
    db = DraftBatch(runner)
    slots = [db.slot(i) for i in range(3)]
    for _ in range(3):  # the same grouping every time
        runner.passes.clear()
        got = run_plans([_drafting(slots[0], 3, [1]), _drafting(slots[1], 1, [2, 3]), _drafting(slots[2], 0, [4])])
        assert runner.passes == [{0: 1, 1: 2, 2: 1}, {0: 1, 1: 1}, {0: 1}, {0: 1}]
    # each plan's tokens follow its own slot's rows, as if it ran alone
    alone = FakeRunner(3)
    assert got == [drive(_drafting(alone.slot(0), 3, [1])), drive(_drafting(alone.slot(1), 1, [2, 3])),
                   drive(_drafting(alone.slot(2), 0, [4]))]
    assert got == [[1, 1, 1, 1], [4, 5], [6]]


def test_a_long_catch_up_runs_alone_and_a_failing_plan_fails_alone():
    runner = FakeRunner(2)
    db = DraftBatch(runner)
    a, b = db.slot(0), db.slot(1)
    long_prompt = list(range(SHORT_ROW + 3))
    runner.passes.clear()
    run_plans([_drafting(a, 1, long_prompt), _drafting(b, 1, [5])])
    assert runner.passes == [{1: 1}, {0: len(long_prompt)}, {0: 1, 1: 1}]  # not padded to the prompt

    def broken():
        yield b, [1], 1
        raise RuntimeError("drafter bug")

    runner.passes.clear()
    with pytest.raises(RuntimeError, match="drafter bug"):
        run_plans([_drafting(a, 2, [1]), broken()])
    assert runner.passes == [{0: 1, 1: 1}, {0: 1}, {0: 1}]  # the other plan ran to its end
    assert run_plans([_drafting(a, 0, [1]), _drafting(b, 0, [1])]) == [[1], [2]]  # and the batch still runs


def test_a_failing_step_is_raised_in_the_plans_of_its_rows_only():
    def fail_long(rows):
        if any(len(t) > SHORT_ROW for t in rows.values()):
            raise MemoryError("draft step out of memory")

    runner = FakeRunner(3, on_step=fail_long)
    db = DraftBatch(runner)
    seen = []

    def catching(slot, first):
        try:
            yield slot, first, 1
        except MemoryError as e:
            seen.append(str(e))
            raise

    short = _drafting(db.slot(0), 1, [1])
    with pytest.raises(MemoryError, match="out of memory"):
        run_plans([short, catching(db.slot(1), list(range(SHORT_ROW + 1))), _drafting(db.slot(2), 0, [3])])
    assert seen == ["draft step out of memory"]  # thrown where the plan asked for the step
    assert runner.passes == [{0: 1, 2: 1}, {0: 1}]  # the short rows' plans ran on


def test_each_runner_steps_its_own_slots_in_one_pass_and_a_doubled_slot_is_refused():
    """The draft model's slots and another runner's (the self-draft's) in one turn: one pass of each,
    each plan getting its own runner's rows; a view of no runner steps alone."""
    runner, other = FakeRunner(3), FakeRunner(3)
    db = DraftBatch(runner)
    got = run_plans([_drafting(db.slot(0), 1, [1]), _drafting(other.slot(0), 1, [1]), _drafting(db.slot(2), 0, [3]),
                     _drafting(other.slot(2), 1, [3])])
    assert runner.passes == [{0: 1, 2: 1}, {0: 1}] and other.passes == [{0: 1, 2: 1}, {0: 1, 2: 1}]
    assert got == [[1, 1], [1, 1], [5], [5, 7]]

    class Loose:  # one sequence's interface and nothing more
        def step(self, tokens, n_logits=1):
            return np.eye(V, dtype=np.float32)[[(tokens[-1] + 3) % V]]

    runner.passes.clear()
    assert run_plans([_drafting(Loose(), 1, [1]), _drafting(db.slot(1), 0, [1])]) == [[4, 7], [2]]
    assert runner.passes == [{1: 1}]
    with pytest.raises(ValueError, match="a slot another proposal of the turn steps"):
        run_plans([_drafting(db.slot(0), 0, [1]), _drafting(db.slot(0), 0, [2])])


def test_a_plan_driven_alone_steps_its_slot_alone():
    runner = FakeRunner(2)
    db = DraftBatch(runner)
    assert drive(_drafting(db.slot(1), 1, [3])) == [4, 5]
    assert run_plans([_drafting(db.slot(1), 1, [3])]) == [[4, 5]]
    assert runner.passes == [{1: 1}, {1: 1}, {1: 1}, {1: 1}]


def test_run_starts_no_thread():
    """The plans run in lockstep on the caller's thread: asserted from inside each draft step."""
    before = threading.active_count()
    inside = []

    def look(rows):
        inside.append((threading.active_count(), threading.current_thread() is threading.main_thread(),
                       [t.name for t in threading.enumerate() if t.name.startswith("edgespec-draft")]))

    runner = FakeRunner(3, on_step=look)
    db = DraftBatch(runner)
    run_plans([_drafting(db.slot(0), 2, [1]), _drafting(db.slot(1), 1, [2]), _drafting(db.slot(2), 0, [3])])
    assert inside == [(before, True, [])] * 3
