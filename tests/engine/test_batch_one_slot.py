"""BatchEngine with what the serial engine has (issue 62, one engine): trees priced per round at one
slot, the plan's prefill chunk while nothing else decodes, warmup(), the self-draft priced at the
batch's width, cached(), and the drafters' learnt state saved and loaded (the bench's lineages)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from edgespec.core.costmodel import CostModel
from edgespec.engine import Engine, build
from edgespec.engine.batch import BATCH_PREFILL_CHUNK, BatchEngine
from edgespec.engine.settings import Settings
from helpers.costs import freeze, times
from helpers.lossless import random_prompt

FLAT = {f"s{n}": 0.01 for n in range(1, 34)}  # a verify of any size costs one step's: trees pay


# --- 1. trees at one slot ---------------------------------------------------------------------------
def test_tree_auto_at_one_slot_trees_and_equals_the_serial_engine_and_target_alone(tiny_bundle_disagree):
    """tree="auto" at parallel=1: the slot's verifier, priced by the slot's cost model (its verify frozen
    flat, so trees pay), widens rounds into trees as the serial engine's does; the tokens are the
    serial engine's and the target alone's."""
    be = Engine.open(tiny_bundle_disagree, parallel=1, draft="model", max_len=160, verify=False, warmup=False)
    eng = Engine.open(tiny_bundle_disagree, draft="model", max_len=160, verify=False, warmup=False)
    try:
        freeze(be.runner.times.table(1), **FLAT)
        rng = np.random.default_rng(3)
        trees = 0
        for _ in range(3):
            prompt = random_prompt(eng, rng, int(rng.integers(6, 30)))
            ref = eng.generate(prompt, max_new_tokens=24, draft="none")
            serial = eng.generate(prompt, max_new_tokens=24, draft="model", k=3, tree="auto")
            got = be.generate(prompt, max_new_tokens=24, draft="model", k=3, tree="auto")
            assert got.token_ids == serial.token_ids == ref.token_ids
            assert got.finish_reason == ref.finish_reason and got.stats.tree == "auto"
            trees += got.stats.tree_rounds
        assert trees > 0
    finally:
        be.close()
        eng.close()


def test_tree_auto_runs_chains_with_several_slots(tiny_bundle_disagree):
    be = Engine.open(tiny_bundle_disagree, parallel=2, draft="model", max_len=160, verify=False, warmup=False)
    try:
        for rows in (1, 2):
            freeze(be.runner.times.table(rows), **FLAT)
        got = be.generate("one two three one two three one two", max_new_tokens=20, draft="model", k=3, tree="auto")
        assert got.stats.tree_rounds == 0 and got.stats.drafted > 0
    finally:
        be.close()


# --- 2. the prefill chunk -------------------------------------------------------------------------
def _chunked(plan_chunk: int, bundle, parallel: int) -> BatchEngine:
    p = build.plan(Settings.of(parallel=parallel, draft="none", max_len=400, verify=False, warmup=False), bundle)
    return Engine.from_plan(dataclasses.replace(p, memory=dataclasses.replace(p.memory, prefill_chunk=plan_chunk)))


def _steps(view, sizes: list[int]):
    """Records the tokens of every pass of the slot `view`."""
    step = view.step

    def counted(tokens, *a, **kw):
        sizes.append(len(tokens))
        return step(tokens, *a, **kw)

    view.step = counted


def test_a_long_prompt_alone_is_read_in_the_plans_chunks(tiny_bundle):
    be = _chunked(200, tiny_bundle, 2)
    try:
        words = "the cat sat on the mat and the dog ran by".split()
        prompt = " ".join(words[i % len(words)] for i in range(300))
        while be.count_tokens(prompt) > 300:
            prompt = prompt.rsplit(" ", 1)[0]
        n = be.count_tokens(prompt)
        assert 250 < n <= 300
        sizes: list[int] = []
        _steps(be.target, sizes)
        be.generate(prompt, max_new_tokens=1)
        assert len(sizes) == math.ceil(n / 200) == 2 and sizes == [200, n - 200]  # not 128-token chunks
        # beside a request that is generating: the batch's chunk, so it keeps streaming
        first = be.submit("hello hello hello", max_new_tokens=40)
        be.round()
        second: list[int] = []
        _steps(be.runner.slot(1), second)
        t = be.submit(prompt, max_new_tokens=1)
        be.round()
        assert second == [BATCH_PREFILL_CHUNK]
        while be.round():
            pass
        assert len(t.wait(0).token_ids) == 1 and len(first.wait(0).token_ids) > 0
    finally:
        be.close()


# --- 3. warmup --------------------------------------------------------------------------------------
@pytest.mark.parametrize("slots", [1, 2])
def test_warmup_times_every_step_and_drafter_and_leaves_every_slot_empty(tiny_bundle, slots):
    be = Engine.open(tiny_bundle, parallel=slots, draft="auto", max_len=64, verify=False, warmup=True)
    try:
        for rows in range(1, slots + 1):  # each size up to k_max + 1 twice, at every width
            assert be.runner.times.table(rows).count == {s: 2 for s in range(1, 6)}
        for slot in range(slots):
            kept = be._drafters.kept(slot)
            assert set(kept) == {"model", "recycle"}
            model = kept["model"]
            assert model.tokens == [] and model.runner.length == 0  # its cache reset
            assert model.runner.times.count[1] >= 2 and model.runner.times.count[2] >= 2  # its steps timed
        assert [be.runner.slot(s).length for s in range(slots)] == [0] * slots and be.cached() == []
        r = be.generate("hello hello hello", max_new_tokens=8, draft="model", k=2)
        assert len(r.token_ids) == 8
    finally:
        be.close()


# --- 4. the self-draft priced at the batch's width ------------------------------------------------
def test_the_self_draft_quotes_its_batched_step_at_the_rounds_width(tiny_deep_bundle):
    pytest.importorskip("onnx")
    be = Engine.open(tiny_deep_bundle, parallel=3, draft="self", max_len=96, verify=False, warmup=False)
    try:
        skips = be.self_pair.skips.times
        freeze(skips.table(1), s1=0.004)
        freeze(skips.table(3), s1=0.010)
        for rows in (1, 2, 3):
            freeze(be.runner.times.table(rows), s1=0.02, s2=0.021, s3=0.022)
        first = be.submit("one two three four", max_new_tokens=30, draft="self", k=2)
        be.round()  # it alone decodes
        quote = be._drafters.kept(0)["self"].cost([1, 2, 3])
        assert (quote.first, quote.step) == (0.004, 0.004)
        rest = [be.submit(p, max_new_tokens=30, draft="self", k=2) for p in ("five six", "seven eight nine")]
        be.round()
        be.round()  # all three decode together: one batched self-draft step of 3 rows
        for slot in range(3):
            quote = be._drafters.kept(slot)["self"].cost([1, 2, 3])
            assert (quote.first, quote.step) == (0.010, 0.010)
        while be.round():
            pass
        assert [len(t.wait(0).token_ids) for t in (first, *rest)] == [30, 30, 30]
    finally:
        be.close()


# --- 5. cached() --------------------------------------------------------------------------------
def test_cached_is_what_slot_zero_holds(tiny_bundle):
    be = Engine.open(tiny_bundle, parallel=1, draft="none", max_len=96, verify=False, warmup=False)
    try:
        assert be.cached() == []
        prompt = "the quick brown fox"
        r = be.generate(prompt, max_new_tokens=6)
        assert r.finish_reason == "length"
        ctx = be.encode(prompt) + r.token_ids
        assert be.cached() == ctx[:-1]  # the last token sampled is not in the cache yet
    finally:
        be.close()


# --- 6. the drafters' learnt state --------------------------------------------------------------
def _seeds(be: BatchEngine) -> tuple:
    """What the next request's auto and suffix start from, as values."""
    d, _, _ = be._drafters.for_request("auto", 3, CostModel(times(s1=0.01)), 0)
    be._drafters.failed(0, d)  # built only to read: dropped
    suffix = next(s for s in d.sources if s.name == "suffix")
    return ({n: (b.a, b.b) for n, b in d.posteriors.items()}, dict(d.share), d.reply,
            [[(b.a, b.b) for b in row] for row in suffix.acc])


def test_drafter_state_restores_what_the_next_request_is_seeded_with(tiny_bundle):
    be = Engine.open(tiny_bundle, parallel=1, draft="auto", max_len=160, verify=False, warmup=False)
    try:
        be.generate("one two three one two three", max_new_tokens=10, draft="recycle", k=2)
        state = be.drafter_state()
        before, table = _seeds(be), be._drafters.kept(0)["recycle"].table.copy()
        prompt = "a b c d a b c d a b c d a b"
        be.generate(prompt, max_new_tokens=30, draft="suffix", k=3)
        be.generate(prompt + " x", max_new_tokens=30, draft="auto", k=3)
        be.generate("seven eight nine seven eight", max_new_tokens=20, draft="recycle", k=2)
        after = _seeds(be)
        assert after[2] != before[2] and after[3] != before[3]  # auto's replies, suffix's acceptance learnt
        assert not np.array_equal(be._drafters.kept(0)["recycle"].table, table)
        be.load_drafter_state(state)
        assert _seeds(be) == before
        assert np.array_equal(be._drafters.kept(0)["recycle"].table, table)
        be.generate(prompt, max_new_tokens=4, draft="auto", k=3)  # the state is a copy: loading it twice
        be.load_drafter_state(state)
        assert _seeds(be) == before
    finally:
        be.close()
