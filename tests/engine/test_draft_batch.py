"""The draft model's steps gathered across requests (engine/draft_batch.py), on a fake BatchRunner:
which rows share a step is decided by who is waiting, never by timing, and a failing call fails
alone."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.core.batch_runner import BatchTimes
from edgespec.engine.draft_batch import SHORT_ROW, DraftBatch

V = 8


class FakeRunner:
    """A BatchRunner's public interface: logits row j of slot s after token t is one-hot at (t + s) % V."""

    def __init__(self, slots: int):
        self.slots, self.max_len, self.vocab_size, self.deterministic = slots, 64, V, False
        self.lengths = [0] * slots
        self.times = BatchTimes()
        self.passes: list[dict[int, int]] = []  # slot -> tokens, per pass

    def _rows(self, slot, tokens):
        out = np.zeros((len(tokens), V), dtype=np.float32)
        for j, t in enumerate(tokens):
            out[j, (t + slot) % V] = 1.0
        return out

    def step(self, rows):
        self.passes.append({s: len(t) for s, t in rows.items()})
        out = {}
        for s, t in rows.items():
            self.lengths[s] += len(t)
            out[s] = self._rows(s, t)
        return out

    def step_one(self, slot, tokens, n_logits=1):
        self.passes.append({slot: len(tokens)})
        self.lengths[slot] += len(tokens)
        return self._rows(slot, tokens)[len(tokens) - n_logits:]

    def rewind(self, slot, length):
        self.lengths[slot] = length

    def reset(self, slot=None):
        for s in range(self.slots) if slot is None else (slot,):
            self.lengths[s] = 0

    def free(self, slot):
        return self.max_len - self.lengths[slot]


def _drafting(slot, steps: int, first: list[int]):
    """A drafter's loop: a catch-up of `first`, then `steps` one-token steps, each fed its last argmax."""
    def call():
        row = slot.step(first, 1)[0]
        got = [int(np.argmax(row))]
        for _ in range(steps):
            got.append(int(np.argmax(slot.step([got[-1]], 1)[0])))
        return got
    return call


def test_steps_are_gathered_by_who_waits_and_each_call_gets_its_own_rows():
    runner = FakeRunner(3)
    db = DraftBatch(runner)
    slots = [db.slot(i) for i in range(3)]
    calls = [_drafting(slots[0], 3, [1]), _drafting(slots[1], 1, [2, 3]), _drafting(slots[2], 0, [4])]
    for _ in range(3):  # the same grouping every time, whatever the threads' timing
        runner.passes.clear()
        got = db.run(calls)
        assert runner.passes == [{0: 1, 1: 2, 2: 1}, {0: 1, 1: 1}, {0: 1}, {0: 1}]
    # each call's tokens follow its own slot's rows, as if it ran alone
    alone = FakeRunner(3)
    for s, c in enumerate((_drafting(DraftBatch(alone).slot(0), 3, [1]), _drafting(DraftBatch(alone).slot(1), 1, [2, 3]),
                           _drafting(DraftBatch(alone).slot(2), 0, [4]))):
        assert got[s] == c()
    db.close()


def test_a_long_catch_up_runs_alone_and_a_failing_call_fails_alone():
    runner = FakeRunner(2)
    db = DraftBatch(runner)
    a, b = db.slot(0), db.slot(1)
    long_prompt = list(range(SHORT_ROW + 3))
    runner.passes.clear()
    db.run([_drafting(a, 1, long_prompt), _drafting(b, 1, [5])])
    assert {0: len(long_prompt)} in runner.passes and {1: 1} in runner.passes  # not padded to the prompt
    assert {0: len(long_prompt), 1: 1} not in runner.passes

    def broken():
        b.step([1], 1)
        raise RuntimeError("drafter bug")

    with pytest.raises(RuntimeError, match="drafter bug"):
        db.run([_drafting(a, 2, [1]), broken])
    assert db.run([_drafting(a, 0, [1]), _drafting(b, 0, [1])]) == [[1], [2]]  # and the batch still runs
    db.close()


def test_outside_a_batch_a_slot_steps_alone():
    runner = FakeRunner(2)
    db = DraftBatch(runner)
    assert db.run([_drafting(db.slot(1), 1, [3])]) == [[4, 5]]  # one call: no threads, its own steps
    assert runner.passes == [{1: 1}, {1: 1}]
