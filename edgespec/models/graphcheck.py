"""Does each graph's I/O match what the manifest says about it (flavor, KV, activation, logits dtype)?

The runtime allocates the KV cache and the logits buffers from the manifest alone (runner.py), so a
manifest that says float32 for a float16 graph fails at the first step with an onnxruntime type
error far from the cause. `verify` checks it up front, one line per mismatch.

Two readers: `onnx` (the graph's protobuf without its weights: milliseconds, but the `onnx` package
is a workstation dependency) and an onnxruntime session's get_inputs()/get_outputs() (`verify
--load`, on a board). Both give {name: dtype}.
"""
from __future__ import annotations

from pathlib import Path

from .manifest import Manifest, ModelFacts

_ONNX_TYPES = {1: "float32", 10: "float16", 16: "bfloat16", 7: "int64", 6: "int32"}
_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
              "tensor(int64)": "int64", "tensor(int32)": "int32"}


def io_types_onnx(path: Path) -> dict[str, str] | None:
    """{input/output name: dtype} read with the onnx package, or None when it is not installed."""
    try:
        import onnx
    except ImportError:
        return None
    m = onnx.load(str(path), load_external_data=False)
    return {v.name: _ONNX_TYPES.get(v.type.tensor_type.elem_type, str(v.type.tensor_type.elem_type))
            for v in [*m.graph.input, *m.graph.output]}


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
    """Every graph of every model, checked with the onnx package (nothing when it is missing)."""
    out = []
    for facts in manifest.models.values():
        for g in facts.graphs().values():
            types = io_types_onnx(root / g.path)
            if types is None:
                return []
            out += dtype_problems(g, types)
    return out
