"""Every single-sequence operation runs on any slot of a ModelRunner: a tree step + compact,
snapshot/restore, placed rows and hidden rows on slot 1 of a 3-slot runner give what they give on
a one-slot runner (the serial engine's), and slots 0 and 2 are left bitwise as they were."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.core import tree as treelib
from edgespec.core.runner import ModelRunner
from edgespec.models.bundle import Bundle

MAX_LEN = 64


def _session(path):
    """Through edgespec's providers (a bare InferenceSession clashes with a process-wide pool)."""
    from edgespec.edge.providers import create_session, shared_pool_active

    return create_session(path, providers=["cpu"], shared_threads=shared_pool_active())[0]


@pytest.fixture(scope="module")
def model(tiny_heads_bundle):
    """(facts, session) of a target with the hidden_states output and tree inputs (contract v3, cpu)."""
    b = Bundle.open(tiny_heads_bundle, verify=False)
    return b.target, _session(b.model_path("target"))


class Three:
    """Slot 1 of a 3-slot runner, with slots 0 and 2 holding other text, and a record of them."""

    def __init__(self, model):
        facts, sess = model
        self.runner = ModelRunner(sess, facts, MAX_LEN, 3)
        self.runner.slot(0).step([9, 8, 7, 6, 5], 1)
        self.runner.slot(2).step([4, 44, 144], 2)
        self.slot = self.runner.slot(1)
        self.before = self._neighbours()

    def _neighbours(self):
        r = self.runner
        return ([a[b].copy() for a in r.arrays for b in (0, 2)], r.positions[[0, 2]].copy(),
                [r.lengths[0], r.lengths[2]], [r.slot(0).hidden.copy(), r.slot(2).hidden.copy()])

    def assert_neighbours_unchanged(self):
        kv, pos, lengths, hidden = self._neighbours()
        for got, want in zip(kv, self.before[0]):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(pos, self.before[1])
        assert lengths == self.before[2] == [5, 3]
        for got, want in zip(hidden, self.before[3]):
            np.testing.assert_array_equal(got, want)


def _one(model):
    facts, sess = model
    return ModelRunner(sess, facts, MAX_LEN).slot(0)


def _assert_same_rows(a, b, n):
    for x, y in zip(a.rows(0, n)[0], b.rows(0, n)[0]):
        np.testing.assert_array_equal(x, y)


def test_a_tree_step_and_compact_on_slot_1(model):
    prompt = [5, 17, 33, 9, 100, 7]
    paths = [([11, 12, 13], None, "m"), ([11, 14], None, "a"), ([15, 16, 17, 18], None, "a")]
    t = treelib.from_paths(prompt[-1], paths)
    keep = [0, 5, 6, 7, 8]  # the path 15-16-17-18
    three = Three(model)
    got = []
    for r in (_one(model), three.slot):
        assert r.can_tree
        r.step(prompt[:-1], 1)
        L = r.length
        rows = r.step_tree(t.tokens, t.depth, t.ancestors()).copy()
        r.compact([L + i for i in keep[1:]], L + 1)
        r.rewind(L + len(keep))
        got.append((rows, r.step([20], 1).copy(), r))
    (rows1, next1, one), (rows3, next3, slot) = got
    np.testing.assert_array_equal(rows3, rows1)
    np.testing.assert_array_equal(next3, next1)
    assert slot.length == one.length == len(prompt) + 4 + 1
    _assert_same_rows(slot, one, slot.length)
    three.assert_neighbours_unchanged()


def test_snapshot_and_restore_on_slot_1(model):
    prefix, rest = [3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5]
    three = Three(model)
    one = _one(model)
    snaps = []
    for r in (one, three.slot):
        r.step(prefix, 1)
        snaps.append(r.snapshot(len(prefix)))
        r.step(rest, 1)
    three.slot.restore(snaps[0])  # the one-slot runner's rows, written into slot 1
    one.restore(snaps[1])  # and slot 1's into the one-slot runner
    assert three.slot.length == one.length == len(prefix)
    np.testing.assert_array_equal(three.slot.step(rest, 3), one.step(rest, 3))
    _assert_same_rows(three.slot, one, len(prefix) + len(rest))
    three.assert_neighbours_unchanged()


def test_rows_placed_at_positions_of_their_own_on_slot_1(model):
    """A passage computed once at positions 40.. (engine/venue_rows.py), placed after a base on slot
    1: the next chain step, alone and in a batched pass, follows the placed positions."""
    base, passage, question = [2, 7, 1, 8], [30, 31, 32, 33, 34], [60, 61]
    src = _one(model)
    src.step(passage, 1, position=40)
    rows, positions = src.rows(0, len(passage))
    np.testing.assert_array_equal(positions, np.arange(40, 45))
    three = Three(model)
    one = _one(model)
    for r in (one, three.slot):
        r.step(base, 1)
        r.place(rows, positions)
        assert r.length == len(base) + len(passage) and r.can_place
    want = one.step(question[:1], 1).copy()
    np.testing.assert_array_equal(three.slot.step(question[:1], 1), want)
    _assert_same_rows(three.slot, one, three.slot.length)
    three.assert_neighbours_unchanged()
    want = one.step(question[1:], 1).copy()
    got = three.runner.step({1: question[1:], 2: [5]})  # a batched pass: slot 1 at its placed positions
    assert three.runner.positions[1, len(base) + len(passage) + 1] == 46
    np.testing.assert_allclose(got[1][-1], want[0], atol=1e-4)
    assert three.runner.lengths == [5, len(base) + len(passage) + 2, 4]


def test_hidden_rows_on_slot_1(model):
    prompt = [11, 22, 33, 44, 55, 66]
    three = Three(model)
    one = _one(model)
    for r in (one, three.slot):
        assert r.has_hidden
        r.step(prompt, 3)
    for pos in (3, 4, 5):
        np.testing.assert_array_equal(three.slot.hidden_row(pos, prompt[pos]), one.hidden_row(pos, prompt[pos]))
    assert three.slot.hidden_row(2, prompt[2]) is None  # not among the last step's rows
    assert three.slot.hidden_row(4, prompt[4] + 1) is None  # another token at that position
    np.testing.assert_array_equal(three.runner.slot(0).hidden_row(4, 5), three.before[3][0][0])  # slot 0's own
    three.assert_neighbours_unchanged()


def test_only_a_runner_of_several_slots_has_the_padding_row(model):
    """Slot 0 of a one-slot runner is the serial path: its cache has no spare row for a padded pass."""
    one = _one(model)
    assert one.max_len_rows == MAX_LEN and one.runner.cache_rows == MAX_LEN
    three = Three(model)
    assert three.runner.cache_rows == MAX_LEN + 1  # a padded full row's mark


def test_the_self_draft_on_slot_1(tiny_deep_bundle):
    """The layer-skipped graph bound on slot 1's buffers drafts what it drafts on a one-slot target,
    and writes only slot 1's rows."""
    from edgespec.drafters.self import skip_for
    from edgespec.engine.selfdraft import open_pair

    b = Bundle.open(tiny_deep_bundle, verify=False)
    pair = open_pair(b.model_path("target"), b.target, MAX_LEN, skip_for(b.target))
    three = ModelRunner(pair.target.session, pair.target.facts, MAX_LEN, 3)
    three.slot(0).step([9, 8, 7], 1)
    three.slot(2).step([4, 5], 1)
    before = [a[[0, 2]].copy() for a in three.arrays]
    ctx = [5, 17, 33, 9, 100, 7]
    slot = three.slot(1)
    got = []
    for target, skip in ((pair.target, pair.runner), (slot, slot.skip(pair.runner.session, pair.runner.kept))):
        target.step(ctx[:-1], 1)
        skip.length = target.length
        got.append([skip.step([ctx[-1]], 1).copy(), skip.step([7, 8], 2).copy()])
        assert skip.length == target.length + 3 and target.length == len(ctx) - 1
    for x, y in zip(*got):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(before, three.arrays):
        np.testing.assert_array_equal(x, y[[0, 2]])
