"""Read and write TensorFlow "TensorBundle" checkpoints without importing TensorFlow.

A TF1/TF2 checkpoint is ``PREFIX.index`` plus ``PREFIX.data-SSSSS-of-NNNNN``.
Importing TensorFlow just to read one costs seconds and hundreds of MB, so this
module speaks the format directly with stdlib + numpy + crc32c:

* ``.index`` is a LevelDB-style SSTable: data blocks of prefix-compressed
  ``(key, value)`` entries with restart points, each block followed by a 5-byte
  trailer (compression byte + masked CRC32C of contents+type byte); then a
  metaindex block (empty), an index block of ``(separator key, BlockHandle)``,
  and a 48-byte footer (two varint BlockHandles, zero padding, 8-byte magic).
* Key ``""`` holds a ``BundleHeaderProto``; every other key is a tensor name
  whose value is a ``BundleEntryProto`` pointing at raw little-endian C-order
  bytes ``(shard_id, offset, size)`` guarded by a *masked* CRC32C.
* Keys starting with ``\\x00`` are slices of partitioned variables; they are
  not listed (their full-tensor entry is, with ``slices > 0``).

Protobufs are decoded/encoded with a tiny wire-format codec below; field numbers
follow tensor_bundle.proto, tensor_shape.proto and versions.proto.  The writer
reproduces TensorFlow's own encoding (proto3 default-omission, block layout and
separator keys), so our index is byte-identical to the one TF writes for the
same tensors.
"""

from __future__ import annotations

import codecs
import dataclasses
import math
import os
import re
import struct
import tempfile
from collections.abc import Iterable, Iterator, Mapping

import crc32c as _crc32c
import numpy as np

from bert_of.errors import CheckpointError
from bert_of.files.atomic import atomic_write, fsync_dir, writes_to
import bert_of.protobuf as pb

__all__ = [
    "TensorEntry",
    "read_index",
    "read_tensor",
    "iter_tensors",
    "write_bundle",
    "resolve_prefix",
    "read_bytes",
]


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

_DT_STRING = 7
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
    _DT_STRING: "string",
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


def _enum_of_dtype(dt: np.dtype) -> int | None:
    if dt.name == "bfloat16":
        return _DT_BFLOAT16
    return _ENUM_OF.get(dt.newbyteorder("<").str.lstrip("<|"))


def _itemsize(dt: np.dtype | str) -> int | None:
    if isinstance(dt, np.dtype):
        return dt.itemsize
    return 2 if dt == "bfloat16" else None


# --------------------------------------------------------------------------
# protobuf wire format: bert_of.protobuf walks it; the messages below are TF's tensor_bundle.proto


class _Corrupt(ValueError):
    """Internal: malformed bytes; turned into a CheckpointError naming the file."""


_M32 = 0xFFFFFFFF


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
            raise _Corrupt("tensor shape has unknown rank")
    return tuple(dims)


def _parse_header(buf) -> dict:
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


def _parse_entry(name: str, buf) -> TensorEntry:
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


def _enc_entry(dt_enum: int, shape: tuple[int, ...], offset: int, size: int, crc: int) -> bytes:
    shape_pb = b"".join(pb.field_bytes(2, pb.field_varint(1, d)) for d in shape)
    return (
        pb.field_varint(1, dt_enum)
        + pb.field_bytes(2, shape_pb)  # always present, even for scalars (TF sets it)
        + pb.field_varint(4, offset)
        + pb.field_varint(5, size)
        + pb.field_fixed32(6, crc)
    )


# Header exactly as TF writes it: num_shards=1, endianness LITTLE (omitted), version{producer: 1}.
_HEADER_ONE_SHARD = pb.field_varint(1, 1) + pb.field_bytes(3, pb.field_varint(1, 1))


# --------------------------------------------------------------------------
# SSTable


_MAGIC = 0xDB4775248B80FB57
_FOOTER_LEN = 48
_TRAILER_LEN = 5
_BLOCK_SIZE = 262144  # TF's table::Options default; matches what SaveV2 emits
_RESTART_INTERVAL = 16


def _mask(crc: int) -> int:
    """TF/LevelDB store CRCs "masked" so a CRC of data containing CRCs stays well-behaved."""
    return ((((crc >> 15) | (crc << 17)) & _M32) + 0xA282EAD8) & _M32


def _crc(data) -> int:
    return _crc32c.crc32c(data)


def _read_handle(buf, pos: int) -> tuple[int, int, int]:
    off, pos = pb.read_varint(buf, pos)
    size, pos = pb.read_varint(buf, pos)
    return off, size, pos


def _block(data: bytes, off: int, size: int, what: str) -> memoryview:
    """Return a block's contents after checking bounds, compression byte and CRC."""
    end = off + size + _TRAILER_LEN
    if end > len(data) - _FOOTER_LEN:
        raise _Corrupt(f"{what} block [{off}, {end}) runs past the end of the table ({len(data)} bytes): truncated index")
    mv = memoryview(data)
    ctype = data[off + size]
    stored = int.from_bytes(data[off + size + 1 : end], "little")
    actual = _mask(_crc(mv[off : off + size + 1]))
    if stored != actual:
        raise _Corrupt(f"{what} block at offset {off} fails its CRC (stored 0x{stored:08x}, computed 0x{actual:08x})")
    if ctype == 1:
        raise _Corrupt(f"{what} block at offset {off} is snappy-compressed, which this reader does not support")
    if ctype != 0:
        raise _Corrupt(f"{what} block at offset {off} has unknown compression type {ctype}")
    return mv[off : off + size]


def _block_entries(block: memoryview) -> Iterator[tuple[bytes, memoryview]]:
    n = len(block)
    if n < 4:
        raise _Corrupt("block too short for its restart count")
    num_restarts = int.from_bytes(block[n - 4 :], "little")
    limit = n - 4 - 4 * num_restarts
    if num_restarts < 1 or limit < 0:
        raise _Corrupt(f"block has an impossible restart count {num_restarts}")
    key = b""
    pos = 0
    while pos < limit:
        shared, pos = pb.read_varint(block, pos)
        unshared, pos = pb.read_varint(block, pos)
        vlen, pos = pb.read_varint(block, pos)
        if shared > len(key) or pos + unshared + vlen > limit:
            raise _Corrupt("block entry overruns its block")
        key = key[:shared] + bytes(block[pos : pos + unshared])
        pos += unshared
        yield key, block[pos : pos + vlen]
        pos += vlen


def _table_items(data: bytes) -> Iterator[tuple[bytes, memoryview]]:
    if len(data) < _FOOTER_LEN:
        raise _Corrupt(f"too short to be a checkpoint index ({len(data)} bytes, footer alone is {_FOOTER_LEN})")
    footer = data[-_FOOTER_LEN:]
    magic = int.from_bytes(footer[-8:], "little")
    if magic != _MAGIC:
        raise _Corrupt(f"bad table magic 0x{magic:016x} (want 0x{_MAGIC:016x}): not a TensorFlow checkpoint index, or truncated")
    _, _, pos = _read_handle(footer, 0)  # metaindex: TF writes it empty; we only check its bounds
    idx_off, idx_size, _ = _read_handle(footer, pos)
    index = _block(data, idx_off, idx_size, "index")
    prev = None
    for _, handle in _block_entries(index):
        off, size, _ = _read_handle(handle, 0)
        for key, value in _block_entries(_block(data, off, size, "data")):
            if prev is not None and key <= prev:
                raise _Corrupt(f"keys out of order ({prev!r} then {key!r})")
            prev = key
            yield key, value


def _separator(start: bytes, limit: bytes) -> bytes:
    """Shortest key k with start <= k < limit (bytewise), as LevelDB/TF pick for index keys."""
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i < n:
        b = start[i]
        if b < 0xFF and b + 1 < limit[i]:
            return start[:i] + bytes([b + 1])
    return start


def _successor(key: bytes) -> bytes:
    """Shortest key >= key: bump the first non-0xff byte and cut there."""
    for i, b in enumerate(key):
        if b != 0xFF:
            return key[:i] + bytes([b + 1])
    return key


class _BlockBuilder:
    def __init__(self, interval: int):
        self.interval = interval
        self.buf = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last = b""
        self.empty = True

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.counter < self.interval:
            n = min(len(self.last), len(key))
            while shared < n and self.last[shared] == key[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buf))
            self.counter = 0
        self.buf += pb.varint(shared) + pb.varint(len(key) - shared) + pb.varint(len(value))
        self.buf += key[shared:] + value
        self.last = key
        self.counter += 1
        self.empty = False

    def size_estimate(self) -> int:
        return len(self.buf) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        return bytes(self.buf) + b"".join(struct.pack("<I", r) for r in self.restarts) + struct.pack("<I", len(self.restarts))


def _build_table(items: Iterable[tuple[bytes, bytes]]) -> bytes:
    """Serialize sorted (key, value) pairs as an uncompressed SSTable, laid out like TF's TableBuilder."""
    out = bytearray()

    def emit(contents: bytes) -> bytes:
        handle = pb.varint(len(out)) + pb.varint(len(contents))
        out.extend(contents)
        out.extend(b"\x00" + struct.pack("<I", _mask(_crc(contents + b"\x00"))))
        return handle

    index = _BlockBuilder(1)
    block = _BlockBuilder(_RESTART_INTERVAL)
    last, pending = None, None
    for key, value in items:
        if pending is not None:
            index.add(_separator(last, key), pending)
            pending = None
        block.add(key, value)
        last = key
        if block.size_estimate() >= _BLOCK_SIZE:
            pending = emit(block.finish())
            block = _BlockBuilder(_RESTART_INTERVAL)
    if not block.empty:
        pending = emit(block.finish())
    if pending is not None:
        index.add(_successor(last), pending)
    meta_handle = emit(_BlockBuilder(_RESTART_INTERVAL).finish())
    index_handle = emit(index.finish())
    footer = (meta_handle + index_handle).ljust(_FOOTER_LEN - 8, b"\x00") + struct.pack("<Q", _MAGIC)
    out.extend(footer)
    return bytes(out)


# --------------------------------------------------------------------------
# paths

_DATA_RE = re.compile(r"^(.*)\.data-\d{5}-of-\d{5}$")
_STATE_RE = re.compile(r'^\s*model_checkpoint_path\s*:\s*"((?:[^"\\]|\\.)*)"\s*$', re.M)


def data_path(prefix: str, shard: int, num_shards: int) -> str:
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


_data_path = data_path


def _from_state_file(d: str) -> str | None:
    state = os.path.join(d, "checkpoint")
    try:
        with open(state, encoding="utf-8") as f:
            m = _STATE_RE.search(f.read())
    except (OSError, UnicodeDecodeError):
        return None
    if not m:
        return None
    p = codecs.escape_decode(m.group(1).encode("utf-8"))[0].decode("utf-8", "surrogateescape")
    # Relative paths are relative to the directory; absolute ones often point at the
    # machine that trained the model, so also try the same name next to the state file.
    for cand in (os.path.join(d, p), os.path.join(d, os.path.basename(p))):
        if os.path.isfile(cand + ".index"):
            return cand
    return None


def resolve_prefix(path) -> str:
    """Turn a prefix, a .index / .data-* path, or a checkpoint directory into a prefix.

    Users point at whatever they have (the directory from a zip, the .index they
    see in a file browser); all of them name one checkpoint unambiguously.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        found = _from_state_file(p)
        if found:
            return found
        idx = sorted(f for f in os.listdir(p) if f.endswith(".index") and os.path.isfile(os.path.join(p, f)))
        if len(idx) == 1:
            return os.path.join(p, idx[0][: -len(".index")])
        if not idx:
            raise CheckpointError(f"{p}: directory holds no TensorFlow checkpoint (no *.index file)")
        shown = ", ".join(idx[:5]) + (", ..." if len(idx) > 5 else "")
        raise CheckpointError(
            f"{p}: directory holds {len(idx)} checkpoints ({shown}) and no usable 'checkpoint' state file; pass one prefix"
        )
    if os.path.isfile(p + ".index"):
        return p
    for ext in (".index", ".meta"):  # .meta: the graph file TF1 Savers write next to the bundle
        if p.endswith(ext) and os.path.isfile(p[: -len(ext)] + ".index"):
            return p[: -len(ext)]
    m = _DATA_RE.match(p)
    if m and os.path.isfile(p):
        if os.path.isfile(m.group(1) + ".index"):
            return m.group(1)
        raise CheckpointError(f"{m.group(1)}.index: checkpoint index not found (data file {p} has no index next to it)")
    if os.path.isfile(p):
        raise CheckpointError(f"{p}: not a TensorFlow checkpoint (expected a prefix with {p}.index, a .index/.data-* file, or a directory)")
    raise CheckpointError(f"{p}.index: checkpoint index not found")


def _prefix(prefix) -> str:
    p = os.fspath(prefix)
    return p if os.path.isfile(p + ".index") else resolve_prefix(p)


# --------------------------------------------------------------------------
# reading


def _read_index_uncached(prefix: str) -> tuple[dict[str, TensorEntry], int]:
    path = prefix + ".index"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint index not found") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read index ({e.strerror})") from None

    header = None
    entries: dict[str, TensorEntry] = {}
    try:
        for key, value in _table_items(data):
            if key == b"":
                header = _parse_header(value)
            elif key[0] == 0:
                continue  # slice of a partitioned variable
            else:
                name = key.decode("utf-8", "surrogateescape")
                entries[name] = _parse_entry(name, value)
    except (_Corrupt, pb.ProtobufError) as e:
        raise CheckpointError(f"{path}: corrupt checkpoint index: {e}") from None

    if header is None:
        raise CheckpointError(f"{path}: corrupt checkpoint index: no bundle header entry")
    if header["endianness"] != 0:
        raise CheckpointError(f"{path}: checkpoint was written big-endian; only little-endian is supported")
    n = header["num_shards"]
    if n < 1:
        raise CheckpointError(f"{path}: corrupt checkpoint index: header says num_shards={n}")
    if header["min_consumer"] > 1 or 1 in header["bad_consumers"]:
        raise CheckpointError(
            f"{path}: checkpoint format version too new (min_consumer={header['min_consumer']}, producer={header['producer']})"
        )
    return entries, n


def _validate(prefix: str, entries: dict[str, TensorEntry], num_shards: int) -> None:
    idx = prefix + ".index"
    shard_sizes: dict[int, int] = {}
    for e in entries.values():
        if not 0 <= e.shard < num_shards:
            raise CheckpointError(f"{idx}: tensor {e.name!r} is in shard {e.shard} but the header says {num_shards} shard(s)")
        if any(d < 0 for d in e.shape):
            raise CheckpointError(f"{idx}: tensor {e.name!r} has invalid shape {e.shape}")
        if e.offset < 0 or e.size < 0:
            raise CheckpointError(f"{idx}: tensor {e.name!r} has invalid offset {e.offset} / size {e.size}")
        item = _itemsize(e.dtype)
        if item is not None and not e.slices:
            want = math.prod(e.shape) * item
            if e.size != want:
                raise CheckpointError(
                    f"{idx}: index/data mismatch for tensor {e.name!r}: shape {e.shape} {e.dtype} needs {want} bytes "
                    f"but the entry records size {e.size}"
                )
        if e.slices:
            continue
        data = _data_path(prefix, e.shard, num_shards)
        if e.shard not in shard_sizes:
            try:
                shard_sizes[e.shard] = os.stat(data).st_size
            except FileNotFoundError:
                raise CheckpointError(f"{data}: data shard missing (needed by tensor {e.name!r} in {idx})") from None
        have = shard_sizes[e.shard]
        if e.offset + e.size > have:
            raise CheckpointError(
                f"{data}: data shard truncated: tensor {e.name!r} needs bytes [{e.offset}, {e.offset + e.size}) "
                f"but the file has {have} bytes"
            )


def read_index(prefix) -> dict[str, TensorEntry]:
    """List every tensor (name -> entry, sorted by name) after checking the index and shard files.

    All structural checks happen here so a broken or mismatched checkpoint fails
    before any conversion work starts, with a message naming the bad file.
    """
    prefix = _prefix(prefix)
    entries, n = _read_index_uncached(prefix)
    for e in entries.values():
        e.num_shards = n
    _validate(prefix, entries, n)
    return entries


def _num_shards(prefix: str, entry: TensorEntry) -> int:
    n = entry.num_shards
    if not n:
        n = _read_index_uncached(prefix)[1]
    return n


def _check_loadable(prefix: str, entry: TensorEntry) -> np.dtype:
    if entry.slices:
        raise CheckpointError(
            f"{prefix}.index: tensor {entry.name!r} is a partitioned variable ({entry.slices} slices); slice assembly is not supported"
        )
    if isinstance(entry.dtype, str) and entry.dtype == "bfloat16":
        raise CheckpointError(f"{prefix}.index: tensor {entry.name!r} is bfloat16 and ml_dtypes is not installed")
    if not isinstance(entry.dtype, np.dtype):
        raise CheckpointError(
            f"{prefix}.index: tensor {entry.name!r} has dtype {entry.dtype}, which is not a numeric weight and is not loaded"
        )
    return entry.dtype


def _read_entry(f, data_path: str, entry: TensorEntry, dtype: np.dtype, verify_crc: bool) -> np.ndarray:
    arr = np.empty(entry.shape, dtype=dtype)
    buf = memoryview(arr.reshape(-1).view(np.uint8))
    if len(buf) != entry.size:
        raise CheckpointError(
            f"{data_path}: index/data mismatch for tensor {entry.name!r}: shape {entry.shape} {dtype} needs {len(buf)} bytes "
            f"but the entry records size {entry.size}"
        )
    try:
        f.seek(entry.offset)
        got = 0
        while got < entry.size:
            n = f.readinto(buf[got:])
            if not n:
                break
            got += n
    except OSError as e:  # EIO, a vanished network file: name the file and the tensor
        raise CheckpointError(f"{data_path}: cannot read tensor {entry.name!r} ({e.strerror or e})") from None
    if got < entry.size:
        raise CheckpointError(
            f"{data_path}: data shard truncated: tensor {entry.name!r} needs bytes [{entry.offset}, {entry.offset + entry.size}) "
            f"but only {got} were readable"
        )
    if verify_crc and entry.crc32c is not None:
        actual = _mask(_crc(buf))
        if actual != entry.crc32c:
            raise CheckpointError(
                f"{data_path}: CRC32C mismatch for tensor {entry.name!r} (index has 0x{entry.crc32c:08x}, data gives 0x{actual:08x}): "
                "data file is corrupt or does not belong to this index"
            )
    return arr


def _open(path: str):
    try:
        return open(path, "rb", buffering=0)  # raw: readinto goes straight into our buffer
    except FileNotFoundError:
        raise CheckpointError(f"{path}: data shard missing") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot open data shard ({e.strerror})") from None


def read_tensor(prefix, entry: TensorEntry, verify_crc: bool = True, data: str | None = None) -> np.ndarray:
    """Load one tensor as a writable C-contiguous array of ``entry.shape``. ``data``: the path that
    reads its shard (a file held open since the index was read), else the shard by name."""
    if data is None:
        prefix = _prefix(prefix)
    dtype = _check_loadable(prefix, entry)
    path = data or _data_path(prefix, entry.shard, _num_shards(prefix, entry))
    with _open(path) as f:
        return _read_entry(f, path, entry, dtype, verify_crc)


def read_bytes(prefix, entry: TensorEntry, data: str | None = None, limit: int = 1 << 28) -> bytes:
    """One DT_STRING scalar (a TF2 checkpoint's ``_CHECKPOINTABLE_OBJECT_GRAPH``): TF stores
    ``[varint length][masked CRC32C of the length as uint32 LE][bytes]``; the entry's CRC runs over
    that uint32, the 4 checksum bytes and the string.
    ``limit``: the largest string read (a hostile length is refused before any allocation)."""
    if data is None:
        prefix = _prefix(prefix)
    path = data or _data_path(prefix, entry.shard, _num_shards(prefix, entry))
    if entry.dtype != "string" or entry.shape != () or entry.slices:
        raise CheckpointError(f"{prefix}.index: tensor {entry.name!r} is not a string scalar")
    if entry.size > limit:
        raise CheckpointError(f"{path}: tensor {entry.name!r} is {entry.size} bytes, more than the {limit} read")
    with _open(path) as f:
        try:
            f.seek(entry.offset)
            raw = f.read(entry.size)
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read tensor {entry.name!r} ({e.strerror or e})") from None
    if len(raw) != entry.size:
        raise CheckpointError(f"{path}: data shard truncated: tensor {entry.name!r} needs {entry.size} bytes")
    try:
        n, pos = pb.read_varint(raw, 0)
    except pb.ProtobufError as e:
        raise CheckpointError(f"{path}: tensor {entry.name!r}: {e}") from None
    if pos + 4 + n != len(raw):
        raise CheckpointError(f"{path}: tensor {entry.name!r}: string length {n} does not fit its {len(raw)} bytes")
    if n >= 1 << 32 or raw[pos:pos + 4] != _length_checksum(n) or \
            (entry.crc32c is not None and _string_crc(raw[pos:pos + 4], raw[pos + 4:]) != entry.crc32c):
        raise CheckpointError(f"{path}: CRC32C mismatch for tensor {entry.name!r}: data file is corrupt "
                              f"or does not belong to this index")
    return raw[pos + 4:]


def _length_checksum(n: int) -> bytes:
    return struct.pack("<I", _mask(_crc(struct.pack("<I", n))))


def _string_entry(value: bytes) -> tuple:
    """(bytes, entry CRC) of a DT_STRING scalar as TF's bundle writer lays it out (:func:`read_bytes`)."""
    checksum = _length_checksum(len(value))
    return pb.varint(len(value)) + checksum + value, _string_crc(checksum, value)


def _string_crc(checksum: bytes, value: bytes) -> int:
    """The entry's masked CRC32C of a string scalar (see :func:`read_bytes`)."""
    return _mask(_crc32c.crc32c(value, _crc32c.crc32c(checksum, _crc(struct.pack("<I", len(value))))))


def iter_tensors(
    prefix, entries=None, verify_crc: bool = True
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, array) in shard/offset order so reads are sequential.

    ``entries`` may be the dict from read_index, an iterable of TensorEntry, or
    of names.  With ``entries=None`` every numeric tensor is yielded and
    non-numeric bookkeeping (e.g. the TF2 ``_CHECKPOINTABLE_OBJECT_GRAPH``
    string) is skipped; explicitly requested non-numeric tensors raise.
    """
    prefix = _prefix(prefix)
    if entries is None:
        chosen = [e for e in read_index(prefix).values() if e.slices or isinstance(e.dtype, np.dtype) or e.dtype == "bfloat16"]
    else:
        if isinstance(entries, Mapping):
            entries = entries.values()
        chosen, index = [], None
        for e in entries:
            if isinstance(e, str):
                if index is None:
                    index = read_index(prefix)
                if e not in index:
                    raise CheckpointError(f"{prefix}.index: no tensor named {e!r}")
                e = index[e]
            chosen.append(e)
    for e in chosen:
        _check_loadable(prefix, e)
    chosen.sort(key=lambda e: (e.shard, e.offset))
    handles = {}
    try:
        for e in chosen:
            f = handles.get(e.shard)
            if f is None:
                path = _data_path(prefix, e.shard, _num_shards(prefix, e))
                f = handles[e.shard] = _open(path)
            yield e.name, _read_entry(f, f.name, e, e.dtype, verify_crc)
    finally:
        for f in handles.values():
            f.close()


# --------------------------------------------------------------------------
# writing


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _write_state_file(d: str, name: str) -> None:
    atomic_write(os.path.join(d, "checkpoint"),
                 f"model_checkpoint_path: {_quote(name)}\nall_model_checkpoint_paths: {_quote(name)}\n")


def write_bundle(prefix, tensors, write_state_file: bool = True) -> None:
    """Write ``PREFIX.index`` + ``PREFIX.data-00000-of-00001`` that TensorFlow loads.

    ``tensors`` is a dict or an iterable of (name, array or bytes: a string scalar); each array is written
    and dropped before the next is requested, so a generator keeps peak memory at
    about one tensor.  Both files are built under temporary names and renamed
    (index last) only when complete; on failure nothing loadable is left behind.
    With ``write_state_file`` the directory's ``checkpoint`` file is pointed at
    this prefix so ``tf.train.latest_checkpoint(dir)`` finds it.
    """
    prefix = os.fspath(prefix)
    d = os.path.dirname(prefix) or "."
    base = os.path.basename(prefix)
    if not base:
        raise CheckpointError(f"{prefix}: checkpoint prefix must name a file, not a directory")
    os.makedirs(d, exist_ok=True)
    final_data = _data_path(prefix, 0, 1)
    final_index = prefix + ".index"
    items = tensors.items() if isinstance(tensors, Mapping) else tensors

    temps: list[str] = []
    data_renamed = False
    try:
        with writes_to(final_data):
            fd, data_tmp = tempfile.mkstemp(dir=d, prefix=f".{base}.data.", suffix=".tmp")
        temps.append(data_tmp)
        records: dict[bytes, bytes] = {}
        offset = 0
        with writes_to(final_data), os.fdopen(fd, "wb") as f:
            for name, arr in items:
                if not isinstance(name, str) or not name or name[0] == "\x00":
                    raise CheckpointError(f"{final_index}: invalid tensor name {name!r} (must be a non-empty string)")
                key = name.encode("utf-8", "surrogateescape")
                if key in records:
                    raise CheckpointError(f"{final_index}: duplicate tensor name {name!r}")
                if isinstance(arr, bytes):  # a string scalar (a TF2 object graph)
                    raw, crc = _string_entry(arr)
                    f.write(raw)
                    records[key] = _enc_entry(_DT_STRING, (), offset, len(raw), crc)
                    offset += len(raw)
                    continue
                arr = np.asarray(arr)
                dt_enum = _enum_of_dtype(arr.dtype)
                if dt_enum is None:
                    raise CheckpointError(f"{final_index}: tensor {name!r} has unsupported dtype {arr.dtype}")
                if arr.dtype.byteorder == ">":
                    arr = arr.astype(arr.dtype.newbyteorder("<"))
                shape = arr.shape
                if not arr.flags.c_contiguous:
                    arr = arr.copy(order="C")
                raw = arr.reshape(-1).view(np.uint8)
                f.write(raw)
                records[key] = _enc_entry(dt_enum, shape, offset, raw.nbytes, _mask(_crc(raw)))
                offset += raw.nbytes
                del arr, raw
            f.flush()
            os.fsync(f.fileno())

        table = _build_table([(b"", _HEADER_ONE_SHARD)] + sorted(records.items()))
        with writes_to(final_index):
            fd, index_tmp = tempfile.mkstemp(dir=d, prefix=f".{base}.index.", suffix=".tmp")
            temps.append(index_tmp)
            with os.fdopen(fd, "wb") as f:
                f.write(table)
                f.flush()
                os.fsync(f.fileno())

        # Drop any old index first: an old index next to new data must never load.
        if os.path.lexists(final_index):
            os.unlink(final_index)
        os.replace(data_tmp, final_data)
        data_renamed = True
        os.replace(index_tmp, final_index)
        data_renamed = False
        temps.clear()
        fsync_dir(d)
    except BaseException:
        for t in temps:
            if os.path.exists(t):
                os.unlink(t)
        if data_renamed and os.path.exists(final_data):
            os.unlink(final_data)
        raise
    if write_state_file:
        _write_state_file(d, base)
