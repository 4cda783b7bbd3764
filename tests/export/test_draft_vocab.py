"""`edgespec export --draft-vocab N`: the draft's lm_head keeps N rows, the manifest records the map
and the frequency source, the runtime maps draft ids back, and the output is unchanged (greedy here;
sampling with the renormalised q in test_sampling.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.models.bundle import Bundle
from edgespec.engine import Engine
from edgespec.errors import ExportError

from helpers.lossless import check_greedy_lossless


@pytest.fixture(scope="module")
def pruned(tiny_pruned_bundle):
    return Engine.open(tiny_pruned_bundle, max_len=256)


def test_manifest_records_the_map_and_its_source(tiny_pruned_bundle):
    b = Bundle.open(tiny_pruned_bundle)
    facts = b.manifest.models["draft"]
    assert facts.vocab_size == 200 and facts.vocab_map == "draft/vocab_map.npy"
    assert b.manifest.models["target"].vocab_map is None
    info = b.manifest.drafting["draft_vocab"]
    assert info["kept"] == 200 and info["of"] == b.manifest.tokenizer.usable_vocab
    assert "parity text" in info["corpus"] and "merge rank" in info["corpus"]
    m = np.load(tiny_pruned_bundle / facts.vocab_map)
    assert m.shape == (200,) and (np.diff(m) > 0).all() and m.max() < b.manifest.tokenizer.usable_vocab
    assert set(b.manifest.tokenizer.eos_ids) <= set(m.tolist())


def test_pruned_rows_are_the_full_drafts_rows(pruned, tiny_bundle):
    """The graph edit keeps exactly the kept rows: the pruned draft's logits equal the unpruned
    draft's (the same weights: qwen-agree) at the kept ids."""
    full = Engine.open(tiny_bundle, max_len=256)
    ids = pruned.encode("def add(a, b):")
    a = pruned.draft_runner
    b = full.draft_runner
    a.reset()
    b.reset()
    ra = a.step(ids, 3).copy()
    rb = b.step(ids, 3).copy()
    assert ra.shape == (3, 200)
    np.testing.assert_allclose(ra, rb[:, pruned.slot_drafters(0)["model"].vocab_map], rtol=1e-5, atol=1e-5)
    pruned.reset_cache()  # the draft's slot was stepped by hand: its drafter must not trust it
    full.close()


def test_greedy_with_a_pruned_draft_equals_target_alone(pruned):
    check_greedy_lossless(pruned, 21, 2, (1, 2, 3, 4, 5, 6, 7, 8))


def test_a_pruned_draft_proposes_only_kept_ids(pruned):
    kept = set(pruned.slot_drafters(0)["model"].vocab_map.tolist())
    seen = []
    orig = pruned.slot_drafters(0)["model"].propose

    def spy(*a, **kw):
        p = orig(*a, **kw)
        seen.extend(p.tokens)
        return p

    pruned.slot_drafters(0)["model"].propose = spy
    try:
        for seed in range(4):
            pruned.generate("def add(a, b):", max_new_tokens=24, draft="model", k=3, temperature=1.0, seed=seed)
            pruned.generate("x = [1, 2", max_new_tokens=24, draft="model", k=3)
    finally:
        del pruned.slot_drafters(0)["model"].propose
    assert len(seen) > 50 and set(seen) <= kept


@pytest.mark.parametrize("n", [-1, 400, 5000])
def test_bad_draft_vocab_is_refused(tmp_path, n):
    from edgespec_export.pipeline import ExportOptions, validate_options

    if n < 0:
        with pytest.raises(ExportError, match="--draft-vocab"):
            validate_options(ExportOptions(draft_vocab=n))
        return
    from edgespec_export.prune_vocab import choose_kept

    with pytest.raises(ValueError, match="--draft-vocab"):
        choose_kept(n, 400)


def test_choose_kept_order():
    from edgespec_export.prune_vocab import choose_kept

    kept = choose_kept(6, 100, corpus_ids=[50, 50, 60, 99, 99, 99, 7], always=[98])
    # 98 always; then by frequency 99, 50, then 7 and 60 (once each, lower id first); then id 0
    assert kept.tolist() == [0, 7, 50, 60, 98, 99]


def _external_graph(folder):
    """A one-initializer graph whose weight lives in model.onnx.data, as the builder writes them."""
    import onnx
    from onnx import helper, numpy_helper

    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    init = numpy_helper.from_array(w, "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 6])], [init])
    onnx.save_model(helper.make_model(g), str(folder / "model.onnx"), save_as_external_data=True,
                    location="model.onnx.data", size_threshold=0)
    return w


def test_weights_are_read_from_a_hard_linked_data_file(tmp_path):
    """onnx's own loader refuses a data file with two hard links (its 'hardlink attack' check); a
    bundle folder may be hard-linked (a `cp -al` backup, a tool copying the export while it runs:
    the 1.5B export with --heads failed that way), so the export reads the bytes itself."""
    import os

    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor

    from edgespec_export.heads_graph import lm_head_rows
    from edgespec_export.prune_vocab import read_external

    w = _external_graph(tmp_path)
    os.link(tmp_path / "model.onnx.data", tmp_path / "backup.data")
    t = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph.initializer[0]
    with pytest.raises(Exception, match="hard link"):  # the negative control: onnx's reader
        load_external_data_for_tensor(t, str(tmp_path))
    assert np.array_equal(lm_head_rows(tmp_path / "model.onnx", np.array([5, 0])), w[:, [5, 0]].T)
    t.external_data[0].value = "../outside.data"  # a location out of the graph's folder
    with pytest.raises(ValueError, match="outside"):
        read_external(t, tmp_path)
