"""bert_of.protobuf: the one wire-format walker, checked against Google's protobuf and hostile bytes."""

import numpy as np
import pytest

from bert_of import protobuf as pb


def test_fields_and_values_read_what_google_protobuf_writes():
    from google.protobuf import descriptor_pb2  # a real message with varint, string, fixed and sub-message fields

    msg = descriptor_pb2.FieldDescriptorProto(name="w", number=-3, label=3, type=9, json_name="x" * 200,
                                              options=descriptor_pb2.FieldOptions(packed=True, deprecated=True))
    buf = msg.SerializeToString()
    got = list(pb.values(buf))
    assert [(n, w) for n, w, _ in got] == [(1, 2), (3, 0), (4, 0), (5, 0), (8, 2), (10, 2)]
    assert got[0][2] == b"w" and pb.signed64(got[1][2]) == -3 and got[4][2] == b"\x10\x01\x18\x01"
    assert got[5][2] == b"x" * 200  # a two-byte length
    spans = pb.fields(buf)
    assert [buf[s:e] for n, w, s, e in spans if w == 2][0] == b"w"
    # the writer produces the same bytes as protobuf for these fields
    ours = (pb.field_bytes(1, b"w") + pb.field_varint(3, -3) + pb.field_varint(4, 3) + pb.field_varint(5, 9)
            + pb.field_bytes(8, pb.field_varint(2, 1) + pb.field_varint(3, 1)) + pb.field_bytes(10, b"x" * 200))
    assert ours == buf


def test_the_writer_keeps_zeros_when_asked_and_writes_fixed_widths_protobuf_reads():
    from google.protobuf import descriptor_pb2

    assert pb.field_varint(3, 0) == b"" and pb.field_varint(3, 0, always=True) == b"\x18\x00"
    buf = (pb.field_fixed32(1, 0, always=True) + pb.field_fixed64(2, 2**64 - 1) + pb.field_fixed32(3, 7)
           + pb.field_fixed64(4, 0))
    assert [(n, w, v) for n, w, v in pb.values(buf)] == [(1, 5, 0), (2, 1, 2**64 - 1), (3, 5, 7)]
    opts = descriptor_pb2.FieldOptions()
    opts.ParseFromString(pb.field_varint(1, 0, always=True))  # ctype = STRING (0), explicitly present
    assert opts.HasField("ctype") and opts.ctype == 0


def test_packed_varints_match_the_scalar_reader():
    vals = [0, 1, 127, 128, 300, 2**31 - 1, 2**63, 2**64 - 1, 5]
    data = b"".join(pb.varint(v) for v in vals)
    assert pb.packed_varints(data).tolist() == vals
    got, counts = pb.packed_varint_runs([data[:1], b"", data[1:]])
    assert got.tolist() == vals and counts.tolist() == [1, 0, len(vals) - 1]
    assert pb.read_varint(pb.varint(-1), 0) == (2**64 - 1, 10) and pb.signed64(2**64 - 1) == -1
    assert pb.packed_varints(b"").dtype == np.uint64


@pytest.mark.parametrize("buf, says", [
    (b"\x0a\xff\xff\xff\xff\x0f", "length 4294967295 runs past the end"),  # a huge length, nothing allocated
    (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),
    (b"\x08\x80", "varint runs past the end"),
    (b"\x0b", "unsupported wire type 3"),
    (b"\x0c", "unsupported wire type 4"),
    (b"\x0e", "unsupported wire type 6"),
    (b"\x02\x00", "field number 0"),
    (b"\x09\x00\x00", "fixed64 value runs past the end"),
    (b"\x0d\x00", "fixed32 value runs past the end"),
])
def test_hostile_messages_are_one_protobuf_error_each(buf, says):
    with pytest.raises(pb.ProtobufError, match=says):
        list(pb.values(buf))


def test_a_sub_message_cannot_read_past_its_parent():
    inner = pb.field_bytes(1, b"abc")
    outer = pb.field_bytes(2, inner[:-1]) + pb.field_bytes(3, b"c")  # inner length 3 > its 2 bytes
    (_, _, s, e), = pb.fields(outer)[:1]
    with pytest.raises(pb.ProtobufError, match="runs past the end"):
        pb.fields(outer, s, e)
    with pytest.raises(pb.ProtobufError, match="outside a buffer"):
        pb.fields(b"abc", 0, 10)
    with pytest.raises(pb.ProtobufError, match="middle of a value"):
        pb.packed_varints(b"\x80")
