"""The real export path on tiny random models: every supported architecture and precision, the graph
contract the runtime relies on, and the per-weight quantizer against the builder's own."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="the exporter needs the export extra")

import onnx  # noqa: E402

from edgespec.models.bundle import Bundle  # noqa: E402
from edgespec.engine.build import load_runner  # noqa: E402
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
    assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (8, 32, 4)  # the head at 8 bits
    body = next(n for n in nodes if "layers.0/mlp/down_proj" in n.name)
    assert {a.name: onnx.helper.get_attribute_value(a) for a in body.attribute}["bits"] == 4
    emb = next(n for n in nodes if n.op_type == "GatherBlockQuantized")
    # tied: the embedding reads the 8-bit head; untied: it keeps the body's 4 bits
    assert {a.name: onnx.helper.get_attribute_value(a) for a in emb.attribute}.get("bits", 4) == (8 if tied else 4)
    assert s4.bytes_by_role["target"] < 0.5 * s32.bytes_by_role["target"]
    facts = s4.manifest.models["target"]
    assert (facts.quant, facts.block_size, facts.accuracy_level, facts.head_bits) == ("int4", 32, 4, 8)
    assert facts.parity["top1"] > 0.3 and facts.parity["passed"]
    if not tied:  # (the tied tiny model's logits are dominated by the input token: int4 keeps them)
        assert facts.parity["top1"] < 1.0 and facts.parity["mean_kl"] > 0  # lossy, and the report says so


@pytest.mark.parametrize("widths, fits", [((1536, 8960, 1536), True), ((896, 4864, 896), True),
                                          ((576, 1536, 576), False), ((64, 128, 64), False)])
def test_the_default_block_needs_every_width_a_multiple_of_it(widths, fits, monkeypatch):
    from edgespec_export import quantize

    monkeypatch.setattr(quantize, "DEFAULT_BLOCK_SIZE", 128)  # the 1.5B and 0.5B Qwens; SmolLM2-135M; tiny
    assert quantize.default_block_size(*widths) == (128 if fits else quantize.FALLBACK_BLOCK_SIZE)


def test_the_drafts_default_form():
    """quantize.py's draft defaults: 4-bit under an int4 export (a float or int8 export's draft follows
    --quant), blocks of 128 where they divide the widths, a 32,768-row head for a 65,536+ vocabulary."""
    from edgespec_export.quantize import DRAFT_VOCAB, default_block_size, draft_quant, draft_vocab

    assert draft_quant("int4") == "int4" and draft_quant("int8") == "int8" and draft_quant("fp32") == "fp32"
    assert draft_quant("fp32", "int4") == "int4" and draft_quant("int4", "int8") == "int8"  # --draft-quant
    assert default_block_size(896, 4864, 896, role="draft") == 128  # the 0.5B Qwen
    assert default_block_size(896, 4864, 896) == 32  # a target's
    assert default_block_size(64, 128, 64, role="draft") == 32  # 128 does not divide 64
    assert DRAFT_VOCAB == 32768
    assert draft_vocab(None, "int4", 151_665, 1) == 32768  # Qwen2.5's usable vocabulary
    assert draft_vocab(None, "int4", 49_152, 1) == 0  # SmolLM2's: under 65,536, kept whole
    assert draft_vocab(None, "int4", 151_665, 2) == 0  # --ep cpu,cuda: pruning is one flavor's
    assert draft_vocab(None, "fp32", 151_665, 1) == 0
    assert draft_vocab(0, "int4", 151_665, 1) == 0 and draft_vocab(1000, "fp32", 151_665, 1) == 1000  # as asked


def test_an_export_without_block_size_takes_the_default_for_its_widths(tmp_path):
    from edgespec_export.quantize import default_block_size

    src = make_tiny_model(tmp_path / "src", hidden=128, heads=4, kv_heads=2)
    s = export(src, tmp_path / "b", quant="int4", min_top1=0.3)
    want = default_block_size(128, 256, 128)
    mm = [n for n in ops(s.path) if n.op_type in ("MatMulNBits", "GatherBlockQuantized")]
    assert {onnx.helper.get_attribute_value(a) for n in mm for a in n.attribute if a.name == "block_size"} == {want}
    assert s.manifest.models["target"].block_size == want


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
    build_graph([model], src, tmp_path / "ours", quant=quant, head_bits=4 if quant == "int4" else None)
    a = onnx.load(str(ref / "model.onnx"))
    b = onnx.load(str(tmp_path / "ours" / "model.onnx"))
    # int8: onnxruntime's quantizer leaves the embedding in float (its Gather path is 4-bit only);
    # ours quantizes it to 8 bits (tested below). Everything else must be identical.
    skip = ("model.embed_tokens",) if quant == "int8" else ()
    init_a = {t.name: onnx.numpy_helper.to_array(t) for t in a.graph.initializer if not t.name.startswith(skip or "\0")}
    init_b = {t.name: onnx.numpy_helper.to_array(t) for t in b.graph.initializer if not t.name.startswith(skip or "\0")}
    assert set(init_a) == set(init_b)
    for name, arr in init_a.items():
        assert arr.dtype == init_b[name].dtype and np.array_equal(arr, init_b[name]), name
    # (input 0 of the lm_head differs on purpose: our graph slices it to the last n positions)
    qa = [(n.name, n.op_type, list(n.input)[1:]) for n in a.graph.node if n.domain == "com.microsoft" and n.op_type == "MatMulNBits"]
    qb = [(n.name, n.op_type, list(n.input)[1:]) for n in b.graph.node if n.domain == "com.microsoft" and n.op_type == "MatMulNBits"]
    assert sorted(qa) == sorted(qb)



def test_head_bits_8_keeps_an_int4_model_closer(tmp_path):
    src = make_tiny_model(tmp_path / "src")
    s4 = export(src, tmp_path / "b4", quant="int4", head_bits=4, min_top1=0.3)
    s48 = export(src, tmp_path / "b48", quant="int4", min_top1=0.3)  # the default
    p4, p48 = s4.manifest.models["target"].parity, s48.manifest.models["target"].parity
    assert p48["mean_kl"] < p4["mean_kl"] and p48["top1"] >= p4["top1"]
    assert s48.manifest.models["target"].head_bits == 8 and s4.manifest.models["target"].head_bits == 4
    nodes = {n.name: n for n in ops(s48.path)}
    bits = {name: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}.get("bits", 4) for name, n in nodes.items()}
    head = next(n for n in nodes.values() if n.op_type == "MatMulNBits" and "lm_head" in n.name)
    body = next(n for n in nodes.values() if n.op_type == "MatMulNBits" and "layers.0" in n.name)
    emb = next(n for n in nodes.values() if n.op_type == "GatherBlockQuantized")
    assert (bits[head.name], bits[body.name], bits[emb.name]) == (8, 4, 4)  # untied embedding: body bits


def test_tied_embedding_reads_the_8bit_lm_head(tmp_path):
    """int4 body, 8-bit head, tied: the embedding's GatherBlockQuantized reads the lm_head's own
    8-bit tensor through a Reshape (no second copy), and dequantizes to the original rows."""
    import torch
    from transformers import AutoModelForCausalLM

    src = make_tiny_model(tmp_path / "src", tied=True)
    s = export(src, tmp_path / "b", quant="int4", head_bits=8)
    model = onnx.load(str(s.path / "target" / "model.onnx"))
    nodes = list(model.graph.node)
    gbq = next(n for n in nodes if n.op_type == "GatherBlockQuantized")
    reshape = next(n for n in nodes if n.output[0] == gbq.input[0])
    assert reshape.op_type == "Reshape" and reshape.input[0] == "lm_head.MatMul.weight_Q8"
    assert {a.name: onnx.helper.get_attribute_value(a) for a in gbq.attribute}["bits"] == 8
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    q = inits["lm_head.MatMul.weight_Q8"].reshape(512, 64).astype(np.float32)
    scales = inits["lm_head.MatMul.weight_scales"].reshape(512, 2)
    deq = (q - 128).reshape(512, 2, 32) * scales[..., None]
    emb = AutoModelForCausalLM.from_pretrained(src).model.embed_tokens.weight.detach().numpy()
    err = np.abs(deq - emb.reshape(512, 2, 32))
    assert np.all(err <= np.abs(scales)[..., None] + 1e-7)  # within one quantization step of each block
    assert sum(1 for t in model.graph.initializer if t.name.startswith("lm_head")) == 2  # data + scales, once
    del torch


def test_8bit_embedding_quantizer_against_onnxruntime(tmp_path):
    """Our GatherBlockQuantized 8-bit encoding, run by onnxruntime, gives the rows back within half a step."""
    import onnx_ir as ir

    from edgespec.edge.providers import create_session
    from edgespec_export.quantize import _gather_8bit

    rng = np.random.default_rng(0)
    emb = rng.standard_normal((50, 64)).astype(np.float32)
    emb[3] = 0  # an all-zero row (padding) must not divide by zero
    w = ir.Value(name="E", const_value=ir.tensor(emb))
    ids = ir.Value(name="ids")
    node = ir.Node("", "Gather", [w, ids], name="g", num_outputs=1)
    node.outputs[0].name = "Y"
    protos, inits = _gather_8bit(node, w, 32)
    g = onnx.helper.make_graph(
        protos, "t", [onnx.helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [4])],
        [onnx.helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [4, 64])],
        initializer=[ir.serde.serialize_tensor(t) for t in inits])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 21), onnx.helper.make_opsetid("com.microsoft", 1)])
    onnx.save(m, str(tmp_path / "g.onnx"))
    # through edgespec's own session factory: it owns the process-wide onnxruntime thread-pool setup
    sess, _ = create_session(tmp_path / "g.onnx", providers=["cpu"])
    idx = np.array([0, 3, 17, 49])
    out = sess.run(None, {"ids": idx})[0]
    step = np.abs(emb[idx]).reshape(4, 2, 32).max(axis=2) / 127
    assert np.all(np.abs(out - emb[idx]).reshape(4, 2, 32) <= step[..., None] / 2 + 1e-6)
    assert np.all(out[1] == 0)


def test_engine_cache_length_defaults_to_the_exported_max_context(tmp_path):
    """`export --max-context N` is the runtime's default cache length (manifest.defaults["max_len"]),
    capped by a board's profile; an explicit max_len still wins."""
    from edgespec.edge import devices
    from edgespec.engine import Engine

    b = export(make_tiny_model(tmp_path / "src"), tmp_path / "b", quant="fp32", max_context=96).path
    assert Bundle.open(b).manifest.defaults == {"max_len": 96}
    eng = Engine.open(b, draft="none", warmup=False)
    assert eng.max_len == eng.target.max_len == 96  # not the 2048 of limits, not the model's 512
    assert Engine.open(b, draft="none", warmup=False, device="generic-x86_64").max_len == 96  # board: 2048
    assert Engine.open(b, draft="none", warmup=False, max_len=200).max_len == 200
    small = devices.get("rpi4")
    small.default_max_len = 64
    assert Engine.open(b, draft="none", warmup=False, device=small).max_len == 64  # the board's cap


def test_parity_runs_each_flavor_on_its_provider_and_says_which(tmp_path, monkeypatch):
    """A cpu-flavored graph is checked on the CPU even where CUDA works (CUDA-first would be refused);
    the cuda flavor on CUDA where this onnxruntime has it. The manifest records where parity ran."""
    import onnxruntime as ort

    from edgespec.edge.providers import CPU, CUDA
    from edgespec_export import parity

    b = Bundle.open(export(make_tiny_model(tmp_path / "src"), tmp_path / "b", quant="fp32").path)
    assert b.target.parity["provider"] == "cpu" and b.target.parity["flavor"] == "cpu"
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    assert parity.parity_providers(b.target) == [CPU]
    cuda_facts = replace(b.target, flavor="cuda", kv_dtype="float16")
    assert parity.parity_providers(cuda_facts) == [CUDA, CPU]
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CPU])
    assert parity.parity_providers(cuda_facts) == [CPU]
