"""An ONNX graph written as it is built: each initializer's bytes go straight to the external-data
file, the graph proto keeps only a reference (location, offset, length). Nothing holds the weights
but the tensor being written, so the export's memory is that of its largest tensor, not the model's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

PAGE = 4096  # large tensors start on a page: onnxruntime can map them instead of copying
SMALL = 64  # alignment of the others


class OnnxWriter:
    def __init__(self, onnx_path: Path):
        from onnx import helper

        self.helper = helper
        self.onnx_path = Path(onnx_path)
        self.data_name = self.onnx_path.name + ".data"
        self.data = open(self.onnx_path.parent / self.data_name, "wb")
        self.offset = 0
        self.nodes: list = []
        self.initializers: list = []
        self.inputs: list = []
        self.outputs: list = []
        self.names: set[str] = set()

    # --- initializers -------------------------------------------------------------------------------
    def _reserve(self, nbytes: int) -> int:
        align = PAGE if nbytes >= PAGE else SMALL
        pad = (-self.offset) % align
        if pad:
            self.data.write(b"\0" * pad)
            self.offset += pad
        start = self.offset
        self.offset += nbytes
        return start

    def _proto(self, name: str, dtype, shape, start: int, nbytes: int):
        import onnx

        if name in self.names:
            raise ValueError(f"initializer {name!r} written twice")
        self.names.add(name)
        t = onnx.TensorProto()
        t.name = name
        t.data_type = self.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        t.dims.extend(int(d) for d in shape)
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.data_name), ("offset", str(start)), ("length", str(nbytes))):
            e = t.external_data.add()
            e.key, e.value = key, value
        self.initializers.append(t)
        return name

    def tensor(self, name: str, array: np.ndarray) -> str:
        """Writes `array` now; returns its name."""
        a = np.ascontiguousarray(array)
        start = self._reserve(a.nbytes)
        self.data.write(a.tobytes())
        return self._proto(name, a.dtype, a.shape, start, a.nbytes)

    def tensor_rows(self, name: str, dtype, shape, chunks) -> str:
        """Writes a tensor given as consecutive row chunks (an iterable of arrays), without ever holding
        all of it: the vocabulary-sized embedding and lm_head are written this way."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        start = self._reserve(nbytes)
        written = 0
        for c in chunks:
            c = np.ascontiguousarray(c, dtype=dtype)
            self.data.write(c.tobytes())
            written += c.nbytes
        if written != nbytes:
            raise ValueError(f"{name}: wrote {written} bytes, expected {nbytes} for shape {shape}")
        return self._proto(name, dtype, shape, start, nbytes)

    # --- nodes ------------------------------------------------------------------------------------
    def node(self, op: str, inputs: list[str], outputs: list[str] | int = 1, *, name: str, domain: str = "",
             **attrs) -> list[str]:
        """Adds a node; `outputs` as names, or a count (named <name>/output_<i>, the builder's scheme)."""
        if isinstance(outputs, int):
            outputs = [f"{name}/output_{i}" for i in range(outputs)]
        self.nodes.append(self.helper.make_node(op, inputs, outputs, name=name, domain=domain or None, **attrs))
        return outputs

    def const(self, name: str, values, dtype=np.int64) -> str:
        """A Constant node (not an initializer: shape inputs must be readable without external data)."""
        arr = np.asarray(values, dtype=dtype)
        out = f"{name}/value"
        self.nodes.append(self.helper.make_node(
            "Constant", [], [out], name=name, value=self.helper.make_tensor(
                name + "/tensor", self.helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape),
                arr.reshape(-1).tolist())))
        return out

    def input(self, name: str, elem_type: int, shape: list) -> None:
        self.inputs.append(self.helper.make_tensor_value_info(name, elem_type, shape))

    def output(self, name: str, elem_type: int, shape: list) -> None:
        self.outputs.append(self.helper.make_tensor_value_info(name, elem_type, shape))

    def finish(self, graph_name: str, metadata: dict[str, str] | None = None) -> Path:
        import onnx

        self.data.close()
        graph = self.helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.initializers)
        model = self.helper.make_model(graph, opset_imports=[self.helper.make_opsetid("", 21),
                                                             self.helper.make_opsetid("com.microsoft", 1)],
                                       producer_name="edgespec-export (native)")
        model.ir_version = 10  # opset 21; int4 tensors need IR 10 (quantize._set_opsets)
        for k, v in (metadata or {}).items():
            model.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
        onnx.save(model, str(self.onnx_path))
        return self.onnx_path

    def abort(self) -> None:
        self.data.close()
