"""Weight-only quantization of the builder's graph, one weight at a time.

The builder's own pass (`to_nbits`) serialises the whole float graph to a protobuf and quantizes that
copy, so for a moment the float weights exist twice (torch + protobuf): that is most of the 16.9 GB
peak measured exporting the 1.5B. Here each MatMul/Gather weight is serialised alone, quantized with
onnxruntime's own kernels (the same `DefaultWeightOnlyQuantizer` the builder uses, so the bytes are
identical), spliced back into the in-memory `onnx_ir` graph, and the float tensor is dropped. The
float weights then exist once, and shrink as the pass goes.

Shapes: a MatMul weight B [K, N] becomes MatMulNBits B_q [N, ceil(K/block), block*bits/8] uint8 +
scales [N, ceil(K/block)] (+ zero points when asymmetric). An embedding [V, H] quantized along H becomes
GatherBlockQuantized data [V, H*bits/8] + scales [V, ceil(H/block)].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

WEIGHT_INPUT = {"MatMul": 1, "Gather": 0}


@dataclass
class QuantSettings:
    bits: int  # 4 or 8
    block_size: int
    accuracy_level: int
    symmetric: bool = True
    op_types: tuple[str, ...] = ("MatMul", "Gather")
    exclude: tuple[str, ...] = ()  # node names left in float


def quantizable_nodes(graph, settings: QuantSettings) -> list:
    """Nodes whose weight input is a float initializer used by that node alone."""
    import onnx_ir as ir

    floats = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
    out = []
    for node in graph:
        if node.domain not in ("", "ai.onnx") or node.op_type not in settings.op_types:
            continue
        if node.name in settings.exclude:
            continue
        if node.op_type == "Gather" and settings.bits != 4:
            continue  # GatherBlockQuantized is 4-bit only in onnxruntime's quantizer
        w = node.inputs[WEIGHT_INPUT[node.op_type]]
        if w is None or not w.is_initializer() or w.const_value is None or w.const_value.dtype not in floats:
            continue
        if len(w.const_value.shape) != 2 or len(w.uses()) != 1:
            continue
        out.append(node)
    return out


def quantize_graph(model, settings: QuantSettings, on_tensor: Callable[[str], None] | None = None) -> int:
    """Quantizes `model` (an onnx_ir.Model) in place; returns the number of weights quantized.

    Values that the builder already wired to a quantized weight's future name (the tied embedding's
    GatherBlockQuantized reads `lm_head.MatMul.weight_Q4` / `_scales`) are bound to the new
    initializers, so the tied embedding and the lm_head share one int4 tensor."""
    import numpy as np
    import onnx
    import onnx_ir as ir
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )
    from onnxruntime.quantization.quant_utils import QuantFormat

    config = DefaultWeightOnlyQuantConfig(
        block_size=settings.block_size,
        is_symmetric=settings.symmetric,
        accuracy_level=settings.accuracy_level,
        quant_format=QuantFormat.QOperator,
        op_types_to_quantize=tuple(settings.op_types),
        bits=settings.bits,
    )
    quantizer = DefaultWeightOnlyQuantizer(config)
    graph = model.graph
    dangling = _dangling_inputs(graph)
    count = 0
    for node in quantizable_nodes(graph, settings):
        w = node.inputs[WEIGHT_INPUT[node.op_type]]
        mini = onnx.helper.make_graph([], "one_weight", [], [], initializer=[ir.serde.serialize_tensor(w.const_value)])
        node_proto = ir.serde.serialize_node(node)
        with np.errstate(divide="ignore", invalid="ignore"):  # all-zero blocks (padding rows): 0/0, masked
            new_protos = quantizer.quantize(node_proto, [mini])
        if len(new_protos) == 1 and new_protos[0] is node_proto:
            continue  # the quantizer declined (shape or dtype it does not handle)
        by_name = {v.name: v for v in node.inputs if v is not None}
        for t in mini.initializer:
            if t.name == w.name:
                continue
            value = dangling.pop(t.name, None) or ir.Value(name=t.name)
            value.const_value = ir.serde.deserialize_tensor(t)
            value.type = ir.TensorType(value.const_value.dtype)
            value.shape = value.const_value.shape
            graph.register_initializer(value)
            by_name[t.name] = value
        del mini
        if len(new_protos) != 1:
            raise RuntimeError(f"quantizing {node.name} gave {len(new_protos)} nodes, expected 1")
        proto = new_protos[0]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}
        new = ir.Node(
            proto.domain,
            proto.op_type,
            inputs=[by_name[i] if i else None for i in proto.input],
            attributes=ir.convenience.convert_attributes(attrs),
            name=proto.name or node.name,
            num_outputs=1,
        )
        old_out = node.outputs[0]
        ir.convenience.replace_nodes_and_values(
            graph, insertion_point=node, old_nodes=[node], new_nodes=[new], old_values=[old_out], new_values=new.outputs
        )
        graph.initializers.pop(w.name)
        w.const_value = None  # drop the float tensor now, not when the graph goes
        count += 1
        if on_tensor is not None:
            on_tensor(node.name)
    if count:
        _set_opsets(model)
    return count


def _dangling_inputs(graph) -> dict:
    """Values that nodes read but nothing produces and no initializer or graph input provides."""
    graph_inputs = {id(v) for v in graph.inputs}
    out = {}
    for node in graph:
        for v in node.inputs:
            if v is None or v.producer() is not None or v.is_initializer() or id(v) in graph_inputs:
                continue
            out[v.name] = v
    return out


def _set_opsets(model) -> None:
    """MatMulNBits/GatherBlockQuantized live in com.microsoft; int4 tensors need opset 21 / IR 10."""
    model.opset_imports.setdefault("com.microsoft", 1)
    if model.opset_imports.get("", 0) < 21:
        model.opset_imports[""] = 21
    if model.ir_version < 10:
        model.ir_version = 10
