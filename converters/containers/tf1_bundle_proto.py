"""TensorFlow's tensor_bundle.proto messages: what a checkpoint index's entries mean, both ways.

``BundleHeaderProto`` (key ``""``: shard count, endianness, version) and ``BundleEntryProto`` (a
tensor's dtype, shape and ``(shard_id, offset, size)`` of raw little-endian C-order bytes guarded by a
*masked* CRC32C) decoded into :class:`TensorEntry` and encoded as TF writes them (proto3
default-omission); the ``DataType`` enum (types.proto) as numpy dtypes; a ``DT_STRING`` scalar's
byte layout in the data file. Field numbers follow tensor_bundle.proto, tensor_shape.proto and
versions.proto; the wire format is bert_of.protobuf's.
"""

from __future__ import annotations

import dataclasses
import struct

import crc32c as _crc32c
import numpy as np

import bert_of.protobuf as pb
from bert_of.converters.containers import sstable
from bert_of.converters.containers.sstable import Corrupt


@dataclasses.dataclass
class TensorEntry:
    """One tensor as recorded in the index.

    ``dtype`` is a numpy dtype for loadable tensors, else a string such as
    ``"string"``.  ``crc32c`` is the stored *masked* CRC32C of the bytes.
    ``slices`` > 0 marks a partitioned variable (data lives in slice entries,
    which we do not assemble).  ``num_shards`` lets read_tensor name the shard
    file without re-reading the header.
    """

    name: str
    dtype: np.dtype | str
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int | None
    slices: int = 0
    num_shards: int = dataclasses.field(default=0, repr=False, compare=False)  # 0: unknown, read header


# --------------------------------------------------------------------------
# dtypes (types.proto DataType enum)

DT_STRING = 7
_DT_BFLOAT16 = 14

# Explicit little-endian so the bytes mean the same on any host.
_NUMERIC_DT = {
    1: np.dtype("<f4"),
    2: np.dtype("<f8"),
    3: np.dtype("<i4"),
    4: np.dtype("u1"),
    5: np.dtype("<i2"),
    6: np.dtype("i1"),
    8: np.dtype("<c8"),
    9: np.dtype("<i8"),
    10: np.dtype("?"),
    17: np.dtype("<u2"),
    18: np.dtype("<c16"),
    19: np.dtype("<f2"),
    22: np.dtype("<u4"),
    23: np.dtype("<u8"),
}
_OTHER_DT = {
    DT_STRING: "string",
    11: "qint8",
    12: "quint8",
    13: "qint32",
    15: "qint16",
    16: "quint16",
    20: "resource",
    21: "variant",
}
_ENUM_OF = {dt.str.lstrip("<|"): e for e, dt in _NUMERIC_DT.items()}

_bfloat16: np.dtype | None = None


def _bf16() -> np.dtype | None:
    """ml_dtypes comes with TF but costs an import; only pay it when a bf16 tensor shows up."""
    global _bfloat16
    if _bfloat16 is None:
        try:
            import ml_dtypes
        except ImportError:
            return None
        _bfloat16 = np.dtype(ml_dtypes.bfloat16)
    return _bfloat16


def _dtype_of_enum(e: int) -> np.dtype | str:
    if e in _NUMERIC_DT:
        return _NUMERIC_DT[e]
    if e == _DT_BFLOAT16:
        return _bf16() or "bfloat16"  # "bfloat16" string: listable, not loadable
    return _OTHER_DT.get(e, f"dtype_enum_{e}")


def enum_of_dtype(dt: np.dtype) -> int | None:
    if dt.name == "bfloat16":
        return _DT_BFLOAT16
    return _ENUM_OF.get(dt.newbyteorder("<").str.lstrip("<|"))


def itemsize(dt: np.dtype | str) -> int | None:
    if isinstance(dt, np.dtype):
        return dt.itemsize
    return 2 if dt == "bfloat16" else None


# --------------------------------------------------------------------------
# the messages (tensor_bundle.proto), read and written


def _parse_shape(buf) -> tuple[int, ...]:
    dims = []
    for num, wt, v in pb.values(buf):
        if num == 2 and wt == 2:
            size = 0
            for dn, dwt, dv in pb.values(v):
                if dn == 1 and dwt == 0:
                    size = pb.signed64(dv)
            dims.append(size)
        elif num == 3 and wt == 0 and v:
            raise Corrupt("tensor shape has unknown rank")
    return tuple(dims)


def parse_header(buf) -> dict:
    h = {"num_shards": 0, "endianness": 0, "producer": 0, "min_consumer": 0, "bad_consumers": []}
    for num, wt, v in pb.values(buf):
        if num == 1 and wt == 0:
            h["num_shards"] = pb.signed64(v)
        elif num == 2 and wt == 0:
            h["endianness"] = v
        elif num == 3 and wt == 2:
            for vn, vwt, vv in pb.values(v):
                if vn == 1 and vwt == 0:
                    h["producer"] = pb.signed64(vv)
                elif vn == 2 and vwt == 0:
                    h["min_consumer"] = pb.signed64(vv)
                elif vn == 3 and vwt == 0:
                    h["bad_consumers"].append(pb.signed64(vv))
                elif vn == 3 and vwt == 2:  # packed repeated int32
                    p = 0
                    while p < len(vv):
                        x, p = pb.read_varint(vv, p)
                        h["bad_consumers"].append(pb.signed64(x))
    return h


def parse_entry(name: str, buf) -> TensorEntry:
    dt_enum, shape, shard, offset, size, crc, slices = 0, (), 0, 0, 0, None, 0
    for num, wt, v in pb.values(buf):
        if num == 1 and wt == 0:
            dt_enum = v
        elif num == 2 and wt == 2:
            shape = _parse_shape(v)
        elif num == 3 and wt == 0:
            shard = pb.signed64(v)
        elif num == 4 and wt == 0:
            offset = pb.signed64(v)
        elif num == 5 and wt == 0:
            size = pb.signed64(v)
        elif num == 6 and wt == 5:
            crc = v
        elif num == 7 and wt == 2:
            slices += 1
    if crc is None and not slices:
        crc = 0  # proto3 omits a zero fixed32, so absent means a (rare) masked CRC of 0
    return TensorEntry(name, _dtype_of_enum(dt_enum), shape, shard, offset, size, crc, slices)


def enc_entry(dt_enum: int, shape: tuple[int, ...], offset: int, size: int, crc: int) -> bytes:
    shape_pb = b"".join(pb.field_bytes(2, pb.field_varint(1, d)) for d in shape)
    return (
        pb.field_varint(1, dt_enum)
        + pb.field_bytes(2, shape_pb)  # always present, even for scalars (TF sets it)
        + pb.field_varint(4, offset)
        + pb.field_varint(5, size)
        + pb.field_fixed32(6, crc)
    )


# Header exactly as TF writes it: num_shards=1, endianness LITTLE (omitted), version{producer: 1}.
HEADER_ONE_SHARD = pb.field_varint(1, 1) + pb.field_bytes(3, pb.field_varint(1, 1))


# --------------------------------------------------------------------------
# a DT_STRING scalar in the data file


def length_checksum(n: int) -> bytes:
    return struct.pack("<I", sstable.mask(sstable.crc(struct.pack("<I", n))))


def string_entry(value: bytes) -> tuple:
    """(bytes, entry CRC) of a DT_STRING scalar as TF's bundle writer lays it out (tf1_bundle.read_bytes)."""
    checksum = length_checksum(len(value))
    return pb.varint(len(value)) + checksum + value, string_crc(checksum, value)


def string_crc(checksum: bytes, value: bytes) -> int:
    """The entry's masked CRC32C of a string scalar (see tf1_bundle.read_bytes)."""
    return sstable.mask(_crc32c.crc32c(value, _crc32c.crc32c(checksum, sstable.crc(struct.pack("<I", len(value))))))

