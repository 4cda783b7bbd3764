"""Does each graph's I/O match what the manifest says about it (flavor, KV, activation, logits dtype)?

The runtime allocates the KV cache and the logits buffers from the manifest alone (runner.py), so a
manifest that says float32 for a float16 graph fails at the first step with an onnxruntime type
error far from the cause. `verify` checks it up front, one line per mismatch.

Two readers: the graph file itself (graphfacts.read_graph_io: milliseconds, no onnx package) and an
onnxruntime session's get_inputs()/get_outputs() (`verify --load`: what the runtime really sees).
Both give {name: dtype}.
"""
from __future__ import annotations

from pathlib import Path

from .graphfacts import GraphFormatError, read_graph_io
from .manifest import Manifest, ModelFacts

_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
              "tensor(int64)": "int64", "tensor(int32)": "int32"}


def io_types_graph(path: Path) -> dict[str, str]:
    """{input/output name: dtype} from the graph file (graphfacts' reader: no onnx package, weights
    not loaded)."""
    io = read_graph_io(path)
    return {n: t.elem_type for n, t in {**io.inputs, **io.outputs}.items()}


def io_types_session(session) -> dict[str, str]:
    return {v.name: _ORT_TYPES.get(v.type, v.type) for v in [*session.get_inputs(), *session.get_outputs()]}


def dtype_problems(facts: ModelFacts, types: dict[str, str]) -> list[str]:
    """Mismatches between one graph's facts and its I/O dtypes (layer 0's KV stands for all)."""
    out = []
    want = {facts.past_key % 0: facts.kv_dtype, facts.past_value % 0: facts.kv_dtype,
            facts.present_key % 0: facts.kv_dtype, facts.present_value % 0: facts.kv_dtype,
            facts.logits: facts.logits_dtype}
    for name, dtype in want.items():
        got = types.get(name)
        if got is None:
            out.append(f"{facts.path}: has no input or output {name!r}")
        elif got != dtype:
            out.append(f"{facts.path}: {name} is {got}, the manifest says {dtype}")
    # graph contract v2 (format_version 2): the tree inputs, int64 positions and a bias of the cache's type
    for name, dtype in ((facts.position_ids, "int64"), (facts.attention_bias, facts.kv_dtype)):
        if name is None:
            continue
        got = types.get(name)
        if got is None:
            out.append(f"{facts.path}: has no input {name!r} (graph contract v2): re-export the bundle")
        elif got != dtype:
            out.append(f"{facts.path}: {name} is {got}, graph contract v2 says {dtype}")
    flavor = facts.graph_flavor()
    if flavor == "cuda" and facts.kv_dtype != "float16":
        out.append(f"{facts.path}: the cuda flavor needs a float16 KV cache (CUDA's GroupQueryAttention), "
                   f"the manifest says {facts.kv_dtype}")
    if flavor == "cpu" and facts.kv_dtype != "float32":
        out.append(f"{facts.path}: the cpu flavor has a float32 KV cache, the manifest says {facts.kv_dtype}")
    return out


def bundle_problems(root: Path, manifest: Manifest) -> list[str]:
    """Every graph of every model, checked from its file."""
    out = []
    for facts in manifest.models.values():
        for g in facts.graphs().values():
            try:
                types = io_types_graph(root / g.path)
            except (OSError, GraphFormatError) as e:
                out.append(f"{g.path}: cannot read the graph: {e}")
                continue
            out += dtype_problems(g, types)
    return out
