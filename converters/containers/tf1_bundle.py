"""Read TensorFlow "TensorBundle" checkpoints without importing TensorFlow: find one, list its
tensors, load them.

A TF1/TF2 checkpoint is ``PREFIX.index`` plus ``PREFIX.data-SSSSS-of-NNNNN``.
Importing TensorFlow just to read one costs seconds and hundreds of MB, so this
module speaks the format directly with stdlib + numpy + crc32c:

* ``.index`` is a LevelDB-style SSTable (converters/containers/sstable.py).
* Key ``""`` holds a ``BundleHeaderProto``; every other key is a tensor name
  whose value is a ``BundleEntryProto`` pointing at raw little-endian C-order
  bytes ``(shard_id, offset, size)`` guarded by a *masked* CRC32C
  (converters/containers/tf1_bundle_proto.py decodes both).
* Keys starting with ``\\x00`` are slices of partitioned variables; they are
  not listed (their full-tensor entry is, with ``slices > 0``).

Here: the paths (a prefix from whatever the user points at, the shard files, the ``checkpoint``
state file), the index read and checked against its shards, tensors read with their CRCs.
converters/containers/tf1_bundle_writer.py writes what this reads, byte-identical to TF's own index.
"""

from __future__ import annotations

import codecs
import math
import os
import re
from collections.abc import Iterator, Mapping

import numpy as np

from bert_of.errors import CheckpointError
import bert_of.protobuf as pb
from bert_of.converters.containers import sstable
from bert_of.converters.containers.sstable import Corrupt, table_items
from bert_of.converters.containers.tf1_bundle_proto import (TensorEntry, itemsize, length_checksum, parse_entry, parse_header,
                                                 string_crc)

__all__ = [
    "read_index",
    "read_tensor",
    "iter_tensors",
    "resolve_prefix",
    "read_bytes",
    "data_path",
]


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
        for key, value in table_items(data):
            if key == b"":
                header = parse_header(value)
            elif key[0] == 0:
                continue  # slice of a partitioned variable
            else:
                name = key.decode("utf-8", "surrogateescape")
                entries[name] = parse_entry(name, value)
    except (Corrupt, pb.ProtobufError) as e:
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
        item = itemsize(e.dtype)
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
        actual = sstable.mask(sstable.crc(buf))
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
    if n >= 1 << 32 or raw[pos:pos + 4] != length_checksum(n) or \
            (entry.crc32c is not None and string_crc(raw[pos:pos + 4], raw[pos + 4:]) != entry.crc32c):
        raise CheckpointError(f"{path}: CRC32C mismatch for tensor {entry.name!r}: data file is corrupt "
                              f"or does not belong to this index")
    return raw[pos + 4:]



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

