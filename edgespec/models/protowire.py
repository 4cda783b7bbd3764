"""The protobuf wire format, read and written: the one place edgespec decodes or encodes it.

The runtime reads and edits ONNX graphs without the `onnx` package (a board has none): graphfacts reads
a graph's inputs, outputs and nodes, ortcompat re-encodes the nodes an older onnxruntime cannot take,
and the providers' probe builds a one-MatMul model by hand. All three need only what is here:

- reading: `spans` walks one message's fields (field number, wire type, where the key, the payload and
  the field end), `fields` gives their values (an int for a varint, a memoryview of the payload for a
  length-delimited field, never copied: a graph is read through mmap);
- writing: `encode_varint` and `encode_field` (an int as a varint, bytes or str length-delimited).

Wire types: 0 varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit (3 and 4, groups, are refused).
"""
from __future__ import annotations

from typing import Any, Iterator


class GraphFormatError(ValueError):
    """The bytes are not a readable ONNX model (a truncated or malformed protobuf message)."""


def read_varint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    """(the varint at `pos`, the position after it)."""
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise GraphFormatError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise GraphFormatError("varint too long")


def spans(buf: memoryview) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, start of the key, start of the payload, end) for each field of a message.
    buf[start:end] is the field as written (to copy it unchanged), buf[payload:end] its value."""
    pos, end = 0, len(buf)
    while pos < end:
        start = pos
        key, pos = read_varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            _, after = read_varint(buf, pos)
        elif wt == 2:
            n, pos = read_varint(buf, pos)
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


def fields(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value): an int for varints, a memoryview of the payload for
    length-delimited fields (not copied), None for fixed-width ones."""
    for num, wt, _, p, e in spans(buf):
        if wt == 0:
            yield num, wt, read_varint(buf, p)[0]
        elif wt == 2:
            yield num, wt, buf[p:e]
        else:
            yield num, wt, None


def packed_varints(buf: memoryview) -> list[int]:
    """The values of a packed repeated varint field's payload."""
    out, pos = [], 0
    while pos < len(buf):
        v, pos = read_varint(buf, pos)
        out.append(v)
    return out


def text(buf: memoryview) -> str:
    """A string field's payload (invalid UTF-8 replaced: a name in an error line, never a traceback)."""
    return bytes(buf).decode("utf-8", "replace")


def encode_varint(n: int) -> bytes:
    """n (>= 0) as a protobuf varint."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_field(num: int, value: int | bytes | str) -> bytes:
    """One protobuf field: an int as a varint, bytes or str length-delimited."""
    if isinstance(value, int):
        return encode_varint(num << 3) + encode_varint(value)
    data = value.encode() if isinstance(value, str) else value
    return encode_varint(num << 3 | 2) + encode_varint(len(data)) + data
