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
import shutil
import struct
from typing import Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from bert_of.errors import BertOfError
import bert_of.protobuf as pb

__all__ = [
    "OFRecordError", "encode_record", "encode_records", "decode_record", "parse_record", "decode_varints",
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


# --------------------------------------------------------------------------- varints (bert_of.protobuf)


_varint = pb.varint
decode_varints = pb.packed_varints
decode_varint_runs = pb.packed_varint_runs


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


# --------------------------------------------------------------------------- encode many


def _varint_len(u: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each value of ``u`` (unsigned), 1..10, as int64."""
    n = np.ones(u.shape, dtype=np.int64)
    top = int(u.max()) if u.size else 0
    k = 1
    while k < 10 and top >= (1 << (7 * k)):
        n += u >= u.dtype.type(1 << (7 * k))
        k += 1
    return n


def _varint_bytes(u: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The varints of ``u`` (unsigned, C order) back to back as uint8; ``n`` = their lengths.

    Each value's varint is built inside one little-endian word (4 or 8 bytes, or a 10-byte row
    for the rare huge/negative values), then the used bytes of all words are kept in order.
    """
    u, n = u.reshape(-1), n.reshape(-1)
    width = int(n.max()) if n.size else 1
    if width == 1:
        return u.astype(np.uint8)
    if width <= 8:
        word = np.dtype("<u4") if width <= 4 else np.dtype("<u8")
        t = word.type
        w = np.zeros(u.size, dtype=word)
        for j in range(width):
            w |= ((u >> t(7 * j)) & t(0x7F)).astype(word) << t(8 * j)
            w |= (n > j + 1).astype(word) << t(8 * j + 7)
        cols = w.view(np.uint8).reshape(u.size, word.itemsize)
    else:
        cols = np.zeros((u.size, width), dtype=np.uint8)
        for j in range(width):
            cols[:, j] = ((u >> u.dtype.type(7 * j)) & u.dtype.type(0x7F)).astype(np.uint8)
            cols[:, j] |= (n > j + 1).astype(np.uint8) << np.uint8(7)
    keep = np.zeros(cols.shape, dtype=bool)
    for j in range(width):  # column by column: a broadcast compare over [values, 1] is slow
        keep[:, j] = n > j
    return cols[keep]


def _unsigned(values: np.ndarray) -> np.ndarray:
    """Integers as the unsigned values protobuf writes as varints (uint32 when they fit)."""
    v = values.astype(np.int64, copy=False)
    if v.size == 0 or (v.min() >= 0 and v.max() < (1 << 32)):
        return v.astype(np.uint32)
    return v.view(np.uint64)  # negative: the 10-byte two's complement, as protobuf


class _Segments:
    """Byte segments of R records, each record the concatenation of its segments in order."""

    def __init__(self, rows: int):
        self.rows, self.parts = rows, []  # (bytes per record [R], their bytes back to back)

    def const(self, data: bytes) -> None:
        self.parts.append((np.full(self.rows, len(data), dtype=np.int64),
                           np.tile(np.frombuffer(data, dtype=np.uint8), self.rows)))

    def varint(self, values: np.ndarray) -> np.ndarray:
        u = _unsigned(values)
        n = _varint_len(u)
        self.parts.append((n, _varint_bytes(u, n)))
        return n

    def raw(self, lengths: np.ndarray, data: np.ndarray) -> None:
        self.parts.append((lengths, data))

    def join(self, framed: bool) -> Tuple[np.ndarray, np.ndarray]:
        """(all records' bytes back to back, record lengths); ``framed``: each preceded by its
        int64 little-endian length, as in an OFRecord file (the lengths then include the 8 bytes)."""
        body = sum(n for n, _ in self.parts) if self.parts else np.zeros(self.rows, dtype=np.int64)
        parts = list(self.parts)
        if framed:
            parts.insert(0, (np.full(self.rows, 8, dtype=np.int64),
                             body.astype("<i8").view(np.uint8)))
        total = body + (8 if framed else 0)
        out = np.empty(int(total.sum()), dtype=np.uint8)
        start = np.zeros(self.rows, dtype=np.int64)  # where each record's next segment goes
        start[1:] = np.cumsum(total)[:-1]
        for n, data in parts:
            if data.size:
                first = np.cumsum(n) - n  # each record's first byte within `data`
                out[np.repeat(start - first, n) + np.arange(data.size)] = data
            start += n
        return out, total


def encode_records(features: Dict[str, Tuple[str, np.ndarray]], framed: bool = False,
                   kind_field: Optional[Dict[str, int]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Serialize R records at once, without a Python loop over values or records.

    ``features``: ``{name: (kind, values [R, L])}`` with kind int32/int64/float/double; every
    record has the same features and list lengths (as pretraining records do). Returns
    (bytes of all records back to back as uint8, length of each record); record ``r`` equals
    ``encode_record({name: (kind, values[r])})`` byte for byte. ``framed=True`` puts each
    record's int64 length before it, as :class:`OFRecordWriter` writes it. ``kind_field``: the
    Feature oneof numbers (default OFRecord's; tf.train.Example's Features map has the same shape).
    """
    kind_field = KIND_FIELD if kind_field is None else kind_field
    rows = {v.shape[0] for _, v in features.values()}
    if len(rows) > 1:
        raise ValueError(f"features have different numbers of records: {sorted(rows)}")
    R = rows.pop() if rows else 0
    seg = _Segments(R)
    for name in sorted(features, key=lambda s: s.encode("utf-8")):
        kind, values = features[name]
        values = np.asarray(values)
        if values.ndim != 2:
            raise ValueError(f"{name}: values must be [records, length], got shape {values.shape}")
        L = values.shape[1]
        if kind in ("int32", "int64"):
            if values.size and not np.issubdtype(values.dtype, np.integer):
                raise TypeError(f"{kind} feature needs integers, got {values.dtype}")
            v = values.astype(np.int64)
            if kind == "int32" and v.size and (v.min() < -(1 << 31) or v.max() >= (1 << 31)):
                raise OverflowError(f"{name}: a value is out of int32 range")
            u = _unsigned(v)
            n = _varint_len(u)
            payload_len = n.sum(axis=1)
            payload = _varint_bytes(u, n)
        elif kind in ("float", "double"):
            dt = KIND_DTYPE[kind]
            payload = np.ascontiguousarray(values, dtype=dt).view(np.uint8).reshape(-1)
            payload_len = np.full(R, L * dt.itemsize, dtype=np.int64)
        else:
            raise ValueError(f"encode_records cannot encode kind {kind!r} ({name!r})")
        key = name.encode("utf-8")
        key_part = b"\x0a" + _varint(len(key)) + key + b"\x12"
        tag = bytes([(kind_field[kind] << 3) | 2])
        if L:  # list = 0x0a varint(payload) payload; protobuf writes an empty list as nothing
            lst_len = 1 + _varint_len(_unsigned(payload_len)) + payload_len
        else:
            lst_len = np.zeros(R, dtype=np.int64)
        feat_len = 1 + _varint_len(_unsigned(lst_len)) + lst_len
        entry_len = len(key_part) + _varint_len(_unsigned(feat_len)) + feat_len
        seg.const(b"\x0a")
        seg.varint(entry_len)
        seg.const(key_part)
        seg.varint(feat_len)
        seg.const(tag)
        seg.varint(lst_len)
        if L:
            seg.const(b"\x0a")
            seg.varint(payload_len)
            seg.raw(payload_len, payload)
    return seg.join(framed)


# --------------------------------------------------------------------------- decode


def parse_record(buf) -> Dict[str, Tuple[str, List[Tuple[int, int, int]]]]:
    """Structure of one serialized OFRecord: ``{name: (kind, [(wire, start, stop), ...])}``.

    The spans locate the list's ``value`` fields inside ``buf`` (packed runs or single
    values), so callers can decode many records' payloads in one vectorised step.
    Raises ValueError on anything that is not a valid OFRecord.
    """
    mv = buf if isinstance(buf, (bytes, bytearray)) else bytes(buf)
    return parse_feature_map(mv, 0, len(mv), FIELD_KIND)


def parse_feature_map(mv, start: int, end: int, field_kind: Dict[int, str], out: Optional[dict] = None
                      ) -> Dict[str, Tuple[str, List[Tuple[int, int, int]]]]:
    """The ``map<string, Feature> feature = 1`` message in ``mv[start:end]``, as :func:`parse_record`
    returns it. ``field_kind``: Feature's oneof field number -> kind (OFRecord's :data:`FIELD_KIND`;
    tf.train.Example's Features has the same shape with bytes 1, float 2, int64 3)."""
    out = {} if out is None else out
    for field, wire, s, e in pb.fields(mv, start, end):
        if field != 1 or wire != 2:
            continue  # unknown field: protobuf keeps and ignores it
        name, kind, spans = "", None, []
        for f2, w2, s2, e2 in pb.fields(mv, s, e):
            if f2 == 1 and w2 == 2:
                try:
                    name = mv[s2:e2].decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError("feature name is not UTF-8") from None
            elif f2 == 2 and w2 == 2:
                kind, spans = None, []  # last Feature wins, as in protobuf's map parsing
                for f3, w3, s3, e3 in pb.fields(mv, s2, e2):
                    if f3 not in field_kind or w3 != 2:
                        continue
                    if field_kind[f3] != kind:  # oneof: the last kind present wins;
                        kind, spans = field_kind[f3], []  # the same list twice merges (concatenates)
                    spans.extend((w4, s4, e4) for f4, w4, s4, e4 in pb.fields(mv, s3, e3) if f4 == 1)
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
        self._f.write(_LEN.pack(len(record)) + record)
        self.count += 1

    def append_framed(self, path: str, count: int) -> None:
        """Append the ``count`` records of ``path``, a file already in this framing (copied by
        the kernel where it can)."""
        self._f.flush()
        with open(path, "rb") as src:
            size, done = os.fstat(src.fileno()).st_size, 0
            try:
                while done < size:
                    sent = os.sendfile(self._f.fileno(), src.fileno(), done, size - done)
                    if sent == 0:
                        break
                    done += sent
            except OSError:
                pass
            if done < size:  # no sendfile here: the rest through Python
                src.seek(done)
                self._f.seek(0, os.SEEK_END)
                shutil.copyfileobj(src, self._f, 1 << 22)
        self._f.seek(0, os.SEEK_END)
        self.count += count

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

    fmt = "ofrecord"

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

    def parse(self, i: int):
        """(raw bytes, :func:`parse_record` of them); a malformed record names file and record."""
        raw = self.raw(i)
        try:
            return raw, parse_record(raw)
        except ValueError as e:
            raise OFRecordError(f"{self.path}: record {i} is not a valid OFRecord ({e})") from None

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
