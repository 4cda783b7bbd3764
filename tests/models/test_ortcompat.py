"""One cpu bundle on every onnxruntime from 1.23.2 (models/ortcompat.py): where the installed
GroupQueryAttention schema has no query_seqlens, the loader drops that input (and the batching
metadata) from the graph it hands onnxruntime; the rest of the graph is byte for byte the same. The
real 1.23.2 and 1.24.1 wheels run it in scripts/ci-ort.sh; here the schema is faked."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgespec.models import ortcompat
from edgespec.models.ortcompat import STRIPPABLE, missing_inputs, strip_inputs

OLD_SCHEMA = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
              "sin_cache", "position_ids", "attention_bias", "head_sink")  # 1.23.2's and 1.24.1's


def _graph(bundle: Path) -> Path:
    return bundle / json.loads((bundle / "manifest.json").read_text())["models"]["target"]["path"]


def test_missing_inputs_reads_the_schema_then_the_version():
    assert missing_inputs(OLD_SCHEMA) == {16: "query_seqlens"}
    assert missing_inputs(OLD_SCHEMA + ("k_scale", "v_scale", "q_norm_weight", "k_norm_weight", "query_seqlens")) == {}
    import onnxruntime

    from edgespec.models.kernels import version_tuple

    new = version_tuple(onnxruntime.__version__) >= version_tuple(ortcompat.BATCH_ORT)
    assert missing_inputs() == ({} if new else {16: "query_seqlens"})  # the installed one (scripts/ci-ort.sh: old ones)
    import edgespec.models.ortcompat as oc

    real = oc.gqa_schema_inputs
    try:
        oc.gqa_schema_inputs = lambda: None  # a build that cannot list schemas: its version decides
        assert missing_inputs(version="1.24.1") == {16: "query_seqlens"} and missing_inputs(version="1.32.0") == {}
    finally:
        oc.gqa_schema_inputs = real


def test_strip_drops_query_seqlens_and_the_batching_mark_and_nothing_else(tiny_bundle):
    raw = _graph(tiny_bundle).read_bytes()
    out, changed = strip_inputs(raw, {16: "query_seqlens"})
    before, after = onnx.load_from_string(raw), onnx.load_from_string(out)
    assert changed == sum(n.op_type == "GroupQueryAttention" for n in before.graph.node) == 2
    for a, b in zip(before.graph.node, after.graph.node, strict=True):
        if a.op_type == "GroupQueryAttention":
            assert a.input[16] == "/edgespec/padded_queries/query_seqlens" and list(b.input) == list(a.input)[:11]
        else:
            assert a == b
    assert {p.key for p in before.metadata_props} - {p.key for p in after.metadata_props} == {"edgespec.padded_queries"}
    assert list(before.graph.initializer) == list(after.graph.initializer)
    assert strip_inputs(out, {16: "query_seqlens"}) == (out, 0)  # nothing left to strip
    assert strip_inputs(raw, {}) == (raw, 0)


def test_a_cuda_graph_is_left_as_it_is(tiny_cuda_bundle):
    raw = _graph(tiny_cuda_bundle).read_bytes()
    assert strip_inputs(raw, {16: "query_seqlens"}) == (raw, 0)


def test_the_loader_hands_an_old_onnxruntime_the_stripped_graph(tiny_bundle, monkeypatch, caplog):
    """Faked old schema on the installed onnxruntime: the stripped graph loads from bytes with its
    weights found beside the file, and generates what the unstripped one does (single stream)."""
    from edgespec.engine.build import load_runner
    from edgespec.models.bundle import Bundle

    b = Bundle.open(tiny_bundle)
    want = load_runner(b.model_path("target"), b.target, max_len=32, providers="cpu").step([1, 2, 3, 4], 4)
    monkeypatch.setattr(ortcompat, "gqa_schema_inputs", lambda: OLD_SCHEMA)
    with caplog.at_level("INFO", logger="edgespec.edge.providers"):
        r = load_runner(b.model_path("target"), b.target, max_len=32, providers="cpu")
    assert any("cannot take GroupQueryAttention's query_seqlens: loaded without it (2 node(s)" in m
               for m in caplog.messages)
    meta = r.session.get_modelmeta().custom_metadata_map
    assert "edgespec.padded_queries" not in meta
    np.testing.assert_allclose(r.step([1, 2, 3, 4], 4), want, rtol=1e-5, atol=1e-5)


def test_strippable_inputs_say_what_is_lost():
    assert STRIPPABLE == {16: ("query_seqlens", STRIPPABLE[16][1]), 9: ("position_ids", STRIPPABLE[9][1])}
    assert "1.32.0" in STRIPPABLE[16][1] and "seqlens_k" in STRIPPABLE[9][1]


def test_a_truncated_graph_is_a_format_error():
    from edgespec.models.graphfacts import GraphFormatError

    with pytest.raises(GraphFormatError):
        strip_inputs(b"\x3a\x10abc", {16: "query_seqlens"})  # field 7 claims 16 bytes, has 3


def test_a_cuda_graph_below_1_24_loads_without_position_ids_and_gives_the_same_logits(tiny_cuda_bundle, monkeypatch,
                                                                                       caplog):
    """NVIDIA's onnxruntime-gpu 1.23.0 refuses GroupQueryAttention's position_ids on CUDA: below 1.24.0 the
    loader takes them out of a cuda graph, and the kernel's own positions (from seqlens_k) are the chain's:
    prefill, one token, several tokens over a cache, bit for bit (CPU provider)."""
    import onnxruntime

    from edgespec.engine.build import load_runner
    from edgespec.models.bundle import Bundle

    assert missing_inputs(version="1.23.0", flavor="cuda").get(9) == "position_ids"
    assert 9 not in missing_inputs(version="1.23.0", flavor="cpu")  # the cpu flavor's trees need them
    assert 9 not in missing_inputs(version="1.23.0", flavor=None)
    assert 9 not in missing_inputs(version="1.24.0", flavor="cuda")

    b = Bundle.open(tiny_cuda_bundle)

    def steps():
        r = load_runner(b.model_path("target"), b.target, max_len=32, providers="cpu")
        return [r.step([1, 2, 3, 4, 5], 5).copy(), r.step([6], 1).copy(), r.step([7, 8, 9], 3).copy()]

    want = steps()  # with position_ids from 1.24.0 on (below, scripts/ci-ort.sh, this is the stripped graph too)
    monkeypatch.setattr(onnxruntime, "__version__", "1.23.0")
    with caplog.at_level("INFO", logger="edgespec.edge.providers"):
        got = steps()
    assert any("position_ids" in m and "loaded without it (2 node(s)" in m for m in caplog.messages)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)
