"""The feature drafter (`edgespec export --heads feature`, `--draft heads`): its training, its graph
against the numpy reference, the runtime drafter, and the bundle checks of its record. Its greedy
lossless check is in test_lossless.py next to the Medusa heads'."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.edge.providers import session_options
from edgespec.engine import Engine
from edgespec.engine.build import load_runner
from edgespec.errors import BundleCorrupt, ExportError
from edgespec.models.bundle import Bundle

from helpers.costs import freeze
from helpers.cycle_data import cycle_data
from helpers.lossless import check_heads_sampling
from helpers.manifests import rewrite_manifest

torch = pytest.importorskip("torch", reason="the feature drafter's tests read the exporter's modules")
from edgespec_export import feature as ft  # noqa: E402
from edgespec_export.heads import HeadsOptions, head_targets  # noqa: E402
from edgespec_export.heads_graph import lm_head_rows, write_feature_graph  # noqa: E402


def _session(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])


def _random_params(H, N, inter, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    return {"w_f": r(H, H), "table": r(N + 1, H), "w_g": r(H, inter), "w_u": r(H, inter), "w_d": r(inter, H),
            "g": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)}


def _check_graph(path, emb, P, N, H, exact=True):
    """onnxruntime's outputs == feature_step's, for a kept token, another and the UNK row. Over an
    8-bit lm_head at accuracy level 4 the kernel rounds its input to int8 too: logits within that
    rounding, the same argmax."""
    s = _session(path)
    rng = np.random.default_rng(3)
    for tok in (0, N // 2, N):  # N: the UNK row
        f = rng.standard_normal((1, H)).astype(np.float32) * 3
        feat, logits = s.run(["feature", "logits"], {"hidden": f, "token": np.array([tok], np.int64)})
        ref_f, ref_l = ft.feature_step(f, np.array([tok]), emb, P)
        assert feat.shape == (1, H) and logits.shape == (1, N)
        np.testing.assert_allclose(feat, ref_f, rtol=1e-4, atol=1e-4)
        if exact:
            np.testing.assert_allclose(logits, ref_l, rtol=1e-4, atol=1e-3)
        else:
            assert np.abs(logits - ref_l).max() < 0.02 * np.abs(ref_l).max() and logits.argmax() == ref_l.argmax()


def test_export_with_feature_heads_writes_graph_record_and_the_graph_is_its_numpy_reference(tiny_feature_bundle):
    m = json.loads((tiny_feature_bundle / "manifest.json").read_text())
    h = m["heads"]
    assert (h["method"], h["n_heads"], h["kept"], h["path"], h["vocab_map"]) == (
        "feature", 3, 200, "heads/model.onnx", "heads/vocab_map.npy")
    assert h["path"] in m["files"] and h["vocab_map"] in m["files"]
    t = h["training"]
    assert t["steps"] == 40 and t["ffn"] == 32 and t["split"]["heldout_tokens"] > 0
    for key in ("heldout_top1", "heldout_chain", "heldout_top1_true_inputs", "heldout_top1_untrained", "train_top1"):
        assert len(t[key]) == 3 and all(0.0 <= x <= 1.0 for x in t[key]), key
    assert t["heldout_chain"][0] == t["heldout_top1"][0]  # position 0's chain is its own top-1
    assert all(a >= b for a, b in zip(t["heldout_chain"], t["heldout_chain"][1:]))  # a chain only shortens
    # the graph's weights, read back, through the numpy reference == onnxruntime's output
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(tiny_feature_bundle / h["path"]))
    P = {i.name.split(".", 1)[1]: numpy_helper.to_array(i) for i in g.graph.initializer if i.name.startswith("feature.")}
    assert P["w_g"].shape == (h["hidden_size"], 32) and P["table"].shape == (201, h["hidden_size"])
    assert np.abs(P["w_d"]).max() > 0  # the training moved the block off its zero start
    kept = np.load(tiny_feature_bundle / h["vocab_map"])
    emb = lm_head_rows(tiny_feature_bundle / m["models"]["target"]["path"], kept)
    _check_graph(tiny_feature_bundle / h["path"], emb, P, 200, h["hidden_size"])


def test_feature_graph_over_an_8_bit_lm_head_is_its_numpy_reference(tiny_cuda_heads_bundle, tmp_path):
    """A quantized target's lm_head rows are copied as stored (MatMulNBits): the reference reads them
    dequantized (the real 1.5B target's head is 8-bit)."""
    b = Bundle.open(tiny_cuda_heads_bundle)
    H = b.target.hidden_size
    kept = np.arange(0, 300, 2)
    P = _random_params(H, kept.size, 48)
    write_feature_graph(tmp_path / "f.onnx", b.model_path("target"), kept, P)
    import onnx

    assert any(n.op_type == "MatMulNBits" for n in onnx.load(str(tmp_path / "f.onnx")).graph.node)
    _check_graph(tmp_path / "f.onnx", lm_head_rows(b.model_path("target"), kept), P, kept.size, H, exact=False)


def test_the_feature_drafter_trained_on_a_repeated_pattern_predicts_it_along_its_own_chain():
    """Learning happens: untrained, the block repeats the lm_head's token (wrong for the position
    after); after 150 steps its own chain (its own features and drafted tokens as inputs) follows
    the cycle at positions 1, 2 and 3."""
    c, emb = cycle_data()
    kept = np.arange(emb.shape[0])
    ids, p, labels = head_targets(c, 3, kept.copy())
    src, tok = ft.chain_rows(c.doc, 3), ft.kept_tokens(c.ids, kept.copy(), kept.size)
    rows = np.arange(len(c.hidden))
    held = rows[c.heldout]
    start = ft.start_params(c.hidden, kept.size, 32)
    assert max(ft.heldout_top1(c.hidden, tok, emb, start, kept, labels, src, held, own=True)[0]) < 0.05
    P = ft.train(c.hidden, tok, emb, ids, p, src, rows[~c.heldout], steps=150, inter=32)
    own, chain = ft.heldout_top1(c.hidden, tok, emb, P, kept, labels, src, held, own=True)
    assert min(own) > 0.95 and chain[2] > 0.95


def test_chain_rows_stop_at_document_ends_and_unknown_tokens_read_the_unk_row():
    doc = np.array([0, 0, 0, 1, 1])
    assert ft.chain_rows(doc, 2).tolist() == [[1, 2], [2, -1], [-1, -1], [4, -1], [-1, -1]]
    index = np.array([-1, 0, -1, 1])  # ids 1 and 3 kept
    assert ft.kept_tokens(np.array([1, 3, 0, 2, 9]), index, 2).tolist() == [0, 1, 2, 2, 2]


@pytest.mark.parametrize("opts, match", [
    (dict(method="eagle"), "methods are medusa, feature"), (dict(method="feature", ffn=-1), "--heads-ffn"),
    (dict(method="medusa", ffn=64), "only the feature drafter"), (dict(method="feature", n_heads=0), "--heads-n")])
def test_bad_feature_options_are_refused_before_anything_runs(opts, match):
    from edgespec_export.pipeline import ExportOptions, validate_options

    with pytest.raises(ExportError, match=match):
        validate_options(ExportOptions(heads=HeadsOptions(**opts)))


@pytest.mark.parametrize("edit, line", [
    (lambda h: h.update(method="eagle"), "manifest.json: heads.method 'eagle' is not one of medusa, feature"),
    (lambda h: h.update(method="medusa"), "heads/model.onnx: manifest heads.method 'medusa' means inputs hidden and "
     "outputs logits; the graph has inputs hidden, token and outputs feature, logits"),
    (lambda h: h.update(hidden_size=65), "heads/model.onnx: manifest heads.hidden_size is 65, the graph's hidden has 64"),
    (lambda h: h.update(kept=201), "heads/model.onnx: manifest heads.kept is 201, the graph's logits has 200"),
    (lambda h: h.update(path="heads/none.onnx"), "manifest.json: heads.path 'heads/none.onnx' is not listed in 'files'"),
])
def test_a_lying_feature_record_is_refused_with_one_line(tiny_feature_bundle, bundle_copy, edit, line):
    b = bundle_copy(tiny_feature_bundle, "lie")
    rewrite_manifest(b, lambda d: edit(d["heads"]))
    with pytest.raises(BundleCorrupt) as e:
        Bundle.open(b)
    assert e.value.problems == [line]


def test_the_feature_drafter_grows_its_chain_only_while_a_call_pays(tiny_feature_bundle):
    """Chain sizing by measured cost (k unset): with a call costing 1 % of a target step the chain grows past
    one token; at 3 target steps a second call never pays, so each round proposes at most the one
    token its first call gave (`--draft heads` always makes that call; `auto` decides whether a round
    drafts at all, from the rate its rounds delivered)."""
    eng = Engine.open(tiny_feature_bundle, max_len=128, draft="heads", warmup=False)
    d = eng.slot_drafters(0)["heads"]
    for i in range(3):  # positions the drafter believes in, whatever this tiny model's export measured
        d.mean[i].add(50, 0)
        for b in d.by_conf[i]:
            b.add(50, 0)
    freeze(eng.target.times, **{f"s{n}": 0.010 for n in range(1, 17)})
    freeze(d.times, s1=0.0001)
    cheap = eng.generate("def add(a, b):", max_new_tokens=24, draft="heads")  # k None: sized by cost
    assert cheap.stats.drafted > 0 and max(d.last_sizes) == 1 and cheap.stats.drafted >= 2 * cheap.stats.rounds_by_source["heads"]
    freeze(d.times, s1=0.030)
    dear = eng.generate("def add(a, b):", max_new_tokens=24, draft="heads")
    rounds = dear.stats.rounds_by_source["heads"]
    assert 0 < dear.stats.drafted <= rounds and dear.token_ids == cheap.token_ids


def _oracle(eng, monkeypatch):
    """The feature drafter's calls score with the target's own next-token logits for the context so
    far (a second runner over the same graph), restricted to the kept rows: proposals the target
    accepts often, so the sampling test exercises acceptance with the drafter's real q plumbing
    (pick, the vocab map, the UNK index). The tiny model's trained block rarely hits its top 3."""
    from edgespec.drafters import feature as feature_mod

    b = Bundle.open(eng.bundle.root)
    oracle = load_runner(b.model_path("target"), b.target, 64)
    real_draft, ctxs = feature_mod.FeatureDrafter.draft, []

    def draft(self, ctx, k, params, rng):
        ctxs.append(list(ctx))
        return real_draft(self, ctx, k, params, rng)

    def run(self, f, x):
        oracle.reset()
        row = oracle.step(ctxs[-1], 1)[0]
        return f, row[self.vocab_map]

    monkeypatch.setattr(feature_mod.FeatureDrafter, "draft", draft)
    monkeypatch.setattr(feature_mod.FeatureDrafter, "_run", run)


@pytest.mark.slow
@pytest.mark.parametrize("lie", [False, True])
def test_sampling_with_feature_proposals_matches_the_target_and_a_lying_q_is_caught(tiny_feature_bundle, monkeypatch, lie):
    """With proposals the target accepts (an oracle first call), sampled output matches the target's
    exact distribution; the negative control reports a flat q for the same sampled tokens and the
    same chi-square rejects it."""
    from edgespec.drafters import feature as feature_mod

    eng = Engine.open(tiny_feature_bundle, max_len=64, draft="heads")
    _oracle(eng, monkeypatch)
    check_heads_sampling(eng, feature_mod.FeatureDrafter, monkeypatch, lie)
