"""Draft heads trained at export (`edgespec export --heads medusa`, `--draft heads`): the target graph's
hidden_states output (graph contract v3), the training, the heads graph and the drafter. The lossless
checks of the heads drafter are in test_lossless.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.engine import Engine
from edgespec.edge.providers import session_options
from edgespec.engine.build import load_runner
from edgespec.errors import DraftUnavailable, ExportError
from edgespec.models.bundle import Bundle

from helpers.cycle_data import cycle_data
from helpers.lossless import check_heads_sampling

torch = pytest.importorskip("torch", reason="the heads tests read the exporter's modules")
from edgespec_export.heads import HeadsOptions, head_logits, head_targets, top1, train  # noqa: E402
from edgespec_export.heads_graph import lm_head_rows  # noqa: E402


def _runner(path, max_len=64):
    b = Bundle.open(path)
    return b, load_runner(b.model_path("target"), b.target, max_len)


@pytest.mark.parametrize("fixture, exact", [("tiny_heads_bundle", True), ("tiny_cuda_heads_bundle", False)])
def test_hidden_states_output_is_the_lm_head_input(request, fixture, exact):
    """The hidden_states rows times the graph's own lm_head weights give its logits: exactly on the
    fp32 graph; on the cuda flavor (float16 activations, 8-bit head at accuracy level 4) within the
    rounding, with the same argmax."""
    b, r = _runner(request.getfixturevalue(fixture))
    assert b.target.hidden_states == "hidden_states" and r.has_hidden
    logits = r.step([5, 17, 9, 33, 2, 41], 4).copy()
    h = r.hidden.copy()
    assert h.shape == (4, b.target.hidden_size) and h.dtype == np.float32
    w = lm_head_rows(b.model_path("target"), np.arange(b.target.vocab_size))
    recomputed = h @ w.T
    if exact:
        np.testing.assert_allclose(recomputed, logits, rtol=1e-5, atol=1e-4)
    else:
        assert np.abs(recomputed - logits).max() < 0.05 * np.abs(logits).max()
        assert (recomputed.argmax(1) == logits.argmax(1)).all()


def test_hidden_row_names_positions_of_the_last_chain_step(tiny_heads_bundle):
    _, r = _runner(tiny_heads_bundle)
    r.step([5, 6, 7], 1)  # a prefill: one row, position 2 (token 7)
    assert r.hidden_row(2, 7) is not None and r.hidden_row(1, 6) is None and r.hidden_row(2, 8) is None
    first = r.hidden_row(2, 7).copy()
    r.step([8, 9, 10], 3)  # a verify: positions 3..5
    assert [r.hidden_row(p, t) is not None for p, t in ((3, 8), (4, 9), (5, 10))] == [True, True, True]
    r.rewind(5)  # positions 0..4 stay in the cache, 5 does not
    assert r.hidden_row(4, 9) is not None and r.hidden_row(5, 10) is None
    r.reset()
    assert r.hidden_row(3, 8) is None
    r.step([5, 6, 7], 1)
    np.testing.assert_array_equal(r.hidden_row(2, 7), first)  # same context, same state


def test_export_with_heads_writes_graph_vocab_map_and_manifest_record(tiny_heads_bundle):
    import onnxruntime as ort

    m = json.loads((tiny_heads_bundle / "manifest.json").read_text())
    h = m["heads"]
    assert m["format_version"] == 3
    assert (h["method"], h["n_heads"], h["kept"], h["path"], h["vocab_map"]) == (
        "medusa", 3, 200, "heads/model.onnx", "heads/vocab_map.npy")
    assert h["path"] in m["files"] and h["vocab_map"] in m["files"]
    t = h["training"]
    assert t["steps"] == 40 and t["split"]["heldout_tokens"] > 0 and t["split"]["train_tokens"] > 0
    assert t["split"]["train_tokens"] + t["split"]["heldout_tokens"] <= 600
    assert t["split"]["heldout_docs"] and t["data"]["target_answer_tokens"] > 0
    assert len(t["heldout_top1"]) == 3 and all(0.0 <= x <= 1.0 for x in t["heldout_top1"])
    # the graph computes what the training computed: r = h + SiLU(W h + b), then the kept lm_head rows
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(tiny_heads_bundle / h["path"]))
    inits = {i.name: numpy_helper.to_array(i) for i in g.graph.initializer}
    H = h["hidden_size"]
    W = inits["heads.w"].reshape(H, 3, H).transpose(1, 0, 2)
    b = inits["heads.b"].reshape(3, H)
    kept = np.load(tiny_heads_bundle / h["vocab_map"])
    emb = lm_head_rows(tiny_heads_bundle / m["models"]["target"]["path"], kept)
    x = np.random.default_rng(0).standard_normal((2, H)).astype(np.float32)
    s = ort.InferenceSession(str(tiny_heads_bundle / h["path"]), session_options(), providers=["CPUExecutionProvider"])
    got = s.run(None, {"hidden": x})[0]
    assert got.shape == (2, 3, 200)
    np.testing.assert_allclose(got, head_logits(x, emb, W, b), rtol=1e-4, atol=1e-4)
    assert np.abs(W).max() > 0  # the training moved the heads off their zero start


def test_heads_graph_over_an_8_bit_lm_head_matches_its_dequantized_rows(tiny_cuda_heads_bundle):
    """A quantized target's heads keep its MatMulNBits rows (and scales) for the kept ids."""
    import onnxruntime as ort

    m = json.loads((tiny_cuda_heads_bundle / "manifest.json").read_text())
    h = m["heads"]
    s = ort.InferenceSession(str(tiny_cuda_heads_bundle / h["path"]), session_options(), providers=["CPUExecutionProvider"])
    assert any(n.op_type == "MatMulNBits" for n in __import__("onnx").load(
        str(tiny_cuda_heads_bundle / h["path"])).graph.node)
    x = np.random.default_rng(1).standard_normal((1, h["hidden_size"])).astype(np.float32)
    got = s.run(None, {"hidden": x})[0]
    assert got.shape == (1, 3, h["kept"]) and np.isfinite(got).all()
    eng = Engine.open(tiny_cuda_heads_bundle, max_len=128, draft="heads")
    ref = eng.generate("def add(a, b):", max_new_tokens=32, draft="none")
    r = eng.generate("def add(a, b):", max_new_tokens=32, draft="heads", k=3)
    assert r.token_ids == ref.token_ids and r.stats.drafted > 0


def test_a_head_trained_on_a_repeated_pattern_predicts_it():
    """Learning happens: before training each head repeats the lm_head's next token (wrong for t+2+i);
    after 150 steps the held-out predictions follow the cycle."""
    c, emb = cycle_data()
    kept = np.arange(emb.shape[0])
    ids, p, labels = head_targets(c, 3, kept.copy())
    rows = np.arange(len(c.hidden))
    held = rows[c.heldout]
    zero = np.zeros((3, emb.shape[1], emb.shape[1]), np.float32), np.zeros((3, emb.shape[1]), np.float32)
    assert max(top1(c.hidden, emb, *zero, kept, labels, held)) < 0.05
    W, b = train(c.hidden, emb, ids, p, rows[~c.heldout], steps=150)
    assert min(top1(c.hidden, emb, W, b, kept, labels, held)) > 0.95


def test_head_targets_stop_at_document_ends():
    c, _ = cycle_data(T=60)
    ids, p, labels = head_targets(c, 3, np.arange(16))
    last = np.flatnonzero(np.diff(c.doc))[0]  # the last position of document 0
    assert labels[last, 0] == -1 and (p[last].sum() == 0)
    assert labels[last - 1, 0] == c.argmax[last] and labels[last - 1, 1] == -1


def test_a_bundle_without_heads_refuses_draft_heads_naming_the_export_option(tiny_bundle):
    with pytest.raises(DraftUnavailable, match="--heads"):
        Engine.open(tiny_bundle, draft="heads", warmup=False)
    eng = Engine.open(tiny_bundle, max_len=64, warmup=False)
    with pytest.raises(DraftUnavailable, match="--heads"):
        eng.generate("hi", draft="heads")


@pytest.mark.parametrize("opts, match", [
    (dict(method="eagle"), "--heads 'eagle'"), (dict(n_heads=0), "--heads-n"), (dict(n_heads=9), "at most 8"),
    (dict(steps=0), "--heads-steps"), (dict(tokens=10), "--heads-tokens"), (dict(vocab=-1), "--heads-vocab")])
def test_bad_heads_options_are_refused_before_anything_runs(tmp_path, opts, match):
    from edgespec_export.pipeline import ExportOptions, validate_options

    with pytest.raises(ExportError, match=match):
        validate_options(ExportOptions(heads=HeadsOptions(**opts)))


def test_heads_propose_and_auto_uses_them_on_a_heads_bundle(tiny_heads_bundle):
    eng = Engine.open(tiny_heads_bundle, max_len=128)
    assert "heads" in eng.modes() and "heads" in eng.auto_sources()
    ref = eng.generate("def add(a, b):", max_new_tokens=40, draft="none")
    r = eng.generate("def add(a, b):", max_new_tokens=40, draft="heads", k=3)
    assert r.token_ids == ref.token_ids
    assert r.stats.rounds_by_source.get("heads", 0) > 5 and r.stats.drafted >= r.stats.rounds_by_source["heads"]


def _oracle_heads(eng, monkeypatch):
    """Makes the heads drafter's head 0 score with the target's own next-token logits (a second
    runner over the same graph), restricted to the kept rows: proposals the target accepts often,
    so a sampling test exercises the acceptance path with the drafter's real q plumbing (pick, the
    vocab map, q over the usable vocabulary). The tiny model's trained heads rarely hit its top 3."""
    from edgespec.drafters import heads as heads_mod

    b = Bundle.open(eng.bundle.root)
    oracle = load_runner(b.model_path("target"), b.target, 64)
    drafter = eng.slot_drafters(0)["heads"]
    real_draft, ctxs = heads_mod.HeadsDrafter.draft, []

    def draft(self, ctx, k, params, rng):
        ctxs.append(list(ctx))
        return real_draft(self, ctx, k, params, rng)

    def run(self, h):
        oracle.reset()
        row = oracle.step(ctxs[-1], 1)[0]
        return np.tile(row[self.vocab_map], (self.n_heads, 1))

    monkeypatch.setattr(heads_mod.HeadsDrafter, "draft", draft)
    monkeypatch.setattr(heads_mod.HeadsDrafter, "_run", run)
    return drafter


@pytest.mark.slow
@pytest.mark.parametrize("lie", [False, True])
def test_sampling_with_accepted_heads_proposals_and_a_negative_control(tiny_heads_bundle, monkeypatch, lie):
    """With heads the target accepts (an oracle head 0), sampled output matches the target's exact
    distribution; the negative control reports a flat q for the same sampled tokens (so the target
    accepts them far too often) and the same chi-square rejects it."""
    from edgespec.drafters import heads as heads_mod

    eng = Engine.open(tiny_heads_bundle, max_len=64, draft="heads")
    _oracle_heads(eng, monkeypatch)
    check_heads_sampling(eng, heads_mod.HeadsDrafter, monkeypatch, lie)
