"""What an older onnxruntime lacks, taken out of a graph as it is loaded: the batching input.

Why: the cpu flavor wires GroupQueryAttention's `query_seqlens` (input 16, export/graph_batch.py) so
that several requests verify in one pass, but only onnxruntime 1.32.0 and later know that input;
1.23.2, the last release with Python 3.10 wheels (a JetPack 6 board, any Ubuntu 22.04), refuses the
whole graph ("has input size 17 not in range [min=7, max=12]"). One bundle serves both: when the
installed onnxruntime's GroupQueryAttention schema has no `query_seqlens`, the loader drops that
input from every GroupQueryAttention node (an absent query_seqlens is the operator's "every query
token is real", what an unbatched runtime feeds anyway: graph_batch.py) and the
`edgespec.padded_queries` metadata with it, so the batched runner takes its other path (a pass per
multi-token row, core/batch_runner.py). Nothing else in the graph changes; the weights stay in
their external data file.

Works on the serialized ModelProto with a small protobuf writer (no onnx package on a board).
Field numbers: ModelProto graph 7, metadata_props 14 (StringStringEntryProto key 1); GraphProto
node 1; NodeProto input 1, op_type 4.
"""
from __future__ import annotations

from typing import Iterator, Sequence

from .graphfacts import GraphFormatError, _varint

GQA = "GroupQueryAttention"
# inputs the loader may drop where the installed onnxruntime lacks them: {index: (name, what is lost)}
STRIPPABLE = {16: ("query_seqlens", "batched verify in one pass (needs onnxruntime 1.32.0 or newer)")}
BATCH_ORT = "1.32.0"  # the first release whose GroupQueryAttention schema has query_seqlens (kernels.FLOOR_SOURCES)
PADDED_QUERIES_KEY = b"edgespec.padded_queries"  # export/graph_batch.py's metadata key


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


def missing_inputs(known: Sequence[str] | None = None, version: str | None = None) -> dict[int, str]:
    """{index: name} of the strippable inputs the installed onnxruntime lacks (from its schema, else
    its version against BATCH_ORT)."""
    if known is None:
        known = gqa_schema_inputs()
    if known is not None:
        return {i: name for i, (name, _) in STRIPPABLE.items() if name not in known}
    from .kernels import version_tuple

    if version is None:
        import onnxruntime

        version = onnxruntime.__version__
    return {} if version_tuple(version) >= version_tuple(BATCH_ORT) else {i: n for i, (n, _) in STRIPPABLE.items()}


# --- protobuf wire format: spans and re-encoding -----------------------------------------------------
def _spans(buf: memoryview) -> Iterator[tuple[int, int, int, int, int]]:
    """(field, wire type, start of the key, start of the payload, end) for each field of a message."""
    pos, end = 0, len(buf)
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            _, after = _varint(buf, pos)
        elif wt == 2:
            n, pos = _varint(buf, pos)
            after = pos + n
        elif wt == 1:
            after = pos + 8
        elif wt == 5:
            after = pos + 4
        else:
            raise GraphFormatError(f"unsupported wire type {wt}")
        if after > end:
            raise GraphFormatError("truncated field")
        yield num, wt, start, pos, after
        pos = after


def _enc_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    return _enc_varint(num << 3 | 2) + _enc_varint(len(payload)) + payload


def _node(buf: memoryview, drop: dict[int, str]) -> bytes | None:
    """The node re-encoded without the inputs in `drop` (and the empty ones trailing after them),
    or None when it is not a GroupQueryAttention wiring any of them."""
    fields = list(_spans(buf))
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
                out += b"".join(_field(1, name) for name in kept)
                done = True
            continue
        out += buf[s:e]
    return bytes(out)


def _graph(buf: memoryview, drop: dict[int, str]) -> tuple[bytes, int]:
    out, changed = bytearray(), 0
    for n, wt, s, p, e in _spans(buf):
        new = _node(buf[p:e], drop) if n == 1 and wt == 2 else None
        if new is None:
            out += buf[s:e]
        else:
            out += _field(1, new)
            changed += 1
    return bytes(out), changed


def strip_inputs(model: bytes, drop: dict[int, str]) -> tuple[bytes, int]:
    """(the model without GroupQueryAttention's inputs in `drop` nor the padded-queries metadata,
    how many nodes changed). With nothing to drop, the model as given and 0."""
    if not drop:
        return model, 0
    buf = memoryview(model)
    out, changed = bytearray(), 0
    for n, wt, s, p, e in _spans(buf):
        if n == 7 and wt == 2:
            g, changed = _graph(buf[p:e], drop)
            out += _field(7, g)
        elif n == 14 and wt == 2 and any(k == 1 and bytes(buf[p:e][kp:ke]) == PADDED_QUERIES_KEY
                                         for k, _, _, kp, ke in _spans(buf[p:e])):
            continue  # the graph no longer batches through its mask
        else:
            out += buf[s:e]
    return (bytes(out), changed) if changed else (model, 0)
