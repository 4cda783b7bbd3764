"""The memory-bandwidth bound (bench/bound.py): the bytes a step reads, counted exactly from a tiny
hand-made graph's initializers, the bandwidth arithmetic on a fake clock, and the printed lines."""
from __future__ import annotations

import pytest

from edgespec.bench import bound

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

V, H, F, BLK, P = 64, 32, 48, 16, 128  # vocabulary, hidden, ffn width, quantization block, positions


def _init(name, dtype, dims):
    import numpy as np

    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    return helper.make_tensor(name, dtype, dims, np.zeros(dims, dtype=np_type).tobytes(), raw=True)


def _nbits(name, x, out, n, k, zero_points=False):
    """A MatMulNBits node [K] -> [N] with 4-bit weights [N, K/BLK, BLK/2] and scales [N * K/BLK]."""
    inits = [_init(f"{name}.B", TensorProto.UINT8, [n, k // BLK, BLK // 2]),
             _init(f"{name}.scales", TensorProto.FLOAT, [n * (k // BLK)])]
    inputs = [x, f"{name}.B", f"{name}.scales"]
    if zero_points:
        inits.append(_init(f"{name}.zp", TensorProto.UINT8, [n, (k // BLK + 1) // 2]))
        inputs.append(f"{name}.zp")
    node = helper.make_node("MatMulNBits", inputs, [out], name=name, domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=BLK, accuracy_level=4)
    return node, inits


def _graph(path, tied: bool):
    nodes, inits = [], []
    if tied:  # the embedding gathers rows of the lm_head's tensor, through a Reshape
        nodes.append(helper.make_node("Reshape", ["lm_head.B", "emb_shape"], ["emb_q"]))
        inits.append(helper.make_tensor("emb_shape", TensorProto.INT64, [2], [V, H // 2]))
        nodes.append(helper.make_node("GatherBlockQuantized", ["emb_q", "ids", "lm_head.scales"], ["x0"],
                                      domain="com.microsoft", bits=4, block_size=BLK, gather_axis=0, quantize_axis=1))
    else:
        inits.append(_init("embed", TensorProto.FLOAT, [V, H]))
        nodes.append(helper.make_node("Gather", ["embed", "ids"], ["x0"], axis=0))
    # attention reads one row of its rotary caches [positions, head_dim / 2] per token
    inits += [_init("cos", TensorProto.FLOAT, [P, 4]), _init("sin", TensorProto.FLOAT, [P, 4])]
    nodes.append(helper.make_node("GroupQueryAttention", ["x0", "", "", "", "", "lens", "total", "cos", "sin"], ["att"],
                                  domain="com.microsoft", num_heads=1, kv_num_heads=1))
    inits.append(_init("norm.weight", TensorProto.FLOAT, [H]))
    nodes.append(helper.make_node("SimplifiedLayerNormalization", ["x0", "norm.weight"], ["x1"], domain=""))
    for name, x, out, n, k, zp in (("up", "x1", "x2", F, H, True), ("down", "x2", "x3", H, F, False),
                                   ("lm_head", "x3", "logits", V, H, False)):
        node, more = _nbits(name, x, out, n, k, zp)
        nodes.append(node)
        inits += more
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "S"])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "S", V])], inits)
    onnx.save(helper.make_model(g), str(path))
    return path


def test_step_bytes_are_counted_exactly_from_the_initializers(tmp_path):
    b = bound.step_bytes(_graph(tmp_path / "m.onnx", tied=False), tokens=3, kv_per_position=100)
    blocks_up, blocks_down, blocks_head = H // BLK, F // BLK, H // BLK
    assert b.weights == F * blocks_up * BLK // 2 + H * blocks_down * BLK // 2  # 4-bit: BLK/2 bytes a block
    assert b.scales == 4 * (F * blocks_up + H * blocks_down) + F * ((blocks_up + 1) // 2)  # + up's zero points
    assert b.lm_head == V * blocks_head * BLK // 2 + 4 * V * blocks_head
    # 3 tokens, one float32 row each, not the whole [V, H] table; and one row of cos and of sin each
    assert b.embedding_rows == 3 * H * 4 + 3 * 2 * 4 * 4
    assert b.other == 4 * H  # the norm's weight
    assert b.total(context=10) == b.fixed + 1000


def test_a_tied_embedding_is_read_whole_by_the_lm_head_and_counted_once(tmp_path):
    b = bound.step_bytes(_graph(tmp_path / "m.onnx", tied=True), tokens=1)
    assert b.lm_head == V * (H // BLK) * BLK // 2 + 4 * V * (H // BLK)
    assert b.embedding_rows == 2 * 4 * 4  # the gather reads the lm_head's tensor, already counted whole
    assert b.other == 4 * H + 8 * 2  # the norm's weight and the Reshape's int64 shape


def test_step_bytes_refuses_zero_tokens(tmp_path):
    with pytest.raises(ValueError, match="tokens must be at least 1, got 0"):
        bound.step_bytes(_graph(tmp_path / "m.onnx", tied=False), tokens=0)


def test_read_bandwidth_is_bytes_over_the_best_pass(monkeypatch):
    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 3.0])  # passes of 0.5, 0.25 and 1.0 s
    monkeypatch.setattr(bound.time, "perf_counter", lambda: next(ticks))
    assert bound.read_bandwidth(threads=2, nbytes=1 << 20, passes=3) == pytest.approx((1 << 20) / 0.25)


def test_format_bound_puts_each_step_beside_its_bound():
    one = {"weights": 800_000_000, "scales": 100_000_000, "lm_head": 90_000_000, "embedding_rows": 6_000,
           "other": 4_000_000, "kv_per_position": 10_000, "tokens": 1}
    rep = bound.bound_report([bound.ModelBound("target", "target/model.onnx", one, context=600,
                                               measured_s={1: 0.05, 4: 0.08})], bandwidth=20e9, threads=2)
    text = bound.format_bound(rep)
    # 1 token: 994.006 MB + 6 MB KV = 1000.006 MB at 20 GB/s = 50.0 ms -> 1.00x
    assert "1-token step:   50.0 ms measured, bound  50.0 ms (1000 MB): 1.00x the bound" in text
    # 4 tokens: three more 6 kB embedding rows; 80 ms / 50.0 ms
    assert "4-token step:   80.0 ms measured, bound  50.0 ms (1000 MB): 1.60x the bound" in text
    assert "20.0 GB/s with 2 thread(s)" in text
    assert "its GGUF" not in text  # no source GGUF recorded: no line


def test_format_bound_puts_the_source_ggufs_bytes_beside_the_graphs():
    """A bundle exported from a GGUF records that file's bytes a step (every tensor but the token
    embedding: the manifest's quant_map); the bound prints them beside the graph's, as a ratio."""
    one = {"weights": 800_000_000, "scales": 100_000_000, "lm_head": 90_000_000, "embedding_rows": 6_000,
           "other": 10_000_000, "kv_per_position": 10_000, "tokens": 1}
    extra = {"quant_map": {"target": {"gguf_bytes_per_token": 800_000_000}, "draft": {"exporter": "torch"}}}
    assert bound.source_bytes(extra, "target") == 800_000_000 and bound.source_bytes(extra, "draft") is None
    assert bound.source_bytes({}, "target") is None
    m = bound.ModelBound("target", "target/model.onnx", one, context=600, measured_s={1: 0.05},
                         source_bytes=bound.source_bytes(extra, "target"))
    text = bound.format_bound(bound.bound_report([m], bandwidth=20e9, threads=2))
    # the graph's 1,000 MB (its embedding rows aside) against the GGUF's 800 MB
    assert "its GGUF reads 800 MB a step (every tensor but the token embedding); the graph 1000 MB: 1.25x" in text


def test_the_bench_prints_the_bound_of_both_graphs_beside_its_steps(tiny_bundle, tmp_path, capsys):
    import json

    from edgespec.cli.main import main
    from edgespec.models.bundle import Bundle

    out_json = tmp_path / "run.json"
    assert main(["bench", str(tiny_bundle), "--prompts", "code", "--limit", "1", "--repeats", "1",
                 "--max-new-tokens", "8", "--modes", "target,model", "--project", "none", "--quiet",
                 "--threads", "1", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "memory-bandwidth bound: streaming read" in out and "with 1 thread(s)" in out
    assert "  target: " in out and "  draft: " in out and "1-token step:" in out
    saved = json.loads(out_json.read_text())["meta"]["bound"]
    b = Bundle.open(tiny_bundle, verify=False)
    for m in saved["models"]:
        expect = bound.step_bytes(b.model_path(m["role"]), kv_per_position=b.manifest.models[m["role"]].kv_bytes_per_token())
        assert m["bytes"]["weights"] + m["bytes"]["lm_head"] + m["bytes"]["other"] == \
            expect.weights + expect.lm_head + expect.other
    assert main(["bench", str(out_json), "--project", "none"]) == 0  # a saved run prints its bound again
    assert "memory-bandwidth bound" in capsys.readouterr().out
