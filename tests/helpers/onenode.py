"""Single-node ONNX graphs for the kernel-contract tests: one op, its inputs as graph inputs or
initializers, built with the `onnx` package, and a real CPU session to say whether onnxruntime
loads and runs it (tests/models/test_kernelcheck.py holds the CPU table to what this says)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

_NP = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32, "uint8": np.uint8}


def make_graph(path: Path, op: str, inputs: list, outputs: list[str], *, domain: str = "", **attrs) -> Path:
    """inputs: (name, elem type, shape, value or None) per slot, or None for an optional input left
    out; a value makes it an initializer, else a graph input (bfloat16 inputs are graph inputs).
    Outputs are left untyped (onnxruntime infers them)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    types = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
             "int64": TensorProto.INT64, "int32": TensorProto.INT32, "uint8": TensorProto.UINT8}
    graph_inputs, inits, names = [], [], []
    for spec in inputs:
        if spec is None:
            names.append("")
            continue
        name, elem, shape, value = spec
        names.append(name)
        if value is not None:
            inits.append(numpy_helper.from_array(np.asarray(value, dtype=_NP[elem]).reshape(shape), name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, types[elem], shape))
    node = helper.make_node(op, names, outputs, name=f"/{op}_under_test", domain=domain, **attrs)
    outs = [onnx.ValueInfoProto(name=o) for o in outputs]
    graph = helper.make_graph([node], "one_node", graph_inputs, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def run_cpu(path: Path, feeds: dict) -> str | None:
    """None when a CPU session loads the graph and runs it; else onnxruntime's first line."""
    import onnxruntime as ort

    from edgespec.edge.providers import session_options

    so = session_options(1)  # the process-wide pool when an earlier test set one up (per-session is refused then)
    try:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
    except Exception as e:  # onnxruntime raises Fail, InvalidGraph, NotImplemented, RuntimeError ...
        return str(e).splitlines()[0] or type(e).__name__
    return None
