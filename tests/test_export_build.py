"""The real export path on tiny random models: every supported architecture and precision, the graph
contract the runtime relies on, and the per-weight quantizer against the builder's own."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="the exporter needs the export extra")

import onnx  # noqa: E402

from edgespec.bundle import Bundle  # noqa: E402
from edgespec.runner import load_runner  # noqa: E402
from edgespec_export.pipeline import ExportOptions, run_export  # noqa: E402
from edgespec_export.tiny import TINY_ARCHS, make_tiny_model  # noqa: E402


def export(src: Path, out: Path, **kw):
    kw.setdefault("isolate", False)
    return run_export(str(src), out, options=ExportOptions(**kw))


def ops(bundle: Path, role: str = "target") -> list[onnx.NodeProto]:
    return list(onnx.load(str(bundle / role / "model.onnx"), load_external_data=False).graph.node)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_fp32_export_of_each_architecture_matches_the_source(tmp_path, arch):
    src = make_tiny_model(tmp_path / "src", arch=arch)
    s = export(src, tmp_path / "b", quant="fp32")
    facts = s.manifest.models["target"]
    cfg = json.loads((src / "config.json").read_text())
    assert (facts.arch, facts.layers, facts.kv_heads, facts.vocab_size) == (
        arch, cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["vocab_size"])
    assert facts.head_dim == cfg["hidden_size"] // cfg["num_attention_heads"]
    # fp32 graph == fp32 source, through the runtime's own runner, prefill and multi-token steps
    assert facts.parity["top1"] >= 0.99 and facts.parity["mean_kl"] < 1e-4 and facts.parity["passed"]
    assert facts.parity["tokens"] == 511  # the parity text, capped by the model's 512 positions
    assert s.manifest.tokenizer.usable_vocab == 400 and s.manifest.defaults["max_len"] == 512
    assert any(n.op_type == "GroupQueryAttention" for n in ops(s.path))


def test_graph_contract_inputs_and_logits_to_keep(tmp_path):
    src = make_tiny_model(tmp_path / "src")
    s = export(src, tmp_path / "b", quant="fp32", parity_tokens=0)
    g = onnx.load(str(s.path / "target" / "model.onnx"), load_external_data=False).graph
    names = {i.name for i in g.input}
    assert {"input_ids", "attention_mask", "num_logits_to_keep", "past_key_values.0.key", "past_key_values.1.value"} <= names
    b = Bundle.open(s.path)
    r = load_runner(b.model_path("target"), b.target, 32)
    out = r.step(list(range(10)), n_logits=3)
    assert out.shape == (3, 512)
    r.reset()
    full = r.step(list(range(10)), n_logits=10)
    np.testing.assert_allclose(full[-3:], out, atol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
def test_int4_quantizes_matmuls_embedding_and_lm_head(tmp_path, tied):
    src = make_tiny_model(tmp_path / "src", tied=tied)
    s4 = export(src, tmp_path / "b4", quant="int4", min_top1=0.3)
    s32 = export(src, tmp_path / "b32", quant="fp32", parity_tokens=0)
    nodes = ops(s4.path)
    kinds = [n.op_type for n in nodes]
    assert "MatMul" not in kinds  # every weight matmul, lm_head included, is MatMulNBits
    assert kinds.count("MatMulNBits") == 2 * 5 + 1  # (qkv, o, gate, up, down) x 2 layers + lm_head
    assert "GatherBlockQuantized" in kinds  # the embedding too
    lm = next(n for n in nodes if "lm_head" in n.name and n.op_type == "MatMulNBits")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in lm.attribute}
    assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (4, 32, 4)
    assert s4.bytes_by_role["target"] < 0.45 * s32.bytes_by_role["target"]
    facts = s4.manifest.models["target"]
    assert (facts.quant, facts.block_size, facts.accuracy_level) == ("int4", 32, 4)
    assert facts.parity["top1"] > 0.3 and facts.parity["passed"]
    if not tied:  # (the tied tiny model's logits are dominated by the input token: int4 keeps them)
        assert facts.parity["top1"] < 1.0 and facts.parity["mean_kl"] > 0  # lossy, and the report says so


def test_int8_and_block_size_and_accuracy_level_reach_the_graph(tmp_path):
    src = make_tiny_model(tmp_path / "src", tied=True)
    s = export(src, tmp_path / "b", quant="int8", block_size=64, accuracy_level=1)
    mm = [n for n in ops(s.path) if n.op_type == "MatMulNBits"]
    assert mm and all({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}["bits"] == 8 for n in mm)
    assert all({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}["block_size"] == 64 for n in mm)
    assert all({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}["accuracy_level"] == 1 for n in mm)
    assert s.manifest.models["target"].parity["top1"] >= 0.95


def test_fp16_graph_runs_with_a_half_precision_cache(tmp_path):
    src = make_tiny_model(tmp_path / "src", arch="qwen3")
    s = export(src, tmp_path / "b", quant="fp16")
    f = s.manifest.models["target"]
    assert (f.kv_dtype, f.quant) == ("float16", "fp16")
    assert f.parity["top1"] >= 0.97


def test_draft_quant_is_separate(tmp_path):
    src = make_tiny_model(tmp_path / "src")
    s = run_export(str(src), tmp_path / "b", draft=str(src),
                   options=ExportOptions(quant="fp32", draft_quant="int4", isolate=False, draft_min_top1=0.3))
    assert s.manifest.models["target"].quant == "fp32" and s.manifest.models["draft"].quant == "int4"
    d = s.manifest.drafting
    assert 0.3 < d["draft_agreement"] < 1.0 and 1 <= d["k"] <= 8


@pytest.mark.parametrize("tied, quant", [(True, "int4"), (False, "int4"), (False, "int8")])
def test_per_weight_quantizer_is_byte_identical_to_the_builders(tmp_path, tied, quant):
    """Our memory-lean quantization pass must produce exactly the builder's own graph."""
    import torch
    from onnxruntime_genai.models import builder
    from transformers import AutoModelForCausalLM

    from edgespec_export.build import builder_options, build_graph

    src = make_tiny_model(tmp_path / "src", tied=tied)
    # the builder's own path: its whole-graph to_nbits and save
    ref = tmp_path / "ref"
    opts = builder_options(quant, 32, 4, tied=tied)
    saved = {n: builder.Model.__dict__[n] for n in ("make_genai_config", "save_processing")}
    builder.Model.make_genai_config = lambda self, *a, **k: None
    builder.Model.save_processing = lambda self, *a, **k: None
    try:
        extra = builder.parse_extra_options("", str(src), str(ref), quant, "cpu", str(tmp_path / "c1"),
                                            [f"{k}={v}" for k, v in opts.items()])
        builder.create_model("", str(src), str(ref), quant, "cpu", str(tmp_path / "c1"), **extra)
    finally:
        for n, f in saved.items():
            setattr(builder.Model, n, f)
    # ours
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    build_graph([model], src, tmp_path / "ours", quant=quant)
    a = onnx.load(str(ref / "model.onnx"))
    b = onnx.load(str(tmp_path / "ours" / "model.onnx"))
    init_a = {t.name: onnx.numpy_helper.to_array(t) for t in a.graph.initializer}
    init_b = {t.name: onnx.numpy_helper.to_array(t) for t in b.graph.initializer}
    assert set(init_a) == set(init_b)
    for name, arr in init_a.items():
        assert arr.dtype == init_b[name].dtype and np.array_equal(arr, init_b[name]), name
    # (input 0 of the lm_head differs on purpose: our graph slices it to the last n positions)
    qa = [(n.name, n.op_type, list(n.input)[1:]) for n in a.graph.node if n.domain == "com.microsoft"]
    qb = [(n.name, n.op_type, list(n.input)[1:]) for n in b.graph.node if n.domain == "com.microsoft"]
    assert sorted(qa) == sorted(qb)

