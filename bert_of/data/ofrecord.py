"""OFRecord files in pure Python + NumPy: no OneFlow import needed.

File layout (what OneFlow's ``OFRecordReader`` reads): records back to back, each
an int64 little-endian byte count followed by that many bytes of a serialized
``oneflow.OFRecord`` protobuf (``oneflow/core/record/record.proto``)::

    message OFRecord { map<string, Feature> feature = 1; }
    message Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                    DoubleList double_list = 3; Int32List int32_list = 4;
                                    Int64List int64_list = 5; } }
    // every list: `repeated T value = 1` (numeric lists [packed = true])

There is no checksum in the format; a record is checked by its length prefix
and by parsing it. Importing ``oneflow.core.record.record_pb2`` initialises all
of OneFlow (~1 s, ~400 MB per process), so this module speaks the protobuf wire
format itself. :func:`encode_record` writes exactly the bytes of
``record_pb2.OFRecord.SerializeToString(deterministic=True)`` (map entries
sorted by key; tested against protobuf), and :func:`decode_record` accepts any
valid encoding (packed or unpacked lists, entries in any order).
"""

from __future__ import annotations

import mmap
import operator
import os
import struct
from typing import Dict, Iterator, List, Sequence, Tuple, Union

import numpy as np

from bert_of.errors import BertOfError

__all__ = [
    "OFRecordError", "encode_record", "decode_record", "parse_record", "decode_varints",
    "OFRecordWriter", "RecordFile", "index_records", "iter_records", "iter_raw_records",
]

_LEN = struct.Struct("<q")

# Feature.kind field numbers and the NumPy dtype each list decodes to.
KIND_FIELD = {"bytes": 1, "float": 2, "double": 3, "int32": 4, "int64": 5}
FIELD_KIND = {v: k for k, v in KIND_FIELD.items()}
KIND_DTYPE = {"float": np.dtype("<f4"), "double": np.dtype("<f8"), "int32": np.dtype(np.int32),
              "int64": np.dtype(np.int64)}


class OFRecordError(BertOfError):
    """An OFRecord file or record that cannot be read (names file and record)."""


# --------------------------------------------------------------------------- varints


def _varint(n: int) -> bytes:
    if n < 0:
        n &= (1 << 64) - 1  # protobuf: negative int32/int64 are 10-byte two's complement
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf, pos: int, end: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ValueError("varint runs past the end")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")


def decode_varints(data) -> np.ndarray:
    """All varints packed in ``data`` as uint64 (vectorised). Raises ValueError if the last is cut."""
    a = np.frombuffer(data, dtype=np.uint8)
    if a.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if a[-1] & 0x80:
        raise ValueError("packed varints end in the middle of a value")
    ends = np.flatnonzero(a < 0x80)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if int((ends - starts).max()) >= 10:
        raise ValueError("varint longer than 10 bytes")
    pos = np.arange(a.size) - np.repeat(starts, ends - starts + 1)
    parts = (a & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.add.reduceat(parts, starts)


def decode_varint_runs(runs: Sequence) -> Tuple[np.ndarray, np.ndarray]:
    """Decode many packed-varint runs at once: (all values as uint64, values per run)."""
    if not runs:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    lens = np.fromiter((len(r) for r in runs), dtype=np.int64, count=len(runs))
    data = b"".join(runs)
    a = np.frombuffer(data, dtype=np.uint8)
    bounds = np.cumsum(lens)
    nonempty = lens > 0
    if nonempty.any() and (a[bounds[nonempty] - 1] & 0x80).any():
        raise ValueError("packed varints end in the middle of a value")
    values = decode_varints(data)
    ends = np.flatnonzero(a < 0x80)
    counts = np.diff(np.searchsorted(ends, bounds, side="left"), prepend=0)
    return values, counts


# --------------------------------------------------------------------------- encode

_VARINT_CACHE: Dict[int, bytes] = {}


def _varints_py(values: List[int], kind: str) -> bytes:
    """Packed varints of Python ints (token ids are few and repeat: their encodings are cached)."""
    cache = _VARINT_CACHE
    try:
        return b"".join([cache[v] for v in values])
    except (KeyError, TypeError):
        lo, hi = (-(1 << 31), 1 << 31) if kind == "int32" else (-(1 << 63), 1 << 63)
        out = []
        for v in values:
            v = operator.index(v)  # TypeError for non-integers
            b = cache.get(v)
            if b is None:
                if not lo <= v < hi:
                    raise OverflowError(f"{v} is out of {kind} range") from None
                b = _varint(v)
                if 0 <= v < (1 << 21):
                    cache[v] = b
            out.append(b)
        return b"".join(out)


def _encode_list(kind: str, values) -> bytes:
    if kind == "bytes":
        return b"".join(b"\x0a" + _varint(len(x)) + bytes(x) for x in values)
    if kind in ("int32", "int64"):
        if isinstance(values, np.ndarray):
            if values.size and not np.issubdtype(values.dtype, np.integer):
                raise TypeError(f"{kind} feature needs integers, got {values.dtype}")
            values = values.ravel().tolist()
        payload = _varints_py(values, kind)
    else:
        if isinstance(values, np.ndarray):
            payload = np.ascontiguousarray(values.ravel(), dtype=KIND_DTYPE[kind]).tobytes()
        else:
            values = list(values)
            payload = struct.pack(f"<{len(values)}{'f' if kind == 'float' else 'd'}", *values)
    # protobuf writes an empty packed field as nothing at all
    return b"\x0a" + _varint(len(payload)) + payload if payload else b""


def encode_record(features: Dict[str, Tuple[str, object]]) -> bytes:
    """Serialize ``{name: (kind, values)}`` as an OFRecord; kind in int32/int64/float/double/bytes.

    Output equals protobuf's deterministic serialization (map keys sorted by their UTF-8 bytes).
    """
    out = []
    for name in sorted(features, key=lambda s: s.encode("utf-8")):
        kind, values = features[name]
        if kind not in KIND_FIELD:
            raise ValueError(f"unknown feature kind {kind!r} for {name!r}")
        lst = _encode_list(kind, values)
        feat = bytes([(KIND_FIELD[kind] << 3) | 2]) + _varint(len(lst)) + lst
        key = name.encode("utf-8")
        entry = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(feat)) + feat
        out.append(b"\x0a" + _varint(len(entry)) + entry)
    return b"".join(out)


# --------------------------------------------------------------------------- decode


def _skip(buf, pos: int, end: int, wire: int) -> int:
    if wire == 0:
        return _read_varint(buf, pos, end)[1]
    if wire == 1:
        pos += 8
    elif wire == 2:
        n, pos = _read_varint(buf, pos, end)
        pos += n
    elif wire == 5:
        pos += 4
    else:
        raise ValueError(f"unsupported wire type {wire}")
    if pos > end:
        raise ValueError("field runs past the end")
    return pos


def _fields(buf, pos: int, end: int):
    """(field number, wire type, start, stop) of each field in ``buf[pos:end]``.

    For length-delimited fields start/stop bound the payload; for others, the value bytes.
    """
    out = []
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _read_varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == 0:
            raise ValueError("field number 0")
        if wire == 2:
            if pos >= end:
                raise ValueError("length runs past the end")
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = _read_varint(buf, pos, end)
            if pos + n > end:
                raise ValueError("field runs past the end")
            out.append((field, 2, pos, pos + n))
            pos += n
        else:
            start = pos
            pos = _skip(buf, pos, end, wire)
            out.append((field, wire, start, pos))
    return out


def parse_record(buf) -> Dict[str, Tuple[str, List[Tuple[int, int, int]]]]:
    """Structure of one serialized OFRecord: ``{name: (kind, [(wire, start, stop), ...])}``.

    The spans locate the list's ``value`` fields inside ``buf`` (packed runs or single
    values), so callers can decode many records' payloads in one vectorised step.
    Raises ValueError on anything that is not a valid OFRecord.
    """
    mv = buf if isinstance(buf, (bytes, bytearray)) else bytes(buf)
    end = len(mv)
    out = {}
    for field, wire, s, e in _fields(mv, 0, end):
        if field != 1 or wire != 2:
            continue  # unknown field: protobuf keeps and ignores it
        name, kind, spans = "", None, []
        for f2, w2, s2, e2 in _fields(mv, s, e):
            if f2 == 1 and w2 == 2:
                try:
                    name = mv[s2:e2].decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError("feature name is not UTF-8") from None
            elif f2 == 2 and w2 == 2:
                kind, spans = None, []  # last Feature wins, as in protobuf's map parsing
                for f3, w3, s3, e3 in _fields(mv, s2, e2):
                    if f3 not in FIELD_KIND or w3 != 2:
                        continue
                    if FIELD_KIND[f3] != kind:  # oneof: the last kind present wins;
                        kind, spans = FIELD_KIND[f3], []  # the same list twice merges (concatenates)
                    spans.extend((w4, s4, e4) for f4, w4, s4, e4 in _fields(mv, s3, e3) if f4 == 1)
        out[name] = (kind, spans)
    return out


def decode_values(buf, kind: str, spans) -> Union[np.ndarray, List[bytes]]:
    """The values of one feature as a NumPy array (or a list of bytes for bytes_list)."""
    mv = memoryview(buf)
    if kind is None:
        return np.zeros(0, dtype=np.int32)
    if kind == "bytes":
        return [bytes(mv[s:e]) for w, s, e in spans]
    dt = KIND_DTYPE[kind]
    chunks = []
    for wire, s, e in spans:
        if kind in ("int32", "int64"):
            if wire not in (0, 2):  # a packed run, or one unpacked value
                raise ValueError(f"{kind} value with wire type {wire}")
            chunks.append(decode_varints(mv[s:e]).view(np.int64).astype(dt))  # int32: protobuf truncates to 32 bits
        else:
            width = dt.itemsize
            if wire == 2:
                if (e - s) % width:
                    raise ValueError(f"packed {kind} payload of {e - s} bytes")
            elif wire != (5 if width == 4 else 1):
                raise ValueError(f"{kind} value with wire type {wire}")
            chunks.append(np.frombuffer(mv[s:e], dtype=dt))
    if not chunks:
        return np.zeros(0, dtype=dt)
    return np.concatenate(chunks) if len(chunks) > 1 else chunks[0].copy()


def decode_record(buf) -> Dict[str, Union[np.ndarray, List[bytes]]]:
    """``{name: values}`` of one serialized OFRecord. Raises ValueError if it is not one."""
    return {name: decode_values(buf, kind, spans) for name, (kind, spans) in parse_record(buf).items()}


# --------------------------------------------------------------------------- files


class OFRecordWriter:
    """Append records to one OFRecord part file."""

    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "wb")
        self.count = 0

    def write(self, record: bytes) -> None:
        self._f.write(_LEN.pack(len(record)))
        self._f.write(record)
        self.count += 1

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def index_records(path: str, data=None) -> Tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) of every record's payload in an OFRecord file.

    Checks only the framing: a length prefix or payload cut short by the end of the
    file raises :class:`OFRecordError` naming the file and the record index.
    """
    if data is None:
        with open(path, "rb") as f:
            return _index(path, memoryview(f.read()))
    return _index(path, data)


def _index(path: str, data) -> Tuple[np.ndarray, np.ndarray]:
    size = len(data)
    offsets, lengths = [], []
    pos, i = 0, 0
    unpack = _LEN.unpack_from
    while pos < size:
        if pos + 8 > size:
            raise OFRecordError(f"{path}: record {i} (byte {pos}) is truncated: "
                                f"{size - pos} byte(s) where an 8-byte length was expected")
        (n,) = unpack(data, pos)
        if n < 0:
            raise OFRecordError(f"{path}: record {i} (byte {pos}) is corrupt: negative length {n}")
        if pos + 8 + n > size:
            raise OFRecordError(f"{path}: record {i} (byte {pos}) is truncated: length says {n} bytes, "
                                f"{size - pos - 8} remain")
        offsets.append(pos + 8)
        lengths.append(n)
        pos += 8 + n
        i += 1
    return np.asarray(offsets, dtype=np.int64), np.asarray(lengths, dtype=np.int64)


class RecordFile:
    """Random access to the records of one OFRecord file (memory-mapped)."""

    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "rb")
        size = os.fstat(self._f.fileno()).st_size
        self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self._view = memoryview(self._mm)
        try:
            self.offsets, self.lengths = index_records(path, self._view)
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self.offsets)

    def raw(self, i: int) -> bytes:
        o = int(self.offsets[i])
        return self._mm[o:o + int(self.lengths[i])]

    def record(self, i: int) -> Dict[str, Union[np.ndarray, List[bytes]]]:
        try:
            return decode_record(self.raw(i))
        except ValueError as e:
            raise OFRecordError(f"{self.path}: record {i} is not a valid OFRecord ({e})") from None

    def close(self) -> None:
        view, self._view = self._view, None
        try:
            if view is not None:
                view.release()
            if isinstance(self._mm, mmap.mmap):
                self._mm.close()
        except BufferError:
            pass  # a slice is still referenced (e.g. by a traceback): the map closes when it is freed
        self._mm = None
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def iter_raw_records(path: str) -> Iterator[bytes]:
    """Serialized records of a file, streamed; framing errors name the file and record index."""
    with open(path, "rb") as f:
        i, pos = 0, 0
        while True:
            head = f.read(8)
            if not head:
                return
            if len(head) < 8:
                raise OFRecordError(f"{path}: record {i} (byte {pos}) is truncated: "
                                    f"{len(head)} byte(s) where an 8-byte length was expected")
            (n,) = _LEN.unpack(head)
            if n < 0:
                raise OFRecordError(f"{path}: record {i} (byte {pos}) is corrupt: negative length {n}")
            body = f.read(n)
            if len(body) < n:
                raise OFRecordError(f"{path}: record {i} (byte {pos}) is truncated: length says {n} bytes, "
                                    f"{len(body)} remain")
            yield body
            pos += 8 + n
            i += 1


def iter_records(path: str) -> Iterator[Dict[str, Union[np.ndarray, List[bytes]]]]:
    """Decoded records ``{feature: values}`` of one OFRecord file, in file order.

    Pure Python + NumPy (no OneFlow). A truncated or unparsable record raises
    :class:`OFRecordError` naming the file and the record index.
    """
    for i, body in enumerate(iter_raw_records(path)):
        try:
            yield decode_record(body)
        except ValueError as e:
            raise OFRecordError(f"{path}: record {i} is not a valid OFRecord ({e})") from None
