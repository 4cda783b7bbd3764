"""The kernel contract (edgespec/models/kernels.py, kernelcheck.py): every rule refuses a graph that
breaks it, naming the node and the rule; the CPU table agrees with real CPU inference sessions in both
directions; the cuda flavor's graphs pass the CUDA table and the v2 ones (attention_bias wired into
GroupQueryAttention) do not; `verify` refuses such a graph even with every digest recomputed; an old
onnxruntime gets one line naming the release needed."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgespec.models.kernelcheck import check_graph, summarize
from edgespec.models.kernels import CPU, CUDA
from edgespec.models.manifest import file_entry
from tests.helpers.manifests import rewrite_manifest
from tests.helpers.onenode import make_graph, run_cpu

H, KV, D, MAX, S = 4, 2, 16, 8, 2


def _gqa(d: Path, name: str, *, T="float32", heads=H, rotary=0, cos=True, qnorm=False, bias=False, head=D):
    """One GroupQueryAttention over packed q/k/v, a [1, KV, MAX, head] cache, seqlens for 0 cached + S new."""
    width = (heads + 2 * KV) * head
    half = "float32" if T == "bfloat16" else T
    ins = [("q", T, [1, S, width], None), None, None, ("pk", T, [1, KV, MAX, head], None),
           ("pv", T, [1, KV, MAX, head], None), ("sk", "int32", [1], [S - 1]), ("tl", "int32", [], [S])]
    ins += ([("cos", half, [MAX, head // 2], np.ones((MAX, head // 2))),
             ("sin", half, [MAX, head // 2], np.zeros((MAX, head // 2)))] if rotary and cos else [None, None])
    ins += [None, ("ab", T, [1, 1, S, S], None) if bias else None, None, None, None]
    if qnorm:
        ins += [("qn", T, [head], np.ones(head)), ("kn", T, [head], np.ones(head))]
    path = make_graph(d / f"{name}.onnx", "GroupQueryAttention", ins, ["o", "present_k", "present_v"], domain="com.microsoft",
                      num_heads=heads, kv_num_heads=KV, do_rotary=rotary)
    if T == "bfloat16":
        return path, {}  # no numpy bfloat16: the session must fail before any feed is read
    t = np.float16 if T == "float16" else np.float32
    feeds = {"q": np.random.default_rng(0).random((1, S, width)).astype(t),
             "pk": np.zeros((1, KV, MAX, head), t), "pv": np.zeros((1, KV, MAX, head), t)}
    if bias:
        feeds["ab"] = np.zeros((1, 1, S, S), t)
    return path, feeds


def _mnb(d: Path, name: str, *, bits=4, T="float32"):
    K, N, bs = 32, 8, 32
    ins = [("a", T, [1, K], None), ("b", "uint8", [N, 1, bs * bits // 8], np.zeros((N, 1, bs * bits // 8))),
           ("s", T, [N], None if T == "bfloat16" else np.ones(N))]
    path = make_graph(d / f"{name}.onnx", "MatMulNBits", ins, ["y"], domain="com.microsoft", K=K, N=N, bits=bits,
                      block_size=bs)
    return path, ({} if T == "bfloat16" else {"a": np.ones((1, K), np.float32)})


def _gbq(d: Path, name: str, *, bits=8, block=32, axis=1):
    V, E = 4, 32
    ins = [("w", "uint8", [V, E * bits // 8], np.zeros((V, E * bits // 8))), ("i", "int64", [1, 2], None),
           ("s", "float32", [V, max(1, E // block)], np.ones((V, max(1, E // block))))]
    path = make_graph(d / f"{name}.onnx", "GatherBlockQuantized", ins, ["y"], domain="com.microsoft", bits=bits,
                      block_size=block, gather_axis=0, quantize_axis=axis)
    return path, {"i": np.array([[0, 1]], np.int64)}


def _unlisted(d: Path, name: str):
    path = make_graph(d / f"{name}.onnx", "NoSuchKernel", [("x", "float32", [2], None)], ["y"], domain="com.microsoft")
    return path, {"x": np.ones(2, np.float32)}


# rule -> (a graph breaking it, a graph keeping it, what onnxruntime says of the first): the CPU table's
# every kind of rule, each tried on a real CPU session (the refused graph must fail there for that
# reason, the accepted one run)
CPU_CASES = {
    "NoSuchKernel.unlisted": (lambda d: _unlisted(d, "bad"), lambda d: _mnb(d, "good"), "NoSuchKernel"),
    "GroupQueryAttention.query.type": (lambda d: _gqa(d, "bad", T="bfloat16"), lambda d: _gqa(d, "good", T="float16"),
                                       "implementation for GroupQueryAttention"),
    "MatMulNBits.A.type": (lambda d: _mnb(d, "bad", T="bfloat16"), lambda d: _mnb(d, "good"),
                           "implementation for MatMulNBits"),
    "GroupQueryAttention.q_norm_weight.absent": (lambda d: _gqa(d, "bad", qnorm=True), lambda d: _gqa(d, "good", bias=True),
                                                 "q_norm_weight"),
    "MatMulNBits.bits": (lambda d: _mnb(d, "bad", bits=3), lambda d: _mnb(d, "good", bits=2), "2b, 4b and 8b"),
    "GatherBlockQuantized.block_size_pow2": (lambda d: _gbq(d, "bad", block=8), lambda d: _gbq(d, "good", block=16),
                                             "block_size must be a power of 2"),
    "GroupQueryAttention.gqa_heads": (lambda d: _gqa(d, "bad", heads=3), lambda d: _gqa(d, "good", heads=2),
                                      "num_heads must be a multiple of kv_num_heads"),
    "GroupQueryAttention.gqa_rotary": (lambda d: _gqa(d, "bad", rotary=1, cos=False), lambda d: _gqa(d, "good", rotary=1),
                                       "cos_cache"),
    "GroupQueryAttention.gqa_rotary_head": (lambda d: _gqa(d, "bad", rotary=1, head=24),
                                            lambda d: _gqa(d, "good", rotary=1, head=32),
                                            "head_size shall be a multiple of 16"),
}


@pytest.mark.parametrize("rule", sorted(CPU_CASES))
def test_cpu_table_agrees_with_real_sessions(rule, tmp_path):
    bad, good, says = CPU_CASES[rule]
    path, feeds = bad(tmp_path)
    found = check_graph(path, "cpu")
    assert rule in {v.rule for v in found}, found
    assert {v.node for v in found} == {f"/{rule.split('.')[0]}_under_test"}
    err = run_cpu(path, feeds)
    assert err is not None, f"the table refuses {rule} but a CPU session ran it"
    assert says in err, err  # onnxruntime's own reason, the one the rule stands for
    path, feeds = good(tmp_path)
    assert check_graph(path, "cpu") == []
    assert run_cpu(path, feeds) is None


def _name(t: str) -> str:
    t = t.replace("tensor(", "").replace(")", "")
    return {"float": "float32", "double": "float64"}.get(t, t)


def test_every_cpu_row_type_set_is_the_registry_s():
    """The CPU rows' contrib-op input types are what the installed onnxruntime's CPU kernels register
    (a type parameter's registered types, or the schema's fixed type)."""
    from onnxruntime.capi import _pybind_state as C

    registered: dict[tuple[str, str], dict[str, set[str]]] = {}
    for k in C.get_all_opkernel_def():
        if k.provider == "CPUExecutionProvider" and k.domain == "com.microsoft":
            per = registered.setdefault((k.domain, k.op_name), {})
            for param, ts in k.type_constraints.items():
                per.setdefault(param, set()).update(_name(t) for t in ts)
    schemas = {(s.domain, s.name): s for s in C.get_all_operator_schema()}
    for row in CPU:
        if row.domain != "com.microsoft":
            continue
        assert row.key in registered, row.op
        inputs = schemas[row.key].inputs
        for i, name, allowed in row.types:
            assert inputs[i].name == name, (row.op, i, inputs[i].name)
            param = inputs[i].typeStr
            kernel = registered[row.key].get(param, {_name(param)})
            assert set(allowed) <= kernel, (row.op, name, set(allowed) - kernel)


def test_every_row_cites_a_file_and_a_release():
    from onnxruntime.capi import _pybind_state as C

    schemas = {(s.domain, s.name): s for s in C.get_all_operator_schema()}
    for row in CPU + CUDA:
        assert row.source.startswith("onnxruntime/"), row
        assert row.read_from, row
        for i, name, *_ in row.types + row.absent:  # the input indices are the operator schema's
            assert schemas[row.key].inputs[i].name == name, (row.op, i, name)


# --- the CUDA table: the rules the sources give, on graphs built to break them -------------------------
CUDA_CASES = {
    "GroupQueryAttention.attention_bias.absent": lambda d: _gqa(d, "x", T="float16", bias=True),
    "GroupQueryAttention.query.type": lambda d: _gqa(d, "x"),
    "GroupQueryAttention.gqa_head_size": lambda d: _gqa(d, "x", T="float16", head=12),
    "MatMulNBits.bits": lambda d: _mnb(d, "x", bits=2, T="float16"),
    "GatherBlockQuantized.gbq_last_axis": lambda d: _gbq(d, "x", axis=0),
    "NoSuchKernel.unlisted": lambda d: _unlisted(d, "x"),
    "GroupQueryAttention.gqa_rotary_head": lambda d: _gqa(d, "x", T="float16", rotary=1, head=24),
    "SimplifiedLayerNormalization.X.type": lambda d: (make_graph(
        d / "x.onnx", "SimplifiedLayerNormalization", [("x", "bfloat16", [1, 8], None), ("w", "float32", [8], None)],
        ["y"]), {}),
}


def _gbq_through_reshape(d: Path, name: str, *, axis: int | None) -> Path:
    """The builder's tied embedding: the lm_head's [V, blocks, blob] data Reshaped by a Constant to
    [V, E] before GatherBlockQuantized (quantize_axis unset when axis is None)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    V, E = 4, 32
    w = numpy_helper.from_array(np.zeros((V, 1, E), np.uint8), "w3")
    s = numpy_helper.from_array(np.ones((V, 1), np.float16), "s")
    shape = helper.make_node("Constant", [], ["shape"], name="/Shape2d",
                             value=numpy_helper.from_array(np.array([V, E], np.int64), "shape_v"))
    reshape = helper.make_node("Reshape", ["w3", "shape"], ["w2"], name="/Reshape")
    attrs = {} if axis is None else {"quantize_axis": axis}
    gbq = helper.make_node("GatherBlockQuantized", ["w2", "i", "s"], ["y"], name="/GatherBlockQuantized_under_test",
                           domain="com.microsoft", bits=8, block_size=32, gather_axis=0, **attrs)
    g = helper.make_graph([shape, reshape, gbq], "g", [helper.make_tensor_value_info("i", TensorProto.INT64, [1, 2])],
                          [onnx.ValueInfoProto(name="y")], initializer=[w, s])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    onnx.save(m, str(d / f"{name}.onnx"))
    return d / f"{name}.onnx"


def test_gbq_axis_is_read_through_the_reshape_with_cuda_s_default(tmp_path):
    """CUDA's GatherBlockQuantized defaults quantize_axis to 0 and enforces the last axis of the data it
    receives: a Reshape's target rank, not the initializer's."""
    found = check_graph(_gbq_through_reshape(tmp_path, "unset", axis=None), "cuda")
    assert [v.rule for v in found] == ["GatherBlockQuantized.gbq_last_axis"]
    assert "quantize_axis 0 (unset: the CUDA kernel's default is 0)" in found[0].detail and "rank 2" in found[0].detail
    assert [v.rule for v in check_graph(_gbq_through_reshape(tmp_path, "axis2", axis=2), "cuda")] == [
        "GatherBlockQuantized.gbq_last_axis"]  # the initializer's last axis, not the data's
    assert check_graph(_gbq_through_reshape(tmp_path, "ok", axis=1), "cuda") == []


def test_simplified_layer_norm_row_cites_the_contrib_registration():
    row = next(r for r in CUDA if r.op == "SimplifiedLayerNormalization")
    assert row.source == "onnxruntime/contrib_ops/cuda/layer_norm.cc" and "bfloat16" not in row.types[0][2]


@pytest.mark.parametrize("rule", sorted(CUDA_CASES))
def test_cuda_rule_refuses_naming_node_and_rule(rule, tmp_path):
    path, _ = CUDA_CASES[rule](tmp_path)
    lines = summarize(check_graph(path, "cuda"), "cuda")
    line = next((ln for ln in lines if f"rule {rule}:" in ln), None)
    assert line is not None, lines
    assert line.startswith("node /") and "_under_test" in line


def test_cuda_accepts_a_float16_gqa_without_bias(tmp_path):
    path, _ = _gqa(tmp_path, "ok", T="float16", rotary=1)
    assert [v.rule for v in check_graph(path, "cuda") if not v.rule.endswith("gqa_shared_cache")] == []


def test_shared_cache_rule(tmp_path):
    """The cache must be a graph input and output pair of one shape family (bound to one buffer)."""
    path, _ = _gqa(tmp_path, "ok", T="float16")
    assert [v.rule for v in check_graph(path, "cuda")] == ["GroupQueryAttention.gqa_shared_cache"]  # outputs untyped


# --- the cuda flavor's real graphs ------------------------------------------------------------------
def _wire_bias(graph: Path) -> None:
    """What a format-2 cuda graph had: attention_bias, a graph input, wired into every GQA's input 10."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.load(str(graph), load_external_data=False)
    for n in m.graph.node:
        if n.op_type == "GroupQueryAttention":
            n.input[10] = "attention_bias"
    m.graph.input.append(helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT16, ["b", "h", "s", "t"]))
    onnx.save(m, str(graph))


def test_v3_cuda_graph_passes_the_cuda_table_and_v2_one_is_refused(tiny_cuda_bundle, tmp_path):
    graph = tiny_cuda_bundle / json.loads((tiny_cuda_bundle / "manifest.json").read_text())["models"]["target"]["path"]
    assert check_graph(graph, "cuda") == []
    old = tmp_path / "model.onnx"
    shutil.copy(graph, old)
    _wire_bias(old)
    found = check_graph(old, "cuda")
    assert {v.rule for v in found} == {"GroupQueryAttention.attention_bias.absent"}
    assert len(found) == 2 and found[0].node == "/model/layers.0/attn/GroupQueryAttention"


def test_cuda_manifest_has_no_attention_bias(tiny_cuda_bundle, tiny_both_flavors_bundle):
    from edgespec.models.bundle import Bundle

    assert Bundle.open(tiny_cuda_bundle).target.attention_bias is None
    graphs = Bundle.open(tiny_both_flavors_bundle).target.graphs()
    assert graphs["cpu"].attention_bias == "attention_bias" and graphs["cuda"].attention_bias is None


def test_verify_refuses_bias_wired_cuda_graph_with_recomputed_digests(tiny_cuda_bundle, bundle_copy):
    from edgespec.cli.commands.verify import check

    b = bundle_copy(tiny_cuda_bundle)
    rel = json.loads((b / "manifest.json").read_text())["models"]["target"]["path"]
    _wire_bias(b / rel)
    rewrite_manifest(b, lambda d: d["files"].__setitem__(rel, file_entry(b / rel)))  # digests recomputed
    _, problems = check(b)
    assert problems, "verify passed a cuda graph with attention_bias wired into GroupQueryAttention"
    assert not any("sha256" in p or "digest" in p for p in problems), problems
    assert any("node /model/layers.0/attn/GroupQueryAttention" in p and
               "rule GroupQueryAttention.attention_bias.absent" in p for p in problems), problems


def test_format2_cuda_bundle_refused_with_reexport(tiny_cuda_bundle, bundle_copy):
    from edgespec.errors import BundleCorrupt
    from edgespec.models.bundle import Bundle

    b = bundle_copy(tiny_cuda_bundle)
    rewrite_manifest(b, lambda d: d.__setitem__("format_version", 2))
    with pytest.raises(BundleCorrupt) as e:
        Bundle.open(b)
    assert "re-export the bundle" in str(e.value) and "cuda-flavored" in str(e.value)


def test_format2_cpu_bundle_still_loads(tiny_bundle, bundle_copy):
    from edgespec.models.bundle import Bundle

    b = bundle_copy(tiny_bundle)
    rewrite_manifest(b, lambda d: d.__setitem__("format_version", 2))
    bundle = Bundle.open(b)
    assert bundle.manifest.format_version == 2 and bundle.target.attention_bias == "attention_bias"


def test_export_check_refuses_naming_node_and_rule(tiny_cuda_bundle, tmp_path):
    from edgespec.errors import ExportError
    from edgespec_export.contract import check_kernels

    graph = tmp_path / "model.onnx"
    shutil.copy(tiny_cuda_bundle / "target" / "model.onnx", graph)
    check_kernels(graph, "cuda", "target")  # the fixed graph passes
    _wire_bias(graph)
    with pytest.raises(ExportError, match=r"node /model/layers\.0/attn/GroupQueryAttention .*"
                                          r"rule GroupQueryAttention\.attention_bias\.absent"):
        check_kernels(graph, "cuda", "target")


# --- the runtime side of contract v3 -------------------------------------------------------------------
def test_runner_binds_no_bias_on_a_cuda_graph(tiny_cuda_bundle):
    from edgespec.engine.build import load_runner
    from edgespec.models.bundle import Bundle

    bundle = Bundle.open(tiny_cuda_bundle)
    runner = load_runner(bundle.model_path("target"), bundle.target, max_len=16, force_flavor=True)
    assert (runner.runner.bind_positions, runner.runner.bind_bias, runner.supports_tree) == (True, False, False)
    out = runner.step([1, 2, 3], n_logits=3)
    assert out.shape == (3, bundle.target.vocab_size) and np.isfinite(out).all()


# --- doctor: what TensorRT would take (the onnxruntime floor: tests/models/test_floor.py) ----------------------
def test_doctor_says_which_nodes_tensorrt_would_take(tiny_both_flavors_bundle):
    from edgespec.edge.doctor import render, tensorrt_report

    rows = tensorrt_report(tiny_both_flavors_bundle)
    assert {(r["role"], r["flavor"]) for r in rows} == {("target", "cpu"), ("target", "cuda"), ("draft", "cpu"),
                                                        ("draft", "cuda")}
    cuda = next(r for r in rows if r["role"] == "target" and r["flavor"] == "cuda")
    assert cuda["not_tensorrt"]["GroupQueryAttention"] == 2 and cuda["not_tensorrt"]["MatMulNBits"] == 11
    assert "GroupQueryAttention" not in cuda["tensorrt"] and cuda["tensorrt"]["Mul"] >= 1
    text = render({**_report_stub(), "tensorrt_nodes": rows})
    assert "target/model.cuda.onnx (cuda): TensorRT would take" in text and "GroupQueryAttention x2" in text


def _report_stub() -> dict:
    from edgespec.edge.doctor import collect

    return collect(probe=False)


def test_a_current_cuda_export_has_positions_and_no_bias(tiny_cuda_bundle):
    import onnx

    m = json.loads((tiny_cuda_bundle / "manifest.json").read_text())
    assert m["format_version"] == 3
    for facts in m["models"].values():
        assert facts["position_ids"] == "position_ids" and facts["attention_bias"] is None
        g = onnx.load(str(tiny_cuda_bundle / facts["path"]), load_external_data=False).graph
        assert {i.name for i in g.input} >= {"position_ids"} and "attention_bias" not in {i.name for i in g.input}
        gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
        assert gqa and all(n.input[9] == "position_ids" and n.input[10] == "" for n in gqa)


def test_tree_on_with_a_cuda_graph_is_one_line(tiny_cuda_bundle):
    from edgespec.engine.engine import Engine
    from edgespec.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="cuda-flavored graph has no attention_bias") as e:
        Engine.open(tiny_cuda_bundle, max_len=64, warmup=False, tree="on")
    assert "\n" not in str(e.value)


def test_each_table_has_one_row_per_op():
    for rows in (CPU, CUDA):
        keys = [r.key for r in rows]
        assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_format1_cuda_bundle_is_not_told_to_reexport_for_a_bias_it_never_had(tiny_cuda_bundle, bundle_copy):
    from edgespec.models.bundlecheck import verify_bundle

    b = bundle_copy(tiny_cuda_bundle)
    rewrite_manifest(b, lambda d: d.__setitem__("format_version", 1))
    manifest, problems = verify_bundle(b)
    # the tiny graph is contract v3: it takes position_ids, which a format-1 manifest cannot name (a
    # real format-1 graph has neither input); that is said, and nothing about an attention_bias
    assert manifest.format_version == 1 and all("attention_bias" not in p and "cuda-flavored" not in p
                                                for p in problems), problems
