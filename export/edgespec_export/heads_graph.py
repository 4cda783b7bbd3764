"""The draft heads' ONNX graph (`heads/model.onnx`) and the target lm_head rows it shares.

Medusa heads (Cai et al. 2024, "Medusa"): head i maps the target's final hidden state h at position
t to r_i = h + SiLU(W_i h + b_i), and scores the token at t + 2 + i with the target's own lm_head
(the target itself predicts t + 1 from h). Here the lm_head is the target's, restricted to a kept
vocabulary (the draft-vocab machinery, prune_vocab.choose_kept): its rows are copied from the
exported target graph as they are stored there (float32 MatMul columns, or MatMulNBits rows with
their scales), so a quantized target's heads are quantized the same way and the float rows the
training uses are the very values the graph computes with.

Graph: `hidden` float32 [R, H] -> `logits` [R, n_heads, N] (float32), N = kept tokens; logits row
j of head i scores token vocab_map[j]. The n residual blocks are one MatMul [H, n*H].
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

HEADS_INPUT = "hidden"
HEADS_OUTPUT = "logits"
FEATURE_TOKEN = "token"  # the feature graph's second input and its feature output
FEATURE_OUTPUT = "feature"
EPS = 1e-6  # feature.EPS (the rms norms)


def _load_head(model_path: Path) -> tuple[object, dict]:
    """The target graph's lm_head node and its initializers, with only the lm_head's weights read
    from the external data file (the whole 1.5B graph would be 1.2 GB in protobuf objects)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    from .prune_vocab import read_external

    g = onnx.load(str(model_path), load_external_data=False).graph
    heads = [n for n in g.node if "logits" in n.output or "/edgespec/logits_fp16" in n.output]
    head = next((n for n in heads if n.op_type in ("MatMul", "MatMulNBits")), None)
    if head is None:
        raise ValueError("the target graph has no MatMul/MatMulNBits lm_head producing its logits")
    inits = {t.name: t for t in g.initializer if t.name in set(head.input)}
    for t in inits.values():
        if uses_external_data(t):
            read_external(t, Path(model_path).parent)
    return head, inits


def lm_head_rows(model_path: Path, kept: np.ndarray) -> np.ndarray:
    """The target lm_head's rows for the kept token ids, dequantized: float32 [len(kept), H].
    logits[..., kept[j]] = hidden @ rows[j] (plus a bias, which the builder's lm_heads have not)."""
    from onnx import numpy_helper

    head, inits = _load_head(model_path)

    def w(slot: int) -> np.ndarray | None:
        if len(head.input) <= slot or not head.input[slot]:
            return None
        if head.input[slot] not in inits:
            raise ValueError(f"the lm_head's input {head.input[slot]!r} is not a weight of the graph")
        return numpy_helper.to_array(inits[head.input[slot]])

    kept = np.asarray(kept, dtype=np.int64)
    if head.op_type == "MatMul":
        return np.ascontiguousarray(w(1)[:, kept].T.astype(np.float32))
    attrs = {a.name: a for a in head.attribute}
    n, k, bits, block = attrs["N"].i, attrs["K"].i, attrs["bits"].i, attrs["block_size"].i
    q = w(1)[kept]  # [n_kept, blocks, blob] uint8
    if bits == 4:
        q = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(q.shape[0], q.shape[1], -1)
    elif bits != 8:
        raise ValueError(f"a {bits}-bit lm_head is not supported by --heads")
    blocks = q.shape[1]
    scales = w(2).reshape(n, blocks)[kept].astype(np.float32)
    zp = w(3)
    if zp is None:
        zero = np.full((kept.size, blocks), 2 ** (bits - 1), dtype=np.float32)
    elif bits == 8:
        zero = zp.reshape(n, blocks)[kept].astype(np.float32)
    else:
        z = zp.reshape(n, -1)[kept]
        zero = np.stack([z & 0x0F, z >> 4], axis=-1).reshape(kept.size, -1)[:, :blocks].astype(np.float32)
    vals = (q.astype(np.float32) - zero[:, :, None]) * scales[:, :, None]
    assert vals.shape[2] == block
    return np.ascontiguousarray(vals.reshape(kept.size, -1)[:, :k])


def write_heads_graph(path: Path, target_path: Path, kept: np.ndarray, w: np.ndarray, b: np.ndarray) -> None:
    """Writes the heads graph: w [n, H, H] (r_i = h + SiLU(h @ w[i] + b[i])), b [n, H], and the
    target lm_head's kept rows in the target's own storage (float32 columns or MatMulNBits rows)."""
    from onnx import TensorProto, helper, numpy_helper

    n, hidden = w.shape[0], w.shape[1]
    head, inits = _load_head(target_path)
    kept = np.asarray(kept, dtype=np.int64)
    init = [
        numpy_helper.from_array(np.ascontiguousarray(w.transpose(1, 0, 2).reshape(hidden, n * hidden), dtype=np.float32), "heads.w"),
        numpy_helper.from_array(np.ascontiguousarray(b.reshape(n * hidden), dtype=np.float32), "heads.b"),
        numpy_helper.from_array(np.array([0, n, hidden], dtype=np.int64), "heads.shape"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "heads.axis1"),
    ]
    nodes = [
        helper.make_node("MatMul", [HEADS_INPUT, "heads.w"], ["z0"]),
        helper.make_node("Add", ["z0", "heads.b"], ["z1"]),
        helper.make_node("Reshape", ["z1", "heads.shape"], ["z"]),  # [R, n, H]
        helper.make_node("Sigmoid", ["z"], ["sz"]),
        helper.make_node("Mul", ["z", "sz"], ["silu"]),
        helper.make_node("Unsqueeze", [HEADS_INPUT, "heads.axis1"], ["h3"]),
        helper.make_node("Add", ["h3", "silu"], ["r"]),  # [R, n, H] float32
    ]
    i2, n2 = lm_head_nodes(head, inits, kept, "r", HEADS_OUTPUT)
    init += i2
    nodes += n2
    _save(path, "edgespec_medusa_heads", nodes, init,
          [helper.make_tensor_value_info(HEADS_INPUT, TensorProto.FLOAT, ["rows", hidden])],
          [helper.make_tensor_value_info(HEADS_OUTPUT, TensorProto.FLOAT, ["rows", n, int(kept.size)])])


def _save(path: Path, name: str, nodes: list, init: list, inputs: list, outputs: list) -> None:
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, name, inputs, outputs, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = min(model.ir_version, 9)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))


def write_feature_graph(path: Path, target_path: Path, kept: np.ndarray, P: dict[str, np.ndarray]) -> None:
    """Writes the feature drafter's graph (feature.py; its numpy twin is feature.feature_step):
    `hidden` float32 [1, H] + `token` int64 [1] (kept index, N = UNK) -> `feature` float32 [1, H]
    + `logits` float32 [1, N]; P holds feature.PARAMS (float32), the lm_head rows are the target's."""
    from onnx import TensorProto, helper, numpy_helper

    head, inits = _load_head(target_path)
    kept = np.asarray(kept, dtype=np.int64)
    H, N = P["w_f"].shape[0], int(kept.size)
    init = [numpy_helper.from_array(np.ascontiguousarray(P[k], dtype=np.float32), f"feature.{k}") for k in P]
    init += [numpy_helper.from_array(np.array([EPS], np.float32), "feature.eps")]

    def rms(x: str, out: str) -> list:
        return [helper.make_node("Mul", [x, x], [f"{out}.sq"]),
                helper.make_node("ReduceMean", [f"{out}.sq"], [f"{out}.ms"], axes=[-1], keepdims=1),
                helper.make_node("Add", [f"{out}.ms", "feature.eps"], [f"{out}.mse"]),
                helper.make_node("Sqrt", [f"{out}.mse"], [f"{out}.rt"]),
                helper.make_node("Div", [x, f"{out}.rt"], [out])]

    nodes = [
        helper.make_node("MatMul", [HEADS_INPUT, "feature.w_f"], ["zf"]),
        helper.make_node("Gather", ["feature.table", FEATURE_TOKEN], ["ze"], axis=0),
        helper.make_node("Add", ["zf", "ze"], ["z"]),
        *rms("z", "n"),
        helper.make_node("MatMul", ["n", "feature.w_g"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["sa"]),
        helper.make_node("Mul", ["a", "sa"], ["silu"]),
        helper.make_node("MatMul", ["n", "feature.w_u"], ["u"]),
        helper.make_node("Mul", ["silu", "u"], ["act"]),
        helper.make_node("MatMul", ["act", "feature.w_d"], ["d"]),
        helper.make_node("Add", ["z", "d"], ["z2"]),
        *rms("z2", "n2"),
        helper.make_node("Mul", ["n2", "feature.g"], [FEATURE_OUTPUT]),
    ]
    i2, n2 = lm_head_nodes(head, inits, kept, FEATURE_OUTPUT, HEADS_OUTPUT)
    _save(path, "edgespec_feature_drafter", nodes + n2, init + i2,
          [helper.make_tensor_value_info(HEADS_INPUT, TensorProto.FLOAT, [1, H]),
           helper.make_tensor_value_info(FEATURE_TOKEN, TensorProto.INT64, [1])],
          [helper.make_tensor_value_info(FEATURE_OUTPUT, TensorProto.FLOAT, [1, H]),
           helper.make_tensor_value_info(HEADS_OUTPUT, TensorProto.FLOAT, [1, N])])


def lm_head_nodes(head, inits: dict, kept: np.ndarray, src: str, out: str) -> tuple[list, list]:
    """(initializers, nodes) of the target lm_head restricted to the kept rows, reading float32 `src`
    [..., H] into `out` [..., N]: in the target's own storage (float32 MatMul columns, or
    MatMulNBits rows with their scales, as float32)."""
    from onnx import helper, numpy_helper

    init, nodes = [], []
    if head.op_type == "MatMul":
        rows = numpy_helper.to_array(inits[head.input[1]])[:, kept].astype(np.float32)
        init.append(numpy_helper.from_array(np.ascontiguousarray(rows), "lm_head.w"))
        nodes.append(helper.make_node("MatMul", [src, "lm_head.w"], [out]))
    else:
        attrs = {a.name: helper.get_attribute_value(a) for a in head.attribute}
        N = attrs["N"]
        ins = [src]
        for slot, name in ((1, "lm_head.q"), (2, "lm_head.scales"), (3, "lm_head.zp")):
            if len(head.input) <= slot or not head.input[slot]:
                break
            arr = numpy_helper.to_array(inits[head.input[slot]])
            part = arr[kept] if slot == 1 else arr.reshape(N, -1)[kept].reshape((kept.size, *arr.shape[1:]) if arr.ndim > 1 else (-1,))
            if slot == 2:
                part = part.astype(np.float32)  # the heads compute in float32 (a float16 target's scales)
            init.append(numpy_helper.from_array(np.ascontiguousarray(part), name))
            ins.append(name)
        attrs["N"] = int(kept.size)
        nodes.append(helper.make_node("MatMulNBits", ins, [out], domain="com.microsoft", **attrs))
    return init, nodes
