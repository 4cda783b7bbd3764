"""What an older onnxruntime lacks, taken out of a graph as it is loaded: GroupQueryAttention inputs.

One bundle serves every onnxruntime from the floors (kernels.ORT_FLOORS); the loader takes out of the
graph it hands onnxruntime the inputs the installed one cannot take, each where dropping it changes
nothing the runtime relies on (STRIPS):

- `query_seqlens` (input 16, the cpu flavor's batching edit, export/graph_batch.py) exists from
  onnxruntime 1.32.0; 1.23.2, the last release with Python 3.10 wheels (JetPack 6, Ubuntu 22.04),
  refuses the whole graph ("has input size 17 not in range [min=7, max=12]"). Absent, the operator
  takes every query token as real, what an unbatched step feeds anyway; the `edgespec.padded_queries`
  metadata goes with it, so the batched runner verifies a pass per row (core/runner.py).
- `position_ids` (input 9) of a cuda-flavored graph: the CUDA kernel of onnxruntime 1.23 refuses it
  ("position_ids and attention_bias are not supported in GroupQueryAttention cuda kernel.", NVIDIA's
  JetPack 6 wheel 1.23.0). Absent, the kernel derives each token's position from seqlens_k
  (SeqlensToPosIdsPrompt / Token / Interactive in its CUDA library: s, seqlens_k, past + s), which is
  the position the runtime feeds a chain (its length + j). The cuda flavor verifies chains only
  (trees stay on the cpu flavor), so nothing is lost.

Nothing else in the graph changes; the weights stay in their external data file.

Works on the serialized ModelProto with protowire.py (no onnx package on a board).
Field numbers: ModelProto graph 7, metadata_props 14 (StringStringEntryProto key 1); GraphProto
node 1; NodeProto input 1, op_type 4.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .protowire import encode_field, spans

GQA = "GroupQueryAttention"
BATCH_ORT = "1.32.0"  # the first release whose GroupQueryAttention schema has query_seqlens (kernels.FLOOR_SOURCES)
CUDA_POSITIONS_ORT = "1.24.0"  # the first whose CUDA GroupQueryAttention reads position_ids (kernels.FLOOR_SOURCES)
# the graph metadata key (value "1") export/graph_batch.py writes beside its batching edit, which the batched
# runner reads (core/runner.py) and the strip takes out with query_seqlens
PADDED_QUERIES_KEY = "edgespec.padded_queries"
QUERY_SEQLENS_INPUT = 16  # GroupQueryAttention's optional input index of query_seqlens


@dataclass(frozen=True)
class Strip:
    """One GroupQueryAttention input the loader may take out: for graphs of `flavors`, where the installed
    schema lacks `name` (below=None), or where onnxruntime is older than `below`."""

    index: int
    name: str
    lost: str
    flavors: tuple[str, ...]
    below: str | None = None


STRIPS = (
    Strip(QUERY_SEQLENS_INPUT, "query_seqlens", f"batched verify in one pass (onnxruntime {BATCH_ORT} or newer)",
          ("cpu", "cuda")),
    Strip(9, "position_ids", "nothing: the kernel derives chain positions from seqlens_k", ("cuda",),
          below=CUDA_POSITIONS_ORT),
)
STRIPPABLE = {s.index: (s.name, s.lost) for s in STRIPS}


def gqa_schema_inputs() -> tuple[str, ...] | None:
    """The input names of the installed onnxruntime's GroupQueryAttention (None where it cannot say)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as C

        for s in C.get_all_operator_schema():
            if s.name == GQA and s.domain == "com.microsoft":
                return tuple(i.name for i in s.inputs)
    except Exception:  # noqa: BLE001 - a build without schemas: fall back on the version
        return None
    return None


def missing_inputs(known: Sequence[str] | None = None, version: str | None = None,
                   flavor: str | None = "cpu") -> dict[int, str]:
    """{index: name} of the inputs of a `flavor` graph (None: any) that the installed onnxruntime cannot
    take: from its schema (query_seqlens; its version against BATCH_ORT where it lists no schemas) or
    its version (position_ids of a cuda graph)."""
    from .kernels import version_tuple

    if version is None:
        import onnxruntime

        version = onnxruntime.__version__
    if known is None:
        known = gqa_schema_inputs()
    # a graph of unknown flavor loses only what a graph of every flavor may lose
    flavors = {"cpu", "cuda"} if flavor is None else {flavor}
    out = {}
    for s in STRIPS:
        if not flavors <= set(s.flavors):
            continue
        if s.below is not None:
            lacks = version_tuple(version) < version_tuple(s.below)
        elif known is not None:
            lacks = s.name not in known
        else:
            lacks = version_tuple(version) < version_tuple(BATCH_ORT)
        if lacks:
            out[s.index] = s.name
    return out


# --- the edit, on the serialized model ------------------------------------------------------------
def _node(buf: memoryview, drop: dict[int, str]) -> bytes | None:
    """The node re-encoded without the inputs in `drop` (and the empty ones trailing after them),
    or None when it is not a GroupQueryAttention wiring any of them."""
    fields = list(spans(buf))
    if not any(n == 4 and bytes(buf[p:e]) == GQA.encode() for n, _, _, p, e in fields):
        return None
    inputs = [bytes(buf[p:e]) for n, wt, _, p, e in fields if n == 1 and wt == 2]
    if not any(i < len(inputs) and inputs[i] for i in drop):
        return None
    kept = [b"" if i in drop else name for i, name in enumerate(inputs)]
    while kept and not kept[-1]:
        kept.pop()
    out, done = bytearray(), False
    for n, wt, s, p, e in fields:
        if n == 1 and wt == 2:
            if not done:  # inputs are written where the first one was, in order
                out += b"".join(encode_field(1, name) for name in kept)
                done = True
            continue
        out += buf[s:e]
    return bytes(out)


def _graph(buf: memoryview, drop: dict[int, str]) -> tuple[bytes, int]:
    out, changed = bytearray(), 0
    for n, wt, s, p, e in spans(buf):
        new = _node(buf[p:e], drop) if n == 1 and wt == 2 else None
        if new is None:
            out += buf[s:e]
        else:
            out += encode_field(1, new)
            changed += 1
    return bytes(out), changed


def strip_inputs(model: bytes, drop: dict[int, str]) -> tuple[bytes, int]:
    """(the model without GroupQueryAttention's inputs in `drop` nor the padded-queries metadata,
    how many nodes changed). With nothing to drop, the model as given and 0."""
    if not drop:
        return model, 0
    buf = memoryview(model)
    out, changed = bytearray(), 0
    for n, wt, s, p, e in spans(buf):
        if n == 7 and wt == 2:
            g, changed = _graph(buf[p:e], drop)
            out += encode_field(7, g)
        elif n == 14 and wt == 2 and any(k == 1 and bytes(buf[p:e][kp:ke]) == PADDED_QUERIES_KEY.encode()
                                         for k, _, _, kp, ke in spans(buf[p:e])):
            continue  # the graph no longer batches through its mask
        else:
            out += buf[s:e]
    return (bytes(out), changed) if changed else (model, 0)
