"""ONNX's protobuf messages (onnx.proto), written and read as data, without the ``onnx`` package.

Writers for the messages bert_of's graphs use (``TensorProto``, ``AttributeProto``,
``ValueInfoProto``; ``NodeProto`` is converters/formats/onnx/graph.py's ``Graph.op``), fields written even
when zero (ONNX's messages are proto2: a 0 in ``perm`` is data), and :class:`Message`, one message's
fields read from a buffer. The wire format is bert_of.protobuf's.
"""

from __future__ import annotations

import struct

import numpy as np

from bert_of.errors import CheckpointError
import bert_of.protobuf as protobuf
from bert_of.protobuf import LEN, VARINT, ProtobufError

# ONNX's enums (onnx.proto): TensorProto.DataType, AttributeProto.AttributeType
FLOAT, INT64, FLOAT16 = 1, 7, 10  # TensorProto.DataType
ATTR_FLOAT, ATTR_INT, ATTR_TENSOR, ATTR_INTS = 1, 2, 4, 7


def int_field(field: int, n: int) -> bytes:
    """A varint field written even when zero (ONNX's messages are proto2: a 0 in ``perm`` is data)."""
    return protobuf.field_varint(field, n, always=True)


def float_field(field: int, x: float) -> bytes:
    """A float field, written even when zero."""
    return protobuf.field_fixed32(field, struct.unpack("<I", struct.pack("<f", x))[0], always=True)


def len_field(field: int, payload) -> bytes:
    """A length-delimited field: a string (UTF-8), bytes or a sub-message."""
    return protobuf.field_bytes(field, payload.encode("utf-8") if isinstance(payload, str) else payload)


# --------------------------------------------------------------------------- ONNX messages


def tensor_proto(name: str, dims, data_type: int, raw: bytes) -> bytes:
    """TensorProto: dims (1), data_type (2), name (8), raw_data (9)."""
    return b"".join(int_field(1, d) for d in dims) + int_field(2, data_type) + (len_field(8, name) if name else b"") + len_field(9, raw)


def attribute(name: str, value) -> bytes:
    """AttributeProto: name (1), f (2) | i (3) | t (5) | ints (8), type (20)."""
    if isinstance(value, np.ndarray):
        return len_field(1, name) + len_field(5, _constant_tensor(value)) + int_field(20, ATTR_TENSOR)
    if isinstance(value, float):
        return len_field(1, name) + float_field(2, value) + int_field(20, ATTR_FLOAT)
    if isinstance(value, int):
        return len_field(1, name) + int_field(3, value) + int_field(20, ATTR_INT)
    return len_field(1, name) + b"".join(int_field(8, v) for v in value) + int_field(20, ATTR_INTS)


def _constant_tensor(value: np.ndarray) -> bytes:
    data_type = {np.dtype(np.float32): FLOAT, np.dtype(np.int64): INT64}[value.dtype]
    return tensor_proto("", value.shape, data_type, value.astype(value.dtype.newbyteorder("<")).tobytes())


def value_info(name: str, elem_type: int, dims) -> bytes:
    """ValueInfoProto: name (1), type (2) = TypeProto.tensor_type (1) {elem_type (1), shape (2)};
    a dimension is dim_value (1) or dim_param (2)."""
    shape = b"".join(len_field(1, len_field(2, d) if isinstance(d, str) else int_field(1, d)) for d in dims)
    return len_field(1, name) + len_field(2, len_field(1, int_field(1, elem_type) + len_field(2, shape)))

# --------------------------------------------------------------------------- reading


class Message:
    """The fields of one protobuf message in ``buf[start:end]`` (bert_of.protobuf's walk), parsed as
    data: ``fields[number] = [value]``, a varint as an int, a length-delimited field as
    (start, end), a fixed-width one as its bytes."""

    def __init__(self, buf, start: int, end: int, where: str, what: str):
        self.buf, self.fields = buf, {}
        try:
            for number, wire, a, b in protobuf.fields(buf, start, end):
                value = protobuf.read_varint(buf, a, b)[0] if wire == VARINT else (a, b) if wire == LEN \
                    else bytes(buf[a:b])
                self.fields.setdefault(number, []).append(value)
        except ProtobufError as e:
            raise CheckpointError(f"{where}: not a readable ONNX model ({what}: {e})") from None

    def text(self, number: int, default: str = "") -> str:
        span = self.fields.get(number, [None])[-1]
        if span is None:
            return default
        try:
            return bytes(self.buf[span[0]:span[1]]).decode("utf-8")
        except (UnicodeDecodeError, TypeError):
            return "\ufffd"

    def ints(self, number: int) -> list:
        """A repeated int64 field, packed or not."""
        out = []
        for v in self.fields.get(number, []):
            if isinstance(v, int):
                out.append(v)
            elif isinstance(v, tuple):
                pos, end = v
                while pos < end:
                    n, pos = protobuf.read_varint(self.buf, pos, end)
                    out.append(n)
        return out

