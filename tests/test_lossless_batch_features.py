"""The lossless property for what drafts on, or verifies on, the target's own slot, in a batch: tree="on",
the draft heads (hidden rows of the batched pass) and the self-draft (the layer-skipped graph on each
slot's buffers). Three concurrent requests with different prompts on 3 slots (and queued on the batch
of one): each greedy output equals the target alone's, and each request's stats show the feature ran
(tree rounds, tokens accepted from the source), with a fixed k so adaptive drafting cannot switch it off.
A negative control breaks acceptance and shows the comparison fails.
"""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.core import speculative, tree as treelib
from edgespec.engine import Engine
from edgespec.engine import batch as batch_mod
from edgespec.engine import round as round_mod

from helpers.batch import generate_all
from helpers.lossless import random_prompt

# feature -> (bundle fixture, the BatchEngine's default draft mode, what each request asks)
FEATURES = {
    "tree": ("tiny_bundle_disagree", "auto", dict(draft="model", tree="on", k=3)),
    "heads": ("tiny_heads_bundle", "heads", dict(draft="heads", k=3)),
    "self": ("tiny_deep_bundle", "self", dict(draft="self", k=3)),
}
SLOTS = (1, 3)
NEW = 24


@pytest.fixture(scope="module")
def setups(request):
    """feature -> (a serial engine drafting nothing: the target alone, {slots: BatchEngine}); opened once."""
    if "self" in FEATURES:
        pytest.importorskip("onnx")  # the self-draft's graph is built at load with it
    out = {}
    for name, (fx, mode, _) in FEATURES.items():
        path = request.getfixturevalue(fx)
        out[name] = (Engine.open(path, max_len=192, draft="none"),
                     {n: Engine.open(path, parallel=n, draft=mode, max_len=192) for n in SLOTS})
    yield out
    for eng, bes in out.values():
        eng.close()
        for be in bes.values():
            be.close()


def _prompts(eng, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [random_prompt(eng, rng, int(rng.integers(4, 30))) for _ in range(3)]


def _run(setups, name: str, slots: int, seed: int = 5):
    """(the target alone's results, the batched ones) for three prompts submitted at once."""
    eng, bes = setups[name]
    prompts = _prompts(eng, seed)
    refs = [eng.generate(p, max_new_tokens=NEW, draft="none") for p in prompts]
    got = generate_all(bes[slots], [dict(prompt=p, max_new_tokens=NEW, **FEATURES[name][2]) for p in prompts])
    return refs, got


def _differences(refs, got) -> list[int]:
    return [i for i, (r, g) in enumerate(zip(refs, got)) if g.token_ids != r.token_ids or g.text != r.text]


@pytest.mark.parametrize("slots", SLOTS)
@pytest.mark.parametrize("name", list(FEATURES))
def test_greedy_batched_feature_equals_target_alone(setups, name, slots):
    refs, got = _run(setups, name, slots)
    assert _differences(refs, got) == [], (name, slots)
    assert [g.finish_reason for g in got] == [r.finish_reason for r in refs]
    if slots > 1:  # the requests shared rounds
        assert max(g.stats.batch_size_mean for g in got) > 1.0
    else:
        assert all(g.stats.batch_size_mean == 1.0 for g in got)
    if name == "tree":  # every request's rounds were trees, verified alone on its slot
        assert all(g.stats.tree == "on" and g.stats.tree_rounds > 0 for g in got), [g.stats.tree_rounds for g in got]
    else:  # the source drafted in every request, and the target accepted some of it
        assert all(g.stats.rounds_by_source.get(name, 0) > 0 for g in got), [g.stats.rounds_by_source for g in got]
        assert sum(g.stats.accepted_by_source.get(name, 0) for g in got) > 0


@pytest.mark.parametrize("name", list(FEATURES))
def test_the_comparison_fails_when_acceptance_is_broken(setups, name, monkeypatch):
    """Negative control: accepting every proposed token unchecked (a chain) or the deepest path (a
    tree) makes the batched outputs differ from the target alone's, so the test above can fail."""
    if name == "tree":
        def deepest(rows, tree, usable):
            leaf = max(range(len(tree)), key=lambda i: tree.depth[i])
            path = [leaf]
            while path[-1] != 0:
                path.append(tree.parent[path[-1]])
            return path[::-1], int(np.argmax(rows[leaf]))
        monkeypatch.setattr(treelib, "accept_greedy", deepest)
    else:
        def everything(logits, prop, draft, params, rng, usable, constraint=None, cut_q=None):
            return len(draft), int(np.argmax(logits[len(draft)]))
        monkeypatch.setattr(speculative, "accept", everything)
        assert round_mod.spec.accept is everything
    refs, got = _run(setups, name, 3)
    assert _differences(refs, got) != []


def test_tree_on_and_chains_share_a_batch(setups):
    """A tree="on" request beside chain requests: its rounds are trees, theirs chains in the batched
    pass, all three equal to the target alone."""
    eng, bes = setups["tree"]
    prompts = _prompts(eng, 11)
    refs = [eng.generate(p, max_new_tokens=NEW, draft="none") for p in prompts]
    trees = ["on", "off", "auto"]
    got = generate_all(bes[3], [dict(prompt=p, max_new_tokens=NEW, draft="model", k=3, tree=t)
                                for p, t in zip(prompts, trees)])
    assert _differences(refs, got) == []
    assert got[0].stats.tree_rounds > 0 and got[1].stats.tree_rounds == got[2].stats.tree_rounds == 0
    assert max(g.stats.batch_size_mean for g in got) > 1.0


def test_a_batched_pass_stores_each_slots_hidden_rows_as_its_own_step_would(tiny_heads_bundle):
    """Contract v3: a batched pass (rows of different lengths, padded) leaves each slot the hidden rows a
    one-slot runner's chain step of the same tokens leaves it, so a slot's heads read the same rows
    alone or in a batch."""
    from edgespec.engine import build
    from edgespec.models.bundle import Bundle

    b = Bundle.open(tiny_heads_bundle)
    many = build.load_model(b.model_path("target"), b.target, 64, slots=3)
    one = build.load_model(b.model_path("target"), b.target, 64, slots=1).slot(0)
    assert many.has_hidden and many.one_pass
    prompts = {0: [5, 6, 7, 8], 1: [9, 10], 2: [11, 12, 13]}
    steps = {0: [20, 21, 22], 1: [23], 2: [24, 25]}
    for rows in (prompts, steps):
        many.step(rows)
    for slot, toks in steps.items():
        one.reset()
        one.step(prompts[slot], 1)
        one.step(toks, len(toks))
        first = len(prompts[slot])
        for j, t in enumerate(toks):
            alone, batched = one.hidden_row(first + j, t), many.slot(slot).hidden_row(first + j, t)
            assert batched is not None and batched.shape == alone.shape
            np.testing.assert_allclose(batched, alone, rtol=1e-4, atol=1e-5)
        assert many.slot(slot).hidden_row(first, toks[0] + 1) is None  # another token: not that row


@pytest.mark.parametrize("name", ["heads", "self"])
def test_auto_in_a_batch_ranks_the_loaded_heads_and_self_draft(setups, name):
    """An engine that loaded the heads or the self-draft has them as sources of each batched request's
    `auto` (drafters/modes.py request_rows); its output is still the target alone's."""
    eng, bes = setups[name]
    be = bes[3]
    prompts = _prompts(eng, 21)
    refs = [eng.generate(p, max_new_tokens=NEW, draft="none") for p in prompts]
    tickets = [be.submit(p, max_new_tokens=NEW, draft="auto") for p in prompts]
    be.round()  # admitted: each request's auto is built
    sources = [sorted(s.name for s in a.built.sources) for a in be._active.values()]
    while be.round():
        pass
    got = [t.wait(0) for t in tickets]
    assert _differences(refs, got) == []
    assert sources and all(name in s for s in sources), sources


def test_a_round_of_three_self_drafting_slots_runs_one_self_draft_pass_a_step(setups, monkeypatch):
    """The self-draft's steps batched across slots (engine/draft_batch.py over the self-draft's runner):
    in a round where 3 requests draft with it at a fixed k, the layer-skipped session runs once a draft
    step, each pass over every slot still drafting: max(k) runs, where one slot at a time is sum(k)
    (9 for three at k=3). Counted, not timed; the replies are still the target alone's."""
    be = setups["self"][1][3]
    skips = be.self_pair.skips
    runs, passes, rounds = [0], [], []
    real_run, real_step, real_round = skips.session.run_with_iobinding, skips.step, batch_mod.run_round

    def counting(bd):
        runs[0] += 1
        return real_run(bd)

    def round_counting(target, seqs, cond):
        r0, p0 = runs[0], len(passes)
        out = real_round(target, seqs, cond)
        rounds.append(({s.slot: s.k for s in seqs}, runs[0] - r0, passes[p0:]))
        return out

    monkeypatch.setattr(skips.session, "run_with_iobinding", counting)
    monkeypatch.setattr(skips, "step", lambda rows: passes.append(sorted(rows)) or real_step(rows))
    monkeypatch.setattr(batch_mod, "run_round", round_counting)
    refs, got = _run(setups, "self", 3)
    assert _differences(refs, got) == []
    full = [r for r in rounds if len(r[0]) == 3 and min(r[0].values()) > 0]
    assert len(full) >= 10, rounds
    assert [n for ks, n, _ in full] == [max(ks.values()) for ks, _, _ in full]  # one pass a draft step
    turns = [[sorted(s for s, k in ks.items() if k > j) for j in range(max(ks.values()))] for ks, _, _ in full]
    assert [p for _, _, p in full] == [[t for t in ts if len(t) > 1] for ts in turns]  # each over every slot
    # still drafting (a slot drafting alone steps on its own view, no batched pass)
    assert sum(n for _, n, _ in full) < sum(sum(ks.values()) for ks, _, _ in full)


@pytest.mark.parametrize("name", list(FEATURES))
def test_seeded_sampling_in_a_batch_equals_the_serial_engine(setups, name, request):
    """A sampled request (seeded, fixed k) draws its RNG in the same order in a batch of 3 as on the
    serial engine drafting the same way: the same tokens (tree="on" grows the same tree whatever it has
    learnt: only "auto" prunes; the chains' requests say tree="off", which the serial engine's default
    "auto" is not)."""
    fx, mode, ask = FEATURES[name]
    eng, bes = setups[name]
    serial = Engine.open(request.getfixturevalue(fx), max_len=192, draft=mode)
    prompts = _prompts(eng, 31)
    kw = dict(max_new_tokens=NEW, temperature=0.8, top_k=20, **{"tree": "off", **ask})
    want = [serial.generate(p, seed=40 + i, **kw) for i, p in enumerate(prompts)]
    got = generate_all(bes[3], [dict(prompt=p, seed=40 + i, **kw) for i, p in enumerate(prompts)])
    serial.close()
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert sum(g.stats.drafted for g in got) > 0


def test_heads_in_a_batch_on_a_graph_without_per_row_lengths(request):
    """The cuda-flavored graph (run here by the CPU provider) verifies a batch a pass per row, or one-token
    rows in one pass (core/runner.py): either way each slot's heads read its own hidden rows."""
    import onnxruntime

    from edgespec.edge.flavor import cpu_runs_float16
    from edgespec.models.kernels import floor_problem

    if not cpu_runs_float16() or floor_problem(onnxruntime.__version__, "cuda") is not None:
        pytest.skip("this CPU has no float16 arithmetic, or this onnxruntime is below the cuda flavor's floor")
    path = request.getfixturevalue("tiny_cuda_heads_bundle")
    eng = Engine.open(path, max_len=192, draft="none", providers="cpu")
    be = Engine.open(path, parallel=3, draft="heads", max_len=192, providers="cpu")
    assert not be.runner.one_pass and be.runner.has_hidden
    prompts = _prompts(eng, 41)
    refs = [eng.generate(p, max_new_tokens=NEW) for p in prompts]
    got = generate_all(be, [dict(prompt=p, max_new_tokens=NEW, draft="heads", k=3) for p in prompts])
    assert _differences(refs, got) == []
    assert all(g.stats.rounds_by_source.get("heads", 0) > 0 for g in got), [g.stats.rounds_by_source for g in got]
    assert max(g.stats.batch_size_mean for g in got) > 1.0
    be.close()
    eng.close()
