"""Weight-only quantization of the builder's graph, one weight at a time.

The builder's own pass (`to_nbits`) serialises the whole float graph to a protobuf and quantizes that
copy, so for a moment the float weights exist twice (torch + protobuf): that is most of the 16.9 GB
peak measured exporting the 1.5B. Here each MatMul/Gather weight is serialised alone, quantized with
onnxruntime's own kernels (the same `DefaultWeightOnlyQuantizer` the builder uses, so the bytes are
identical), spliced back into the in-memory `onnx_ir` graph, and the float tensor is dropped. The
float weights then exist once, and shrink as the pass goes.

The lm_head and the embedding may use more bits than the body (`head_bits`): they are the most
sensitive weights of a small model (llama.cpp keeps them at 6-8 bits in its 4-bit files), and
GatherBlockQuantized reads 8-bit data too. A tied embedding then reads the lm_head's 8-bit tensor.

Shapes: a MatMul weight B [K, N] becomes MatMulNBits B_q [N, ceil(K/block), block*bits/8] uint8 +
scales [N, ceil(K/block)] (+ zero points when asymmetric). An embedding [V, H] quantized along H becomes
GatherBlockQuantized data [V, H*bits/8] uint8 + scales [V, ceil(H/block)].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

WEIGHT_INPUT = {"MatMul": 1, "Gather": 0}
LM_HEAD = "/lm_head/MatMul"

# The quantization every exporter uses unless told otherwise (the torch path's build.py and the GGUF
# path read these). Measured on a 2-core AMD EPYC Zen 4 (AVX-512 VNNI) with onnxruntime 1.32, two
# threads, the Qwen2.5-Coder 1.5B target, side by side in one process:
# - block 128 (a float32 scale per 128 weights) against 32: the 1-token step 0.58-0.66x the time, the
#   3- and 5-token steps 0.65-0.69x, although the bytes read shrink only to 0.87x: the int8 kernel's
#   cost per block, not the memory, is the limit at 32; 64 was in between (0.77x). Its export parity
#   is lower: top-1 agreement with the source 90.4 % (mean KL 0.053) against 94.3 % (0.028) at 32,
#   so the default stays 32 and `--block-size 128` is the user's speed/fidelity trade-off (the
#   export's parity gate applies to it as to any block size).
# - default_block_size gives DEFAULT_BLOCK_SIZE only where every width a weight is quantized along
#   (hidden size, FFN width, attention width) is a multiple of it, so no block is padded and the
#   embedding's row splits evenly; other models get FALLBACK_BLOCK_SIZE.
DEFAULT_BLOCK_SIZE = 32
FALLBACK_BLOCK_SIZE = 32
# MatMulNBits' compute type 4 (int8, VNNI): 2 (fp16) and 3 (bf16) have no x86 kernel in onnxruntime
# 1.32 and ran 14-16x slower per 1-token step, 8x per 5-token step; 1 (fp32) ~20x slower
DEFAULT_ACCURACY_LEVEL = 4
# The lm_head is the most sensitive weight (llama.cpp keeps it at 6-8 bits in its 4-bit files): at 8 bits
# the 1.5B's top-1 agreement goes from 91.9 % to 94.3 % for +0.12 GB; at block 128 its 1-token step
# measured the same with a 4- or an 8-bit head (0.583x vs 0.592x of block 32's). An untied embedding
# stays at the body's bits: one row is read per token, so its size costs memory but no time.
# `--head-bits 4` gives the smallest bundle.
DEFAULT_HEAD_BITS = {"int4": 8, "int8": 8}


# The draft's form by default. The target verifies every token the draft proposes, so the draft's fidelity
# to its source buys nothing by itself: its bits, blocks and vocabulary are chosen by what they do to
# acceptance and speed (tokens/s of `--draft model` over the target alone), measured on the bench's code
# and chat sets with the Qwen2.5-Coder 0.5B GGUF as the draft (docs/export.md, "The draft model's form").
# - DRAFT_QUANT: the draft of an int4 export (the default, a GGUF's kept blocks included) is rounded to
#   4 bits (its Q5_0/Q8_0/Q6_K blocks: 8-bit blocks in the graph when kept); an int8 or float export's
#   draft follows --quant. --draft-quant sets it.
# - DRAFT_BLOCK_SIZE: a scale per 128 weights, where it divides the model's widths (else 32).
#   --block-size sets both models'.
# - DRAFT_VOCAB: the draft's lm_head keeps the rows of this many frequent tokens (prune_vocab.py) when its
#   vocabulary has DRAFT_VOCAB_MIN ids or more: the 0.5B's 151,936-row head is a quarter of its weights.
#   --draft-vocab N sets it, 0 keeps every row.
DRAFT_QUANT = "int4"
DRAFT_BLOCK_SIZE = 128
DRAFT_VOCAB = 32768
DRAFT_VOCAB_MIN = 2 * DRAFT_VOCAB


def default_block_size(*widths: int, role: str = "target") -> int:
    """The block size of an export without --block-size, for a model whose weights are quantized along
    `widths` (its hidden size, FFN width, attention width): DEFAULT_BLOCK_SIZE (a draft's:
    DRAFT_BLOCK_SIZE) where it divides them all, else FALLBACK_BLOCK_SIZE."""
    want = DRAFT_BLOCK_SIZE if role == "draft" else DEFAULT_BLOCK_SIZE
    return want if all(int(w) % want == 0 for w in widths) else FALLBACK_BLOCK_SIZE


def draft_quant(quant: str, asked: str | None = None) -> str:
    """The draft's precision: as asked (--draft-quant), else DRAFT_QUANT under an int4 export, else --quant."""
    return asked or (DRAFT_QUANT if quant == "int4" else quant)


def draft_vocab(asked: int | None, quant: str, vocab: int, flavors: int) -> int:
    """The draft lm_head's kept rows: as asked (--draft-vocab; 0 keeps all), else DRAFT_VOCAB for an int4
    export of one graph flavor whose draft has DRAFT_VOCAB_MIN ids or more, else 0."""
    if asked is not None:
        return asked
    return DRAFT_VOCAB if quant == "int4" and flavors == 1 and vocab >= DRAFT_VOCAB_MIN else 0


@dataclass
class QuantSettings:
    bits: int  # 4 or 8
    block_size: int
    accuracy_level: int
    symmetric: bool = True
    op_types: tuple[str, ...] = ("MatMul", "Gather")
    exclude: tuple[str, ...] = ()  # node names left in float
    head_bits: int | None = None  # bits of the lm_head (and of a tied embedding, which reads it); None: `bits`
    embed_bits: int | None = None  # bits of an untied embedding; None: `head_bits`

    def bits_for(self, node) -> int:
        if node.op_type == "Gather":
            return self.embed_bits or self.head_bits or self.bits
        return (self.head_bits or self.bits) if node.name == LM_HEAD else self.bits


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
        w = node.inputs[WEIGHT_INPUT[node.op_type]]
        if w is None or not w.is_initializer() or w.const_value is None or w.const_value.dtype not in floats:
            continue
        if len(w.const_value.shape) != 2 or len(w.uses()) != 1:
            continue
        if node.op_type == "Gather" and (settings.symmetric is False and settings.bits_for(node) == 8):
            continue  # our 8-bit embedding quantizer is symmetric only
        out.append(node)
    return out


def quantize_graph(model, settings: QuantSettings, on_tensor: Callable[[str], None] | None = None) -> int:
    """Quantizes `model` (an onnx_ir.Model) in place; returns the number of weights quantized.

    Values that the builder already wired to a quantized weight's future name (the tied embedding's
    GatherBlockQuantized reads `lm_head.MatMul.weight_Q4` / `_scales`) are bound to the new
    initializers, so the tied embedding and the lm_head share one tensor."""
    import numpy as np
    import onnx
    import onnx_ir as ir

    graph = model.graph
    dangling = _dangling_inputs(graph)
    quantizers: dict[int, object] = {}
    count = 0
    # smallest first: the float weights go as they are quantized, so the big vocabulary-sized ones
    # (embedding, lm_head: ~1 GB each in float for the 1.5B, plus their quantizer's temporaries)
    # are done last, when little else is left in memory. Each weight is independent: same output.
    todo = sorted(quantizable_nodes(graph, settings), key=lambda n: n.inputs[WEIGHT_INPUT[n.op_type]].const_value.size)
    for node in todo:
        bits = settings.bits_for(node)
        w = node.inputs[WEIGHT_INPUT[node.op_type]]
        if node.op_type == "Gather" and bits == 8:
            new_protos, inits = _gather_8bit(node, w, settings.block_size)
        else:
            if bits not in quantizers:
                quantizers[bits] = _ort_quantizer(settings, bits)
            mini = onnx.helper.make_graph([], "one_weight", [], [], initializer=[ir.serde.serialize_tensor(w.const_value)])
            node_proto = ir.serde.serialize_node(node)
            with np.errstate(divide="ignore", invalid="ignore"):  # all-zero blocks (padding rows): 0/0, masked
                new_protos = quantizers[bits].quantize(node_proto, [mini])
            if len(new_protos) == 1 and new_protos[0] is node_proto:
                continue  # the quantizer declined (shape or dtype it does not handle)
            # detached copies: a tensor that still pointed into `mini` would keep the whole message,
            # float weight included, alive (protobuf sub-messages share their parent's arena)
            inits = [_detached(t) for t in mini.initializer if t.name != w.name]
            del mini
        by_name = {v.name: v for v in node.inputs if v is not None}
        for t in inits:
            value = dangling.pop(t.name, None) or ir.Value(name=t.name)
            value.const_value = ir.serde.deserialize_tensor(t) if isinstance(t, onnx.TensorProto) else t
            value.type = ir.TensorType(value.const_value.dtype)
            value.shape = value.const_value.shape
            graph.register_initializer(value)
            by_name[value.name] = value
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
    _rewire_tied_embedding(graph, dangling, settings)
    if count:
        _set_opsets(model)
    return count


def _detached(t):
    import onnx

    copy = onnx.TensorProto()
    copy.ParseFromString(t.SerializeToString())
    return copy


def _ort_quantizer(settings: QuantSettings, bits: int):
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )
    from onnxruntime.quantization.quant_utils import QuantFormat

    return DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(
        block_size=settings.block_size,
        is_symmetric=settings.symmetric,
        accuracy_level=settings.accuracy_level,
        quant_format=QuantFormat.QOperator,
        op_types_to_quantize=tuple(settings.op_types),
        bits=bits,
    ))


def _gather_8bit(node, w, block_size: int):
    """An embedding [V, H] -> GatherBlockQuantized, 8 bits, symmetric blocks of `block_size` along H:
    uint8 data with the op's default zero point 128, scales [V, H/block] (onnxruntime's own
    quantizer does Gather at 4 bits only)."""
    import numpy as np
    import onnx
    import onnx_ir as ir

    raw = w.const_value.numpy()
    # scales in the weight's own dtype: GatherBlockQuantized outputs the scales' type, and a float16
    # (cuda-flavored) graph expects float16 embeddings
    scale_dtype = np.float16 if raw.dtype == np.float16 else np.float32
    data = np.asarray(raw, dtype=np.float32)
    v, h = data.shape
    if h % block_size:
        raise ValueError(f"embedding width {h} is not a multiple of the block size {block_size}")
    blocks = data.reshape(v, h // block_size, block_size)
    scale = np.abs(blocks).max(axis=2) / 127.0
    safe = np.where(scale == 0, 1.0, scale)
    q = (np.clip(np.rint(blocks / safe[..., None]), -127, 127) + 128).astype(np.uint8).reshape(v, h)
    qt = ir.Tensor(q, name=w.name + "_Q8")
    st = ir.Tensor(scale.astype(scale_dtype), name=w.name + "_scales")
    gather_axis = 0
    for a in node.attributes.values():
        if a.name == "axis":
            gather_axis = a.value
    proto = onnx.helper.make_node(
        "GatherBlockQuantized", [qt.name, node.inputs[1].name, st.name], [node.outputs[0].name],
        name=node.name + "_Q8", domain="com.microsoft", bits=8, block_size=block_size,
        gather_axis=gather_axis, quantize_axis=1,
    )
    return [proto], [qt, st]


def _rewire_tied_embedding(graph, dangling: dict, settings: QuantSettings) -> None:
    """The builder wires a tied embedding to the lm_head's *4-bit* tensor names (Reshape to
    [V, H/2] -> GatherBlockQuantized bits=4). When the lm_head went to 8 bits, point them at its
    8-bit tensor instead: Reshape to [V, H], bits=8. Same bytes, shared, no copy."""
    import numpy as np
    import onnx_ir as ir

    q4 = dangling.get("lm_head.MatMul.weight_Q4")
    if q4 is None:
        return
    q8 = graph.initializers.get("lm_head.MatMul.weight_Q8")
    scales = graph.initializers.get("lm_head.MatMul.weight_scales")
    if q8 is None or scales is None:
        raise RuntimeError("the tied embedding reads the lm_head's quantized weight, which was not produced")
    n, k_blocks, block = q8.const_value.shape
    for reshape in list(q4.uses()):
        node = reshape.node
        if node.op_type != "Reshape":
            raise RuntimeError(f"unexpected consumer {node.op_type} of the tied lm_head weight")
        # a Constant node, not an initializer: shape inputs must be readable without external data
        const = ir.Node("", "Constant", [], attributes=[ir.AttrTensor(
            "value", ir.tensor(np.array([n, k_blocks * block], dtype=np.int64), name=node.name + "/shape_8bit"))],
            name=node.name + "/Shape8bit", num_outputs=1)
        const.outputs[0].name = node.name + "/shape_8bit"
        graph.insert_before(node, const)
        node.replace_input_with(0, q8)
        node.replace_input_with(1, const.outputs[0])
        for gbq in node.outputs[0].consumers():
            if gbq.op_type == "GatherBlockQuantized":
                gbq.attributes["bits"] = ir.AttrInt64("bits", 8)
    dangling.pop("lm_head.MatMul.weight_Q4", None)


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
