"""The protobuf wire format the runtime reads and writes ONNX graphs with (models/protowire.py): what it
writes reads back field by field, and bytes that are not a message are a GraphFormatError, never an
IndexError deep in a walker."""
from __future__ import annotations

import pytest

from edgespec.models.protowire import (GraphFormatError, encode_field, encode_varint, fields, packed_varints,
                                       read_varint, spans, text)


def test_what_is_written_reads_back():
    msg = encode_field(1, 300) + encode_field(2, "név") + encode_field(3, encode_field(1, 7)) + encode_field(4, b"")
    got = [(n, wt, v if wt == 0 else bytes(v)) for n, wt, v in fields(memoryview(msg))]
    assert got == [(1, 0, 300), (2, 2, "név".encode()), (3, 2, b"\x08\x07"), (4, 2, b"")]
    assert text(next(v for n, _, v in fields(memoryview(msg)) if n == 2)) == "név"
    assert read_varint(encode_varint(2**63), 0) == (2**63, 10)
    assert packed_varints(memoryview(b"".join(encode_varint(d) for d in (1, 128, 4096)))) == [1, 128, 4096]


def test_spans_give_each_field_as_written():
    msg = encode_field(7, b"abc") + encode_field(14, 5)
    (n1, wt1, s1, p1, e1), (n2, wt2, s2, p2, e2) = spans(memoryview(msg))
    assert (n1, wt1, msg[s1:e1], msg[p1:e1]) == (7, 2, encode_field(7, b"abc"), b"abc")
    assert (n2, wt2, msg[s2:e2], e2) == (14, 0, encode_field(14, 5), len(msg))


@pytest.mark.parametrize("raw, words", [
    (b"\x3a\x10abc", "truncated field"),  # field 7 claims 16 bytes, has 3
    (b"\x08\xff", "truncated varint"),
    (b"\x0b", "unsupported wire type 3"),  # a group
    (b"\x08" + b"\xff" * 11 + b"\x01", "varint too long"),
    (b"\x09\x00\x00", "truncated field"),  # a fixed64 with 2 of its 8 bytes
])
def test_bytes_that_are_not_a_message_are_a_format_error(raw, words):
    with pytest.raises(GraphFormatError, match=words):
        list(fields(memoryview(raw)))
