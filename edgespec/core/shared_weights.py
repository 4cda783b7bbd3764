"""The self-draft's weights: the target's, shared between the target's session and the
layer-skipped graph's (drafters/self.py; the graph runs on the target's own cache slot through
core/slot.py's SkipGraph).

The weights: onnxruntime (1.32) prepacks constant MatMul weights per session (a copy laid out for
its kernels), and its Python API gives no way to share prepacked weights between sessions. So both
sessions are given the *same* initializer OrtValues (SessionOptions.add_initializer), made once from
a read-only memory map of target/model.onnx.data, and both run with prepacking off
("session.disable_prepacking"): one copy of the weights, in clean file-backed pages. The measured
trade is in docs/speed.md ("Self-speculative drafting").
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


PREPACK_CONFIG = "session.disable_prepacking"
EXTERNAL_FOLDER_CONFIG = "session.model_external_initializers_file_folder_path"
_PACKED_4BIT = (21, 22)  # onnx TensorProto.UINT4, INT4


class SharedWeights:
    """Every initializer of a graph as an OrtValue, made once.

    External-data tensors are views into one read-only np.memmap of their file (no copy: the pages
    are the file's, shared with the page cache and reclaimable); inline tensors are small and are
    decoded. The numpy arrays are kept here: an OrtValue from numpy borrows their memory.
    Packed 4-bit tensors (an int4 bundle's quantized embedding) have no numpy type: each session
    loads its own copy of those (`unshared`)."""

    def __init__(self, model_path: Path):
        import onnx
        import onnxruntime as ort
        from onnx import external_data_helper, helper, numpy_helper

        self.path = Path(model_path)
        self.proto = onnx.load(str(self.path), load_external_data=False)
        self.arrays: dict[str, np.ndarray] = {}
        self.values: dict[str, object] = {}
        maps: dict[Path, np.memmap] = {}
        self.unshared: list[str] = []  # packed 4-bit tensors: numpy/OrtValue cannot hold them
        self.folded: list[str] = []  # constant Transposes of weights, computed once (_fold_transposes)
        for t in self.proto.graph.initializer:
            if t.data_type in _PACKED_4BIT:
                self.unshared.append(t.name)
                continue
            if external_data_helper.uses_external_data(t):
                info = {e.key: e.value for e in t.external_data}
                f = self.path.parent / info["location"]
                mm = maps.get(f)
                if mm is None:
                    mm = maps[f] = np.memmap(f, dtype=np.uint8, mode="r")
                off = int(info.get("offset", 0))
                n = int(info["length"]) if "length" in info else mm.shape[0] - off
                dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
                a = mm[off : off + n].view(dt).reshape(tuple(t.dims))
            else:
                a = numpy_helper.to_array(t)
            self.arrays[t.name] = a
            self.values[t.name] = ort.OrtValue.ortvalue_from_numpy(a)
        self._fold_transposes()

    def _fold_transposes(self) -> None:
        """A tied embedding is stored once, as the lm_head's [hidden, vocab] weight, and read by the
        embedding Gather through a Transpose. onnxruntime folds that constant Transpose into a new
        tensor in every session (113 MB per session for SmolLM2): done here once instead, the
        result given to both sessions like any other weight. The graph gets a placeholder
        initializer for it (external-data reference into the same file, never read: the
        session is given the OrtValue)."""
        import onnxruntime as ort
        from onnx import TensorProto

        g = self.proto.graph
        inits = {t.name: t for t in g.initializer}
        for n in list(g.node):
            if n.op_type != "Transpose" or n.input[0] not in self.values:
                continue
            perm = next((list(a.ints) for a in n.attribute if a.name == "perm"), None)
            src = self.arrays[n.input[0]]
            arr = np.ascontiguousarray(src.transpose(perm) if perm else src.T)
            self.arrays[n.output[0]] = arr
            self.values[n.output[0]] = ort.OrtValue.ortvalue_from_numpy(arr)
            t = TensorProto()
            t.name, t.data_type = n.output[0], inits[n.input[0]].data_type
            t.dims.extend(arr.shape)
            t.data_location = TensorProto.EXTERNAL
            ref = {e.key: e.value for e in inits[n.input[0]].external_data}
            for k, v in (("location", ref.get("location", "")), ("offset", "0"), ("length", str(arr.nbytes))):
                e = t.external_data.add()
                e.key, e.value = k, v
            g.initializer.append(t)
            g.node.remove(n)
            self.folded.append(n.output[0])

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def configure(self, so, names: Sequence[str] | None = None, folder: Path | None = None) -> None:
        """Gives a session these weights (all, or `names`) and turns its prepacking off, so it holds
        no copy of them (the point of sharing: see the module docstring). `folder`: where a graph
        loaded from bytes has its external data (onnxruntime checks the references even though
        every initializer is given)."""
        if folder is not None:
            so.add_session_config_entry(EXTERNAL_FOLDER_CONFIG, str(folder))
        for n in self.values if names is None else names:
            if n in self.values:
                so.add_initializer(n, self.values[n])
        so.add_session_config_entry(PREPACK_CONFIG, "1")
