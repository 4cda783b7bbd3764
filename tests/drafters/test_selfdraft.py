"""Self-speculative drafting (draft="self"): the target with layers skipped drafts for itself.

Lossless like every drafter (greedy token-identical to the target alone, sampling by chi-square), on
the 6-layer tiny bundle and the 2-layer one; the KV sharing (a self round writes the target's own
buffers, and after the verify the target cache equals a fresh prefill); several slots drafting in
one pass of the self-draft's runner, each proposing what it proposes alone; the weight sharing, asserted
structurally (every weight either session runs on is a view of the one memory map of the target's
data file, and neither session prepacks a copy); the manifest's skip choice and its fallback.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.core.sampling import SamplingParams, make_rng
from edgespec.core.shared_weights import PREPACK_CONFIG, SharedWeights
from helpers.rounds import speculative_round
from edgespec.drafters.self import SelfDrafter, default_skip, skip_for
from edgespec.engine import Engine
from edgespec.engine.selfdraft import open_pair
from edgespec.errors import DraftUnavailable
from edgespec.models.bundle import Bundle
from edgespec.models.layer_skip import LayerSkipError, check_skip, skip_layers
from edgespec.models.manifest import MANIFEST_NAME, content_digest

from helpers.lossless import exact_target_distribution, random_prompt
from helpers.stats import chi2_gof

onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def deep(tiny_deep_bundle):
    return {"none": Engine.open(tiny_deep_bundle, max_len=256, draft="none"),
            "self": Engine.open(tiny_deep_bundle, max_len=256, draft="self")}


# --- the skip set ----------------------------------------------------------------------------------
def test_default_skip_is_every_other_layer_of_the_middle_half():
    assert default_skip(30) == [7, 9, 11, 13, 15, 17, 19, 21]
    assert default_skip(24) == [6, 8, 10, 12, 14, 16]
    assert default_skip(6) == [1, 3]
    assert default_skip(2) == [1]
    for n in range(2, 64):
        s = default_skip(n)
        assert s and 0 not in s and max(s) < n
    with pytest.raises(DraftUnavailable, match="no layer to skip"):
        default_skip(1)


def test_check_skip_refuses_layer_zero_and_out_of_range():
    assert check_skip([3, 1, 3], 6) == [1, 3]
    with pytest.raises(LayerSkipError, match="layer 0 reads the embedding"):
        check_skip([0], 6)
    with pytest.raises(LayerSkipError, match=r"cannot skip layer\(s\) \[6\]"):
        check_skip([6], 6)


def test_export_records_the_searched_skip_set(tiny_deep_bundle):
    facts = Bundle.open(tiny_deep_bundle).target
    rec = facts.self_draft
    assert rec is not None and rec["skip"] and all(1 <= i < facts.layers for i in rec["skip"])
    assert 0.0 <= rec["acceptance"] <= 1.0 and 0.0 < rec["cost_ratio"] < 1.0
    assert rec["evaluations"] >= facts.layers - 1  # the screen measured every skippable layer alone
    assert skip_for(facts).source == "manifest" and skip_for(facts).skip == sorted(rec["skip"])


def _strip_self_draft(path):
    m = json.loads((path / MANIFEST_NAME).read_text())
    m["models"]["target"].pop("self_draft", None)
    m["digest"] = content_digest(m)
    (path / MANIFEST_NAME).write_text(json.dumps(m, indent=2))


def test_bundle_exported_without_self_draft_refuses_it_naming_the_flag(tiny_deep_bundle, bundle_copy):
    """The layer search is opt-in at export (`--self-draft`): a bundle without its record refuses
    draft="self" in one line naming the flag, before any model loads; other modes still run."""
    old = bundle_copy(tiny_deep_bundle, "old")
    _strip_self_draft(old)
    assert Bundle.open(old).target.self_draft is None
    with pytest.raises(DraftUnavailable, match=r"has no self-draft .*`edgespec export \.\.\. --self-draft`") as e:
        Engine.open(old, max_len=128, draft="self")
    assert e.value.param == "draft" and "\n" not in str(e.value)
    assert Engine.open(old, max_len=128, draft="none", warmup=False).generate("hello", max_new_tokens=4).token_ids


def test_export_without_self_draft_writes_no_record(tiny_bundle):
    assert Bundle.open(tiny_bundle).target.self_draft is None


def test_layer_edit_removes_the_skipped_layers_and_their_kv(tiny_deep_bundle):
    proto = onnx.load(str(tiny_deep_bundle / "target" / "model.onnx"), load_external_data=False)
    d = skip_layers(proto, [2, 3], 6)
    names = {i.name for i in d.graph.input} | {o.name for o in d.graph.output}
    for i in range(6):
        present = f"past_key_values.{i}.key" in names and f"present.{i}.value" in names
        assert present == (i not in (2, 3))
    assert not any(n.name.startswith(("/model/layers.2/", "/model/layers.3/")) for n in d.graph.node)
    assert len(proto.graph.node) > len(d.graph.node)  # the original is untouched
    assert any(n.name.startswith("/model/layers.2/") for n in proto.graph.node)


def test_layer_edit_refuses_a_graph_it_does_not_understand(tiny_deep_bundle):
    proto = onnx.load(str(tiny_deep_bundle / "target" / "model.onnx"), load_external_data=False)
    for n in proto.graph.node:
        n.name = n.name.replace("/model/layers.", "/blocks.")
    with pytest.raises(LayerSkipError, match="no residual-add norm"):
        skip_layers(proto, [2], 6)


# --- lossless ------------------------------------------------------------------------------------
def test_greedy_equals_target_alone_every_k(deep):
    rng = np.random.default_rng(13)
    drafted = 0
    for i in range(4):
        prompt = random_prompt(deep["none"], rng, int(rng.integers(2, 40)))
        ref = deep["none"].generate(prompt, max_new_tokens=40)
        for k in (None, 1, 2, 3, 4, 5, 6, 7, 8):
            r = deep["self"].generate(prompt, max_new_tokens=40, k=k)
            assert (r.token_ids, r.text, r.finish_reason) == (ref.token_ids, ref.text, ref.finish_reason), (i, k)
            drafted += r.stats.drafted
            if k is not None:
                assert r.stats.rounds_by_source.get("self", 0) > 0
    assert drafted > 100


def test_greedy_two_layer_bundle_and_auto_has_self_when_opened_with_it(tiny_bundle_nodraft):
    ref = Engine.open(tiny_bundle_nodraft, max_len=128, draft="none")
    eng = Engine.open(tiny_bundle_nodraft, max_len=128, draft="self")
    assert "self" in eng.auto_sources()  # one more option of auto
    for prompt in ("def add(a, b):", "the the the the", "x"):
        want = ref.generate(prompt, max_new_tokens=32).token_ids
        for mode, k in (("self", None), ("self", 4), ("auto", None), ("auto", 3)):
            assert eng.generate(prompt, max_new_tokens=32, draft=mode, k=k).token_ids == want, (prompt, mode, k)


def test_auto_alone_does_not_load_self(tiny_bundle_nodraft):
    """Loading it turns weight prepacking off for the target too (docs/speed.md): auto does not
    pay that by itself, with or without a draft model."""
    eng = Engine.open(tiny_bundle_nodraft, max_len=64, draft="auto", warmup=False)
    assert eng.self_pair is None and "self" not in eng.modes()


def test_auto_does_not_load_self_when_a_draft_model_is_loaded(tiny_bundle):
    eng = Engine.open(tiny_bundle, max_len=64, draft="auto")
    assert eng.self_pair is None and "self" not in eng.modes()
    with pytest.raises(DraftUnavailable, match="draft='self' is not possible"):
        eng.generate("hi", max_new_tokens=4, draft="self")


def test_greedy_near_the_cache_limit(tiny_deep_bundle):
    ref = Engine.open(tiny_deep_bundle, max_len=40, draft="none")
    eng = Engine.open(tiny_deep_bundle, max_len=40, draft="self")
    rng = np.random.default_rng(5)
    for free in (1, 2, 3, 5, 8, 12):
        ids = rng.integers(3, eng.vocab.usable, size=40 - free).tolist()
        prompt = eng.tokenizer.decode(ids)
        if eng.count_tokens(prompt) >= 40:
            continue
        want = ref.generate(prompt, max_new_tokens=100)
        assert want.finish_reason in ("cache_full", "stop")
        for k in (1, 3, 8, None):
            r = eng.generate(prompt, max_new_tokens=100, k=k)
            assert (r.token_ids, r.finish_reason) == (want.token_ids, want.finish_reason), (free, k)
            assert eng.target.length <= eng.max_len


@pytest.mark.slow
def test_sampling_matches_the_exact_target_distribution(tiny_deep_bundle):
    eng = Engine.open(tiny_deep_bundle, max_len=64, draft="self")
    params = SamplingParams(temperature=1.5, top_k=3)
    prompt = "def add(a, b):"
    exact = exact_target_distribution(eng, prompt, params)
    n = 1200
    counts: dict = {}
    for seed in range(n):
        r = eng.generate(prompt, max_new_tokens=3, temperature=1.5, top_k=3, seed=seed, k=2)
        counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
    assert chi2_gof(counts, exact, n) > 1e-3


def test_sampled_rounds_are_drafted_and_valid(deep):
    """Quick sampling check (the chi-square test is marked slow): sampled self rounds run, draft,
    and give tokens of the usable vocabulary."""
    r = deep["self"].generate("abc", max_new_tokens=24, temperature=0.8, seed=3, k=3)
    assert r.stats.drafted > 0 and all(0 <= t < deep["self"].vocab.usable for t in r.token_ids)


# --- the KV sharing ------------------------------------------------------------------------------
def _kv_rows(target, n: int) -> list[np.ndarray]:
    return [a[:, :, :n, :].copy() for a in target.runner.arrays]


def test_self_round_writes_the_target_cache_and_the_verify_repairs_it(tiny_deep_bundle):
    b = Bundle.open(tiny_deep_bundle)
    usable = b.manifest.tokenizer.usable_vocab
    pair = open_pair(b.model_path("target"), b.target, 64, skip_for(b.target))
    target, runner = pair.target, pair.runner
    drafter = SelfDrafter(runner, usable, None, adaptive=False)
    rng = make_rng(0)
    ctx = [5, 17, 33, 9, 100, 7, 250, 31]
    target.step(ctx[:-1], 1)
    base = target.length
    before = _kv_rows(target, base)
    k0 = runner.kept[-1]

    def row():
        return target.runner.arrays[2 * k0][:, :, base, :].copy()

    empty = row()
    prop = drafter.propose(ctx, 4, SamplingParams(), rng)
    assert len(prop.tokens) == 4 and prop.source == "self"
    assert not np.array_equal(row(), empty)  # the draft wrote row `base` of a kept layer, in the target's buffer
    assert target.length == base  # ... and the target's length is untouched: the verify owns that row
    drafter.feedback(prop, 0, base)
    for _ in range(6):
        r = speculative_round(target, drafter, ctx, 4, SamplingParams(), rng, usable)
        ctx.extend(r.tokens)
    assert target.length == len(ctx) - 1
    fresh = open_pair(b.model_path("target"), b.target, 64, skip_for(b.target)).target
    fresh.step(ctx[:-1], 1)
    got, want = _kv_rows(target, target.length), _kv_rows(fresh, fresh.length)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    for g, w in zip(before, got):  # the rows before the first round were never touched
        np.testing.assert_array_equal(g, w[:, :, : g.shape[2], :])


# --- several slots in one pass (engine/draft_batch.py over the self-draft's runner) ------------------
CTXS = [[5, 17, 33, 9, 100, 7], [250, 31, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]  # one per slot


def _three_slots(tiny_deep_bundle, monkeypatch):
    """A 3-slot target holding each CTXS[b][:-1] in slot b, its self-draft's runner, the usable vocab and
    a list counting the self-draft session's runs."""
    b = Bundle.open(tiny_deep_bundle)
    pair = open_pair(b.model_path("target"), b.target, 64, skip_for(b.target), slots=3)
    assert pair.skips.one_pass and pair.model.one_pass  # the cut graph keeps the padded-queries mark
    for slot, ctx in enumerate(CTXS):
        pair.model.slot(slot).step(ctx[:-1], 1)
    runs = []
    real = pair.skips.session.run_with_iobinding
    monkeypatch.setattr(pair.skips.session, "run_with_iobinding", lambda bd: runs.append(1) or real(bd))
    return pair, b.manifest.tokenizer.usable_vocab, runs


def test_three_slots_draft_in_one_pass_what_each_drafts_alone(tiny_deep_bundle, monkeypatch):
    """Three SelfDrafters' plans driven together (run_plans) propose the tokens each proposes alone,
    at one self-draft pass a draft step (4 runs for k=4, where alone they are 12), every pass over
    the three slots; the target's cache lengths are untouched."""
    from edgespec.engine.draft_batch import run_plans

    pair, usable, runs = _three_slots(tiny_deep_bundle, monkeypatch)
    drafters = [SelfDrafter(pair.skip(slot), usable, None, adaptive=False) for slot in range(3)]
    alone = [d.propose(ctx, 4, SamplingParams(), make_rng(0)) for d, ctx in zip(drafters, CTXS)]
    assert len(runs) == 12
    passes = []
    real_step = pair.skips.step
    monkeypatch.setattr(pair.skips, "step", lambda rows: passes.append(sorted(rows)) or real_step(rows))
    runs.clear()
    together = run_plans([d.propose_steps(ctx, 4, SamplingParams(), make_rng(0)) for d, ctx in zip(drafters, CTXS)])
    assert (len(runs), passes) == (4, [[0, 1, 2]] * 4)
    assert [p.tokens for p in together] == [p.tokens for p in alone]
    assert all(len(p.tokens) == 4 and p.source == "self" for p in together)
    for a, t in zip(alone, together):
        np.testing.assert_allclose(t.conf, a.conf, rtol=1e-4, atol=1e-5)
    assert [pair.model.lengths[slot] for slot in range(3)] == [len(ctx) - 1 for ctx in CTXS]
    assert [pair.skip(slot).length for slot in range(3)] == [len(ctx) + 3 for ctx in CTXS]


@pytest.mark.parametrize("one_pass", [True, False])
def test_a_slot_not_drafting_keeps_its_target_rows(tiny_deep_bundle, monkeypatch, one_pass):
    """Slots 0 and 2 draft in one pass; slot 1, between them, drafts nothing: its target rows are
    untouched, with the padded-queries edit (nothing written) and without it (its padding is written at
    its target's length, past what the target holds), and its self-draft sits at that length."""
    pair, _, runs = _three_slots(tiny_deep_bundle, monkeypatch)
    n = len(CTXS[1]) - 1
    before = [a[1, :, :n].copy() for a in pair.model.arrays]
    pair.skips.one_pass = one_pass
    for slot in (0, 2):
        pair.skip(slot).length = pair.model.lengths[slot]
    got = pair.skips.step({0: [CTXS[0][-1]], 2: [CTXS[2][-1]]})
    assert len(runs) == 1 and sorted(got) == [0, 2] and got[0].shape == (1, pair.model.vocab_size)
    for x, a in zip(before, pair.model.arrays):
        np.testing.assert_array_equal(x, a[1, :, :n])
    assert pair.skip(1).length == n == pair.model.lengths[1]
    for slot in (0, 2):  # the rows each slot's self-draft computes alone
        skip = pair.skip(slot)
        skip.length = pair.model.lengths[slot]
        alone = skip.step([CTXS[slot][-1]], 1)
        assert int(np.argmax(alone[0])) == int(np.argmax(got[slot][0]))
        np.testing.assert_allclose(got[slot], alone, rtol=1e-4, atol=1e-5)


# --- the weight sharing, structurally --------------------------------------------------------------
def test_both_sessions_run_on_one_memory_map_of_the_weights(tiny_deep_bundle, monkeypatch):
    seen = []
    real = SharedWeights.configure

    def spy(self, so, names=None, folder=None):
        real(self, so, names, folder)
        seen.append((self, so, None if names is None else list(names)))

    monkeypatch.setattr(SharedWeights, "configure", spy)
    b = Bundle.open(tiny_deep_bundle)
    pair = open_pair(b.model_path("target"), b.target, 32, skip_for(b.target))
    assert len(seen) == 2  # the target's session and the self-draft's
    w = pair.weights
    assert all(s[0] is w for s in seen)
    data = (b.model_path("target").parent / "model.onnx.data").resolve()
    total = 0
    for name, arr in w.arrays.items():
        if isinstance(arr.base, np.memmap) or isinstance(arr, np.memmap):
            base = arr if isinstance(arr, np.memmap) else arr.base
            while not isinstance(base, np.memmap) and getattr(base, "base", None) is not None:
                base = base.base
            assert str(base.filename) == str(data)
            assert w.values[name].data_ptr() == arr.ctypes.data  # the OrtValue borrows the mapping
            total += arr.nbytes
    assert total > 0.99 * data.stat().st_size  # every weight byte is in the one mapping
    graph_inits = {t.name for t in w.proto.graph.initializer}
    target_names, draft_names = seen[0][2], seen[1][2]
    assert target_names is None  # all of them
    assert set(draft_names) < graph_inits and draft_names  # a subset: the skipped layers' are not read
    for _, so, _names in seen:
        assert so.get_session_config_entry(PREPACK_CONFIG) == "1"  # no session packs a copy


def test_self_draft_refused_with_an_accelerator_first(tiny_deep_bundle, monkeypatch):
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(DraftUnavailable, match="shares the weights between two CPU sessions"):
        Engine.open(tiny_deep_bundle, max_len=32, draft="self", providers=["cuda", "cpu"], warmup=False)


def test_bench_modes_take_self_with_fixed_k_and_refuse_it_with_model():
    from edgespec.bench.run import parse_modes
    from edgespec.errors import InvalidRequest

    modes = parse_modes("target,self,auto", "2", has_draft=False)
    assert [(m.draft, m.k) for m in modes] == [("none", None), ("self", None), ("self", 2), ("auto", None)]
    with pytest.raises(InvalidRequest, match="model and self need differently opened engines"):
        parse_modes("target,model,self", None, has_draft=True)


def test_server_accepts_draft_self():
    from edgespec.drafters.modes import NAMES as DRAFT_MODES

    assert "self" in DRAFT_MODES


@pytest.fixture(scope="module")
def tied_bundle(tmp_path_factory):
    pytest.importorskip("torch")
    from edgespec_export.pipeline import export_bundle
    from edgespec_export.tiny import make_tiny_model

    root = tmp_path_factory.mktemp("tied")
    src = make_tiny_model(root / "src", layers=4, seed=1, tied=True)
    return export_bundle(src, root / "b", quant="fp32", isolate=False, self_draft=True)


def test_tied_embedding_transpose_is_folded_once_and_shared(tied_bundle, monkeypatch):
    """A tied embedding reaches its Gather through a Transpose of the lm_head weight, which
    onnxruntime would fold into a new tensor per session: it is folded once and given to both."""
    seen = []
    real = SharedWeights.configure

    def spy(self, so, names=None, folder=None):
        real(self, so, names, folder)
        seen.append(None if names is None else set(names))

    monkeypatch.setattr(SharedWeights, "configure", spy)
    ref = Engine.open(tied_bundle, max_len=64, draft="none")
    eng = Engine.open(tied_bundle, max_len=64, draft="self")
    w = eng.self_pair.weights  # the self-draft pair holds them (its runner and the target's alike)
    assert w.folded == ["/model/embed_tokens/Transpose/output_0"]
    assert not any(n.op_type == "Transpose" and n.input[0] in w.arrays for n in w.proto.graph.node)
    assert seen[0] is None and w.folded[0] in seen[1]  # the target gets all; the draft gets the folded one too
    for prompt in ("hello", "a b a b a b"):
        for k in (None, 2, 5):
            assert eng.generate(prompt, max_new_tokens=24, k=k).token_ids == \
                ref.generate(prompt, max_new_tokens=24).token_ids
