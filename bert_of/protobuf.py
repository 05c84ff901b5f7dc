"""The protocol-buffer wire format, once: every reader of a serialized proto in bert_of walks it here
(TF checkpoint indexes, OFRecord and tf.train.Example records; SavedModel and ONNX build on it).

Schema-free: this module knows how fields are framed, not what they mean. A message is fields back
to back, each a varint key ``field_number << 3 | wire_type`` then its value:

    wire 0  varint            1..10 bytes, 7 bits each, least significant first, high bit = more
    wire 1  fixed64           8 bytes little-endian
    wire 2  length-delimited  varint byte count, then the bytes (strings, sub-messages, packed lists)
    wire 5  fixed32           4 bytes little-endian

(wire 3/4, the deprecated groups, are refused.) A negative int64/int32 is a 10-byte varint of its
64-bit two's complement (:func:`signed64`).

Hostile input: every length is checked against the end of its enclosing message before anything
is sliced or allocated, a varint stops at 10 bytes, field number 0 and unknown wire types are
errors; the walk is iterative (callers recurse only as deep as their schema). Every failure is a
:class:`ProtobufError` (a ValueError) saying what is wrong; callers add the file and record.

API (small on purpose):
    read_varint(buf, pos, end)      -> (value, next position)
    fields(buf, pos, end)           -> [(field number, wire type, start, stop)], spans into buf
    values(buf)                     -> iterator of (field number, wire type, int | bytes)
    signed64(v)                     unsigned varint value -> int64
    packed_varints(data)            every varint of a packed run, vectorised (uint64 array)
    packed_varint_runs(runs)        many packed runs at once: (values, count per run)
    writer: varint(n), key(num, wire), field_varint(num, v), field_bytes(num, b), field_fixed32(num, v),
            field_fixed64(num, v)
"""

from __future__ import annotations

import struct
from typing import Iterator, List, Sequence, Tuple

import numpy as np

from bert_of.errors import BertOfError

__all__ = ["ProtobufError", "VARINT", "FIXED64", "LEN", "FIXED32", "read_varint", "fields", "values", "signed64",
           "packed_varints", "packed_varint_runs", "varint", "key", "field_varint", "field_bytes",
           "field_fixed32", "field_fixed64"]

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
_U64 = 1 << 64


class ProtobufError(BertOfError, ValueError):
    """Bytes that are not a well-formed protobuf message (what is wrong; the caller names the file)."""


# --------------------------------------------------------------------------- read


def read_varint(buf, pos: int, end: int | None = None) -> Tuple[int, int]:
    """(value, position after it) of the varint at ``buf[pos]``, not reading at or past ``end``
    (default: the end of ``buf``)."""
    end = len(buf) if end is None else end
    result = shift = 0
    while True:
        if pos >= end:
            raise ProtobufError("varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtobufError("varint longer than 10 bytes")


def fields(buf, pos: int = 0, end: int | None = None) -> List[Tuple[int, int, int, int]]:
    """(field number, wire type, start, stop) of each field of the message in ``buf[pos:end]``.

    For wire type 2 ``buf[start:stop]`` is the payload (without its length); for the others it is
    the value's bytes. Nothing is copied, so a caller can decode many records' payloads at once.
    """
    end = len(buf) if end is None else end
    if pos < 0 or end > len(buf) or pos > end:
        raise ProtobufError(f"message span [{pos}, {end}) outside a buffer of {len(buf)} bytes")
    out = []
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:  # the common one-byte key and length, inline: this loop is the data reader's hot path
            pos += 1
        else:
            tag, pos = read_varint(buf, pos, end)
        num, wire = tag >> 3, tag & 7
        if num == 0:
            raise ProtobufError("field number 0")
        if wire == LEN:
            if pos >= end:
                raise ProtobufError(f"field {num}: length runs past the end of its message")
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = read_varint(buf, pos, end)
            if n > end - pos:
                raise ProtobufError(f"field {num}: length {n} runs past the end of its message "
                                    f"({end - pos} bytes left)")
            out.append((num, LEN, pos, pos + n))
            pos += n
        elif wire == VARINT:
            start = pos
            pos = read_varint(buf, pos, end)[1]
            out.append((num, VARINT, start, pos))
        elif wire == FIXED64 or wire == FIXED32:
            width = 8 if wire == FIXED64 else 4
            if width > end - pos:
                raise ProtobufError(f"field {num}: fixed{width * 8} value runs past the end of its message")
            out.append((num, wire, pos, pos + width))
            pos += width
        else:
            raise ProtobufError(f"field {num}: unsupported wire type {wire}")
    return out


def values(buf) -> Iterator[Tuple[int, int, object]]:
    """(field number, wire type, value) of each field of the message ``buf``: int for wire types
    0, 1 and 5 (unsigned; see :func:`signed64`), bytes for wire type 2."""
    for num, wire, s, e in fields(buf):
        if wire == VARINT:
            yield num, wire, read_varint(buf, s, e)[0]
        elif wire == LEN:
            yield num, wire, bytes(buf[s:e])
        else:
            yield num, wire, int.from_bytes(buf[s:e], "little")


def signed64(v: int) -> int:
    """An int64/int32 field's value from its unsigned varint (two's complement)."""
    return v - _U64 if v >= 1 << 63 else v


def packed_varints(data) -> np.ndarray:
    """All varints packed back to back in ``data`` as uint64, vectorised."""
    a = np.frombuffer(data, dtype=np.uint8)
    if a.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if a[-1] & 0x80:
        raise ProtobufError("packed varints end in the middle of a value")
    ends = np.flatnonzero(a < 0x80)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if int((ends - starts).max()) >= 10:
        raise ProtobufError("varint longer than 10 bytes")
    pos = np.arange(a.size) - np.repeat(starts, ends - starts + 1)
    parts = (a & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.add.reduceat(parts, starts)


def packed_varint_runs(runs: Sequence) -> Tuple[np.ndarray, np.ndarray]:
    """Decode many packed-varint runs at once: (all values as uint64, values per run)."""
    if not runs:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    lens = np.fromiter((len(r) for r in runs), dtype=np.int64, count=len(runs))
    data = b"".join(runs)
    a = np.frombuffer(data, dtype=np.uint8)
    bounds = np.cumsum(lens)
    nonempty = lens > 0
    if nonempty.any() and (a[bounds[nonempty] - 1] & 0x80).any():
        raise ProtobufError("packed varints end in the middle of a value")
    vals = packed_varints(data)
    ends = np.flatnonzero(a < 0x80)
    counts = np.diff(np.searchsorted(ends, bounds, side="left"), prepend=0)
    return vals, counts


# --------------------------------------------------------------------------- write


def varint(n: int) -> bytes:
    """The varint of ``n`` (a negative int is written as its 64-bit two's complement)."""
    if n < 0:
        n += _U64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def key(num: int, wire: int) -> bytes:
    return varint(num << 3 | wire)


def field_varint(num: int, v: int, always: bool = False) -> bytes:
    """A proto3 scalar varint field: omitted when zero, as protobuf's serializer does (``always``:
    written anyway, as proto2's set optional fields and ONNX's are)."""
    return varint(num << 3) + varint(v) if v or always else b""


def field_bytes(num: int, b: bytes) -> bytes:
    """A length-delimited field (string, bytes, sub-message, packed list), always written."""
    return varint(num << 3 | LEN) + varint(len(b)) + bytes(b)


def field_fixed32(num: int, v: int, always: bool = False) -> bytes:
    """A proto3 fixed32 scalar (a float's bits: ``struct.unpack("<I", struct.pack("<f", x))``):
    omitted when zero unless ``always``."""
    return varint(num << 3 | FIXED32) + struct.pack("<I", v) if v or always else b""


def field_fixed64(num: int, v: int, always: bool = False) -> bytes:
    """A proto3 fixed64 scalar (a double's bits): omitted when zero unless ``always``."""
    return varint(num << 3 | FIXED64) + struct.pack("<Q", v) if v or always else b""
