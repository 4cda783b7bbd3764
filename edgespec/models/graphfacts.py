"""The manifest's facts checked against the graphs themselves.

The manifest digest is unkeyed: it catches damage, not an edit whose digest was recomputed. A manifest
that says 29 layers, head_dim 65 or kv_dtype "int3" for a graph that has 28 layers, head_dim 64 and
float32 caches would otherwise pass every check and fail deep inside onnxruntime (a GQA shape error,
a KeyError) with a traceback. So `verify` and Bundle.open read each graph's inputs and outputs and
compare: names, layer count, kv heads, head dim, cache and logits dtypes, logits width, and that the
external weight files the graph points at are bundle files.

The graph is read with the small protobuf reader of protowire.py (ModelProto -> GraphProto ->
ValueInfoProto / TensorProto's external_data), not the `onnx` package: the device runtime does not depend on onnx,
and this reads only the few fields it needs, skipping weights without copying them (mmap).
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .protowire import GraphFormatError, fields, packed_varints, text

# TensorProto.DataType numbers -> the names the manifest uses
ELEM_TYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
              10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16", 17: "float8e4m3fn",
              21: "uint4", 22: "int4"}
KV_DTYPES = ("float32", "float16", "bfloat16")
# the ModelFacts fields that name one graph input each (None: the graph has no such input)
GRAPH_INPUT_FIELDS = ("input_ids", "attention_mask", "logits_to_keep", "position_ids", "attention_bias")


@dataclass
class Tensor:
    elem_type: str  # "float32", ... or "type<N>" for one not in ELEM_TYPES
    dims: list[int | str | None]  # an int, a symbolic name, or None when unset


@dataclass
class Node:
    op_type: str
    inputs: list[str]  # "" for an optional input left out (its slot kept)
    outputs: list[str]
    ints: dict[str, int]  # the integer attributes
    name: str = ""
    domain: str = ""  # "" is the ONNX domain (ai.onnx), "com.microsoft" onnxruntime's contrib ops
    tensor_type: str | None = None  # a Constant's value type (its `value` attribute)
    tensor_dims: list[int] | None = None  # a Constant's value shape (a Reshape's target rank is its length)


@dataclass
class GraphIO:
    inputs: dict[str, Tensor] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    external_files: set[str] = field(default_factory=set)  # initializers' external_data locations
    initializer_dims: dict[str, list[int]] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    # element types of the graph's values as the file states them: initializers and value_info
    # (the builder writes one for most intermediate values); the kernel check derives the rest
    value_types: dict[str, str] = field(default_factory=dict)

    def attention_shape(self) -> tuple[int, int, int | None] | None:
        """(num_heads, kv_heads, head_dim) from the first GroupQueryAttention node: its attributes and
        the width of the projection feeding its query (q alone, or q, k and v packed when the key
        input is empty). head_dim is None when that width cannot be read. None: no such node."""
        gqa = next((n for n in self.nodes if n.op_type == "GroupQueryAttention"), None)
        if gqa is None or "num_heads" not in gqa.ints or "kv_num_heads" not in gqa.ints:
            return None
        heads, kv = gqa.ints["num_heads"], gqa.ints["kv_num_heads"]
        width = self.projection_width(gqa.inputs[0]) if gqa.inputs else None
        packed = len(gqa.inputs) < 2 or not gqa.inputs[1]
        per = heads + 2 * kv if packed else heads
        head_dim = width // per if width and per and width % per == 0 else None
        return heads, kv, head_dim

    def projection_width(self, name: str) -> int | None:
        """Last dimension of a MatMul/MatMulNBits output, looking through bias Adds and casts."""
        producers = {o: n for n in self.nodes for o in n.outputs}
        for _ in range(8):
            node = producers.get(name)
            if node is None:
                return None
            if node.op_type == "MatMulNBits":
                return node.ints.get("N")
            if node.op_type == "MatMul" and len(node.inputs) > 1:
                dims = self.initializer_dims.get(node.inputs[1])
                return dims[-1] if dims else None
            if node.op_type in ("Add", "Cast", "Identity") and node.inputs:
                name = next((i for i in node.inputs if i not in self.initializer_dims), node.inputs[0])
                continue
            return None
        return None


def _value_info(buf: memoryview) -> tuple[str, Tensor]:
    name, tensor = "", Tensor("unknown", [])
    for num, wt, v in fields(buf):
        if num == 1 and wt == 2:
            name = text(v)
        elif num == 2 and wt == 2:  # TypeProto
            for tnum, twt, tv in fields(v):
                if tnum == 1 and twt == 2:  # TypeProto.Tensor
                    tensor = _tensor_type(tv)
    return name, tensor


def _tensor_type(buf: memoryview) -> Tensor:
    elem, dims = 0, []
    for num, wt, v in fields(buf):
        if num == 1 and wt == 0:
            elem = v
        elif num == 2 and wt == 2:  # TensorShapeProto
            for snum, swt, sv in fields(v):
                if snum == 1 and swt == 2:  # Dimension
                    d: int | str | None = None
                    for dnum, dwt, dv in fields(sv):
                        if dnum == 1 and dwt == 0:
                            d = dv
                        elif dnum == 2 and dwt == 2:
                            d = text(dv)
                    dims.append(d)
    return Tensor(ELEM_TYPES.get(elem, f"type{elem}"), dims)


def _node(buf: memoryview) -> Node:
    node = Node("", [], [], {})
    for num, wt, v in fields(buf):
        if num == 1 and wt == 2:
            node.inputs.append(text(v))
        elif num == 2 and wt == 2:
            node.outputs.append(text(v))
        elif num == 3 and wt == 2:
            node.name = text(v)
        elif num == 4 and wt == 2:
            node.op_type = text(v)
        elif num == 7 and wt == 2:
            node.domain = text(v)
        elif num == 5 and wt == 2:  # AttributeProto: name 1, i 3, t 5 (a TensorProto: data_type 2)
            name, value = None, None
            for anum, awt, av in fields(v):
                if anum == 1 and awt == 2:
                    name = text(av)
                elif anum == 3 and awt == 0:
                    value = av - (1 << 64) if av >= 1 << 63 else av
                elif anum == 5 and awt == 2:
                    node.tensor_type = _data_type(av)
                    node.tensor_dims = _tensor(av)[1]
            if name is not None and value is not None:
                node.ints[name] = value
    return node


def _data_type(buf: memoryview) -> str:
    """A TensorProto's element type (field 2), without reading its data."""
    elem = next((v for num, wt, v in fields(buf) if num == 2 and wt == 0), 0)
    return ELEM_TYPES.get(elem, f"type{elem}")


def _tensor(buf: memoryview) -> tuple[str, list[int], str | None, str]:
    """TensorProto: name (8), dims (1, packed or not), external_data (13) {key: 'location', value: file},
    data_type (2)."""
    name, dims, location, elem = "", [], None, 0
    for num, wt, v in fields(buf):
        if num == 8 and wt == 2:
            name = text(v)
        elif num == 2 and wt == 0:
            elem = v
        elif num == 1 and wt == 0:
            dims.append(v)
        elif num == 1 and wt == 2:
            dims.extend(packed_varints(v))
        elif num == 13 and wt == 2:
            key = value = None
            for enum, ewt, ev in fields(v):
                if enum == 1 and ewt == 2:
                    key = text(ev)
                elif enum == 2 and ewt == 2:
                    value = text(ev)
            if key == "location":
                location = value
    return name, dims, location, ELEM_TYPES.get(elem, f"type{elem}")


def read_graph_io(path: Path) -> GraphIO:
    """Inputs, outputs and external weight files of an ONNX model, without loading any weights.
    Cached by the file's identity (inode, size, mtime): Bundle.open reads each graph's facts and its
    dtypes (graphcheck), one parse serves both. Callers must not modify the result."""
    st = os.stat(path)
    return _read_graph_io(os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=8)
def _read_graph_io(path: str, ino: int, size: int, mtime_ns: int) -> GraphIO:
    io = GraphIO()
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise GraphFormatError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                graphs = [v for num, wt, v in fields(buf) if num == 7 and wt == 2]  # ModelProto.graph
                if not graphs:
                    raise GraphFormatError("no graph in the file")
                for num, wt, v in fields(graphs[-1]):
                    if num == 11 and wt == 2:
                        name, t = _value_info(v)
                        io.inputs[name] = t
                    elif num == 12 and wt == 2:
                        name, t = _value_info(v)
                        io.outputs[name] = t
                    elif num == 13 and wt == 2:  # value_info
                        name, t = _value_info(v)
                        if t.elem_type not in ("unknown", "type0"):
                            io.value_types[name] = t.elem_type
                    elif num == 5 and wt == 2:  # initializer
                        name, dims, loc, elem = _tensor(v)
                        io.initializer_dims[name] = dims
                        io.value_types[name] = elem
                        if loc:
                            io.external_files.add(loc)
                    elif num == 1 and wt == 2:
                        io.nodes.append(_node(v))
                    del v
                del graphs
            finally:
                buf.release()
    return io


def graph_readable(path: Path) -> bool:
    """Does read_graph_io read this file (cached: the checks that follow parse it once)?"""
    try:
        read_graph_io(path)
    except Exception:  # noqa: BLE001 - model_problems says what is wrong, one line
        return False
    return True


# --- the manifest against the graph ------------------------------------------------------------------
def model_problems(root: Path, role: str, facts: Any, listed: set[str], contract_inputs: Any = ()) -> list[str]:
    """One line per fact of models.<role> the graph contradicts (empty: consistent). A wrong fact is
    said once, however many layers or places show it. `contract_inputs`: the input fields a graph
    contract version added (their absence means an older graph)."""
    rel = facts.path
    try:
        io = read_graph_io(root / rel)
    except (OSError, GraphFormatError) as e:
        return [f"{rel}: not a readable ONNX graph ({e})"]
    except Exception as e:  # noqa: BLE001 - any bytes at all: a damaged graph is one line, never a traceback
        return [f"{rel}: not a readable ONNX graph ({type(e).__name__})"]
    where = f"{rel}: manifest models.{role}"
    found: dict[str, str] = {}  # fact -> the line that names it

    def say(fact: str, line: str) -> None:
        found.setdefault(fact, line)

    for what in GRAPH_INPUT_FIELDS:
        name = getattr(facts, what)
        if name and name not in io.inputs:
            hint = " (a graph of an older contract: re-export the bundle)" if what in contract_inputs else ""
            say(what, f"{where}.{what} names input {name!r}, which the graph does not have{hint}")
    logits = io.outputs.get(facts.logits)
    if logits is None:
        say("logits", f"{where}.logits names output {facts.logits!r}, which the graph does not have")
    else:
        if logits.elem_type != facts.logits_dtype:
            say("logits_dtype", f"{rel}: {facts.logits} is {logits.elem_type}, the manifest says {facts.logits_dtype}")
        if logits.dims and isinstance(logits.dims[-1], int) and logits.dims[-1] != facts.vocab_size:
            say("vocab_size", f"{where}.vocab_size is {facts.vocab_size}, the graph's logits have {logits.dims[-1]} rows")
    hidden = getattr(facts, "hidden_states", None)
    if hidden and hidden not in io.outputs:
        say("hidden_states", f"{where}.hidden_states names output {hidden!r}, which the graph does not have")
    elif hidden:
        # the runner preallocates [1, n, hidden_size] for it: a wrong size is refused here, not at the first step
        dims = io.outputs[hidden].dims
        if dims and isinstance(dims[-1], int) and dims[-1] != facts.hidden_size:
            say("hidden_size", f"{where}.hidden_size is {facts.hidden_size}, the graph's {hidden} rows have {dims[-1]}")
    graph_layers = 0
    while _has(io.inputs, facts.past_key, graph_layers):
        graph_layers += 1
    if graph_layers != facts.layers:
        say("layers", f"{where}.layers is {facts.layers}, the graph has {graph_layers} ({_pattern(facts.past_key)} inputs)")
    for i in range(min(graph_layers, facts.layers)):
        for pattern in (facts.past_key, facts.past_value):
            name = _name(pattern, i)
            t = io.inputs.get(name)
            if t is None:
                say(pattern, f"{where}: the graph has no input {name!r}")
                continue
            if t.elem_type != facts.kv_dtype:
                # worded as graphcheck.dtype_problems words it (verify --load reads the same from a session)
                say("kv_dtype", f"{rel}: {name} is {t.elem_type}, the manifest says {facts.kv_dtype}")
            if len(t.dims) != 4:
                say("cache_rank", f"{where}: cache input {name!r} has {len(t.dims)} dimensions, expected 4")
                continue
            if isinstance(t.dims[1], int) and t.dims[1] != facts.kv_heads:
                say("kv_heads", f"{where}.kv_heads is {facts.kv_heads}, the graph's cache has {t.dims[1]} heads")
            if isinstance(t.dims[3], int) and t.dims[3] != facts.head_dim:
                say("head_dim", f"{where}.head_dim is {facts.head_dim}, the graph's cache has head_dim {t.dims[3]}")
    for i in range(min(graph_layers, facts.layers)):
        for pattern in (facts.present_key, facts.present_value):
            if _name(pattern, i) not in io.outputs:
                say(pattern, f"{where}: the graph has no output {_name(pattern, i)!r}")
    # the runner feeds exactly the inputs the manifest names: one more is a graph of another contract
    n = max(graph_layers, facts.layers)
    named = {getattr(facts, what) for what in GRAPH_INPUT_FIELDS}
    named |= {_name(p, i) for p in (facts.past_key, facts.past_value) for i in range(n)}
    misnamed = found.keys() & {*GRAPH_INPUT_FIELDS, "layers", facts.past_key, facts.past_value}
    for name in [x for x in io.inputs if x not in named and not misnamed][:1]:
        say("unnamed", f"{rel}: the graph takes input {name!r}, which manifest models.{role} does not name "
                       "(a manifest of another format_version than the graph's contract? re-export the bundle)")
    # the flavor rule, as graphcheck.dtype_problems states it (that check runs after this one, with onnx)
    flavor = facts.graph_flavor() if hasattr(facts, "graph_flavor") else None
    if flavor == "cuda" and facts.kv_dtype != "float16":
        say("flavor", f"{rel}: the cuda flavor needs a float16 KV cache (CUDA's GroupQueryAttention), "
                      f"the manifest says {facts.kv_dtype}")
    if flavor == "cpu" and facts.kv_dtype != "float32":
        say("flavor", f"{rel}: the cpu flavor has a float32 KV cache, the manifest says {facts.kv_dtype}")
    shape = io.attention_shape()
    if shape is not None:
        _, kv, head_dim = shape
        if kv != facts.kv_heads:
            say("kv_heads", f"{where}.kv_heads is {facts.kv_heads}, the graph's attention has {kv} kv heads")
        if head_dim is not None and head_dim != facts.head_dim:
            say("head_dim", f"{where}.head_dim is {facts.head_dim}, the graph's attention has head_dim {head_dim}")
    folder = Path(rel).parent
    for loc in sorted(io.external_files):
        ext = (folder / loc).as_posix()
        if ext not in listed:
            say(f"file:{ext}", f"{rel}: its weights file {ext!r} is not listed in the manifest")
    return list(found.values())


def _name(pattern: str, i: int) -> str:
    return pattern % i if "%d" in pattern else pattern


def _pattern(pattern: str) -> str:
    return pattern.replace("%d", "{i}")


def _has(inputs: dict, pattern: str, i: int) -> bool:
    return "%d" in pattern and (pattern % i) in inputs


# --- the draft heads' graph against its record ------------------------------------------------------
# method -> (inputs, outputs), each name -> dims: "H" the record's hidden_size, "n" its n_heads, "N" its
# kept rows, None any (the rows axis)
HEADS_IO = {
    "medusa": ({"hidden": [None, "H"]}, {"logits": [None, "n", "N"]}),
    "feature": ({"hidden": [1, "H"], "token": [1]}, {"feature": [1, "H"], "logits": [1, "N"]}),
}


def heads_problems(root: Path, record: dict) -> list[str]:
    """One line per way the heads graph contradicts the manifest's heads record (Manifest.heads):
    its method's inputs and outputs, and their sizes. Empty: consistent."""
    rel = record["path"]
    try:
        io = read_graph_io(root / rel)
    except Exception as e:  # noqa: BLE001 - any bytes at all: one line, never a traceback
        return [f"{rel}: not a readable ONNX graph ({type(e).__name__})"]
    method = record["method"]
    want_in, want_out = HEADS_IO[method]
    if set(io.inputs) != set(want_in) or set(io.outputs) != set(want_out):
        return [f"{rel}: manifest heads.method {method!r} means inputs {', '.join(want_in)} and outputs "
                f"{', '.join(want_out)}; the graph has inputs {', '.join(io.inputs) or 'none'} and outputs "
                f"{', '.join(io.outputs) or 'none'}"]
    sizes = {"H": ("hidden_size", record.get("hidden_size")), "n": ("n_heads", record.get("n_heads")),
             "N": ("kept", record.get("kept"))}
    for name, dims in (*want_in.items(), *want_out.items()):
        got = (io.inputs.get(name) or io.outputs[name]).dims
        if len(got) != len(dims):
            return [f"{rel}: {name} has {len(got)} dimensions, a {method} heads graph's has {len(dims)}"]
        for want, have in zip(dims, got):
            field_name, value = sizes.get(want, (None, want)) if isinstance(want, str) else (None, want)
            if value is not None and isinstance(have, int) and have != value:
                what = f"manifest heads.{field_name} is {value}" if field_name else f"a {method} heads graph's is {value}"
                return [f"{rel}: {what}, the graph's {name} has {have}"]
    return []
