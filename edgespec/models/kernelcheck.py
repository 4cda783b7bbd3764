"""Checks a graph against a provider's kernel table (kernels.py) and names each node and the rule it breaks.

Reads the graph with graphfacts' protobuf reader (no onnx package, weights not loaded), so the device
runtime can run it in `verify` and Bundle.open, and the exporter before it writes a bundle. Element
types come from the file (inputs, outputs, initializers, value_info) and, where the file states none,
from a small forward pass over the nodes (Cast's `to`, a Constant's value, the first input's type for
the ops that keep it); an input whose type stays unknown is not type-checked.

A rule id names what broke: `<Op>.unlisted` (no row for this op), `<Op>.<input>.type`, `<Op>.<input>.absent`,
`<Op>.<attribute>`, or a runtime check of CHECKS (`<Op>.<check>`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .graphfacts import ELEM_TYPES, GraphIO, Node, read_graph_io
from .kernels import TENSORRT_OPS, Kernel, table


@dataclass(frozen=True)
class Violation:
    node: str  # the node's name (or "#<index>" when it has none)
    op: str
    rule: str
    detail: str
    source: str  # the row's onnxruntime file

    def line(self, provider: str) -> str:
        return f"node {self.node} ({self.op}) breaks {provider} kernel rule {self.rule}: {self.detail}"


# ops whose output 0 has the element type of their input 0 (enough for the graphs the builder writes)
_KEEPS_TYPE = {"Add", "Sub", "Mul", "Div", "Neg", "Max", "Min", "Sigmoid", "Slice", "Reshape", "Unsqueeze",
               "Squeeze", "Transpose", "Identity", "Expand", "Concat", "ReduceSum", "Gather", "MatMul",
               "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "GroupQueryAttention",
               "MatMulNBits", "RotaryEmbedding"}


def value_types(io: GraphIO) -> dict[str, str]:
    """{value name: element type} for every value whose type the file states or a forward pass derives."""
    types = dict(io.value_types)
    types.update({n: t.elem_type for n, t in {**io.inputs, **io.outputs}.items()})
    for node in io.nodes:
        first = types.get(node.inputs[0]) if node.inputs and node.inputs[0] else None
        for i, out in enumerate(node.outputs):
            if not out or out in types:
                continue
            t = None
            if node.op_type == "Constant":
                t = node.tensor_type
            elif node.op_type == "Cast" and "to" in node.ints:
                t = ELEM_TYPES.get(node.ints["to"])
            elif node.op_type == "Shape":
                t = "int64"
            elif node.op_type == "GatherBlockQuantized" and len(node.inputs) > 2:
                t = types.get(node.inputs[2])  # the scales' type
            elif node.op_type == "GroupQueryAttention" and i > 0 and len(node.inputs) > 3:
                t = types.get(node.inputs[3])  # present has the past's type
            elif node.op_type in _KEEPS_TYPE and i == 0:
                t = first
            if t:
                types[out] = t
    return types


def _input(node: Node, i: int) -> str:
    return node.inputs[i] if i < len(node.inputs) else ""


# --- runtime checks the graph alone decides (each names the kernel code it stands for) -------------------
def _gqa_heads(node: Node, io: GraphIO) -> str | None:
    h, kv = node.ints.get("num_heads", 0), node.ints.get("kv_num_heads", 0)
    if h <= 0 or kv <= 0 or h % kv:
        return (f"num_heads {h} and kv_num_heads {kv}: both must be positive and num_heads a multiple of "
                "kv_num_heads (the kernel's constructor enforces it)")
    return None


def _gqa_rotary(node: Node, io: GraphIO) -> str | None:
    if node.ints.get("do_rotary", 0) == 1 and not (_input(node, 7) and _input(node, 8)):
        return "do_rotary=1 needs cos_cache and sin_cache (inputs 7 and 8) wired"
    return None


def _gqa_head_size(node: Node, io: GraphIO) -> str | None:
    h, kv = node.ints.get("num_heads", 0), node.ints.get("kv_num_heads", 0)
    width = io.projection_width(node.inputs[0]) if node.inputs else None
    q = io.inputs.get(_input(node, 0))
    if width is None and q is not None and q.dims and isinstance(q.dims[-1], int):
        width = q.dims[-1]  # the query is a graph input: its last dimension
    per = h + 2 * kv if not _input(node, 1) else h
    if not width or not per or width % per:
        return None  # not read from the graph: nothing to say
    head = width // per
    if head % 8 or head > 256:
        return (f"head size {head}: CUDA's fused attention kernels (flash, memory-efficient) need a multiple "
                "of 8 of at most 256")
    return None


def _gqa_rotary_head(node: Node, io: GraphIO) -> str | None:
    """CheckInputs (contrib_ops/cpu/bert/group_query_attention_helper.h, shared by the CPU and CUDA
    kernels): with cos_cache and sin_cache wired, "head_size shall be a multiple of 16"."""
    if not (_input(node, 7) and _input(node, 8)):
        return None
    h, kv = node.ints.get("num_heads", 0), node.ints.get("kv_num_heads", 0)
    width = io.projection_width(node.inputs[0]) if node.inputs else None
    q = io.inputs.get(_input(node, 0))
    if width is None and q is not None and q.dims and isinstance(q.dims[-1], int):
        width = q.dims[-1]
    per = h + 2 * kv if not _input(node, 1) else h
    if not width or not per or width % per or (width // per) % 16 == 0:
        return None
    return (f"head size {width // per} with cos_cache and sin_cache wired: the kernel's input check needs a "
            "multiple of 16 (group_query_attention_helper.h)")


def _gqa_shared_cache(node: Node, io: GraphIO) -> str | None:
    past, present = _input(node, 3), node.outputs[1] if len(node.outputs) > 1 else ""
    if not past or not present:
        return "past_key and present_key must both be wired (the cache is written in place)"
    if past not in io.inputs or present not in io.outputs:
        return (f"{past!r} must be a graph input and {present!r} a graph output, so the runtime binds them "
                "to one buffer (past/present sharing: flash decoding and XQA need it)")
    a, b = io.inputs[past].dims, io.outputs[present].dims
    if len(a) != 4 or len(b) != 4 or a[1] != b[1] or a[3] != b[3]:  # dim 2 is bound at run time (MAX)
        return (f"{past} {a} and {present} {b} must be 4-d with the same kv heads and head size (one shared "
                "[batch, kv_heads, max_len, head_dim] buffer)")
    return None


def _block_size_pow2(node: Node, io: GraphIO) -> str | None:
    bs = node.ints.get("block_size", 0)
    if bs and (bs < 16 or bs & (bs - 1)):
        return f"block_size {bs}: must be a power of two of at least 16 (the kernel's constructor enforces it)"
    return None


def _data_rank(name: str, io: GraphIO) -> int | None:
    """The rank of a value as a kernel receives it: an initializer's, or a Reshape's target (its shape
    input, an initializer or a Constant, has one element per dimension). None when the graph does not say."""
    if name in io.initializer_dims:
        return len(io.initializer_dims[name])
    producer = next((n for n in io.nodes if name in n.outputs), None)
    if producer is None or producer.op_type != "Reshape" or len(producer.inputs) < 2:
        return None
    shape = producer.inputs[1]
    if shape in io.initializer_dims and len(io.initializer_dims[shape]) == 1:
        return io.initializer_dims[shape][0]
    const = next((n for n in io.nodes if shape in n.outputs and n.op_type == "Constant"), None)
    if const is not None and const.tensor_dims is not None and len(const.tensor_dims) == 1:
        return const.tensor_dims[0]
    return None


def _gbq_last_axis(node: Node, io: GraphIO) -> str | None:
    rank = _data_rank(node.inputs[0], io) if node.inputs else None
    axis = node.ints.get("quantize_axis", 0)  # the CUDA constructor's default (the CPU schema's is 1)
    if rank and axis != rank - 1:
        unset = " (unset: the CUDA kernel's default is 0)" if "quantize_axis" not in node.ints else ""
        return (f"quantize_axis {axis}{unset}: the CUDA kernel enforces the last axis of the data it receives "
                f"({rank - 1}, rank {rank})")
    return None


CHECKS: dict[str, Callable[[Node, GraphIO], str | None]] = {
    "gqa_heads": _gqa_heads, "gqa_rotary": _gqa_rotary, "gqa_head_size": _gqa_head_size,
    "gqa_rotary_head": _gqa_rotary_head,
    "gqa_shared_cache": _gqa_shared_cache, "block_size_pow2": _block_size_pow2, "gbq_last_axis": _gbq_last_axis,
}


def node_violations(node: Node, row: Kernel | None, types: dict[str, str], io: GraphIO) -> list[str]:
    """(rule, detail) pairs as 'rule\\tdetail' strings for one node against its row."""
    op = node.op_type
    if row is None:
        where = f"{node.domain}." if node.domain else ""
        return [f"{op}.unlisted\tno row for {where}{op} in this provider's kernel table (edgespec/models/kernels.py): "
                "the provider may not run it"]
    out = []
    for i, name, allowed in row.types:
        t = types.get(_input(node, i))
        if _input(node, i) and t and t not in allowed:
            out.append(f"{op}.{name}.type\tinput {i} ({name}) is {t}; the kernel takes {', '.join(allowed)}")
    for i, name, why in row.absent:
        if _input(node, i):
            out.append(f"{op}.{name}.absent\tinput {i} ({name}) is wired to {_input(node, i)!r}: {why}")
    for attr, allowed, default in row.attrs:
        v = node.ints.get(attr, default)
        if v is not None and v not in allowed:
            out.append(f"{op}.{attr}\t{attr}={v}; the kernel takes {', '.join(map(str, allowed))}")
    for check in row.checks:
        detail = CHECKS[check](node, io)
        if detail:
            out.append(f"{op}.{check}\t{detail}")
    return out


def check_io(io: GraphIO, provider: str) -> list[Violation]:
    """Every (node, rule) a graph breaks against `provider`'s table, in node order."""
    rows = table(provider)
    types = value_types(io)
    found = []
    for idx, node in enumerate(io.nodes):
        row = rows.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        for v in node_violations(node, row, types, io):
            rule, detail = v.split("\t", 1)
            found.append(Violation(node.name or f"#{idx}", node.op_type, rule, detail, row.source if row else ""))
    return found


def check_graph(path: str | Path, provider: str) -> list[Violation]:
    return check_io(read_graph_io(Path(path)), provider)


def summarize(violations: list[Violation], provider: str, prefix: str = "") -> list[str]:
    """One line per rule broken: the first node that breaks it named, and how many more do."""
    by_rule: dict[str, list[Violation]] = {}
    for v in violations:
        by_rule.setdefault(v.rule, []).append(v)
    lines = []
    for vs in by_rule.values():
        more = f" (and {len(vs) - 1} more node(s))" if len(vs) > 1 else ""
        lines.append(f"{prefix}{vs[0].line(provider)}{more}")
    return lines


def tensorrt_split(io: GraphIO) -> tuple[dict[str, int], dict[str, int]]:
    """({op: nodes} TensorRT's provider would take, {op: nodes} it leaves to CUDA or the CPU), from
    kernels.TENSORRT_OPS: ONNX-domain ops only (onnx-tensorrt has no com.microsoft op)."""
    taken: dict[str, int] = {}
    left: dict[str, int] = {}
    for node in io.nodes:
        onnx_domain = node.domain in ("", "ai.onnx")
        into = taken if onnx_domain and node.op_type in TENSORRT_OPS else left
        into[node.op_type] = into.get(node.op_type, 0) + 1
    return taken, left
