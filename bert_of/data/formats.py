"""Pretraining record files in three formats behind one interface: OFRecord (OneFlow), TFRecord of
``tf.train.Example`` (google-research/bert's ``create_pretraining_data.py``, plain or gzip) and
NVIDIA DeepLearningExamples' HDF5 shards. No TensorFlow: Examples are parsed by bert_of.protobuf.

TFRecord framing, per record (little-endian)::

    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
    masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8   (mod 2^32)

``tf.train.Example`` has the OFRecord map one level down, with its own Feature numbers::

    message Example  { Features features = 1; }
    message Features { map<string, Feature> feature = 1; }
    message Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                    Int64List int64_list = 3; } }

NVIDIA's shard: one HDF5 file of datasets ``input_ids`` (int32), ``input_mask``, ``segment_ids``,
``next_sentence_labels`` (int8), ``masked_lm_positions``, ``masked_lm_ids`` (int32), gzip, shaped
[N, seq] / [N, max_predictions] / [N]. It has no weights: NVIDIA's loader predicts the slots before
the first position 0 (position 0, [CLS], is never masked), so ``masked_lm_weights`` is 1.0 there
and 0.0 after; a record whose weights say otherwise cannot be written to HDF5 unchanged (refused).

Every file type offers ``len(f)``, ``f.record(i)`` (``{feature: array}``) and ``f.close()``;
protobuf formats also ``f.raw(i)`` and ``f.parse(i)`` (spans, for batch decoding), HDF5 ``f.rows``.
"""

from __future__ import annotations

import bisect
import gzip
import mmap
import os
import struct
import zlib
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import crc32c as _crc32c
import numpy as np

import bert_of.protobuf as pb
from bert_of.files.owned import register_own_files

from .ofrecord import (OFRecordError, OFRecordWriter, RecordFile, decode_values, encode_records,
                       parse_feature_map)

__all__ = ["FORMATS", "detect", "TFRecordFile", "HDF5File", "TFRecordWriter", "HDF5Writer", "parse_example",
           "decode_example", "encode_examples", "masked_crc", "open_record_file", "record_writer",
           "HDF5_NAMES", "FILE_SUFFIX", "feature_kind_problem"]

FORMATS = ("ofrecord", "tfrecord", "hdf5")
FILE_SUFFIX = {"ofrecord": "", "tfrecord": ".tfrecord", "hdf5": ".hdf5"}
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
GZIP_MAGIC = b"\x1f\x8b"
EXAMPLE_FIELD_KIND = {1: "bytes", 2: "float", 3: "int64"}
EXAMPLE_KIND_FIELD = {v: k for k, v in EXAMPLE_FIELD_KIND.items()}
# NVIDIA's datasets and the dtypes its create_pretraining_data.py writes them in
HDF5_NAMES = {"input_ids": "i4", "input_mask": "i1", "segment_ids": "i1", "masked_lm_positions": "i4",
              "masked_lm_ids": "i4", "next_sentence_labels": "i1"}
_M32 = 0xFFFFFFFF
_HEAD = struct.Struct("<QI")
register_own_files((), (r"part-\d+\.tfrecord(\.gz)?", r"part-\d+\.hdf5"))  # the part files bert_of writes


def masked_crc(data) -> int:
    c = _crc32c.crc32c(data)
    return ((((c >> 15) | (c << 17)) & _M32) + 0xA282EAD8) & _M32


# --------------------------------------------------------------------------- detection


def detect(path: str) -> str:
    """The format of a record file by its first bytes: "tfrecord" (also gzip), "hdf5" or "ofrecord"."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise OFRecordError(f"{path}: cannot read ({e.strerror or e})") from None
    if not head:
        raise OFRecordError(f"{path}: empty file (0 bytes): a reader would skip it silently; remove it")
    if head[:8] == HDF5_MAGIC or _hdf5_after_user_block(path, size):
        return "hdf5"
    if head[:2] == GZIP_MAGIC:
        return "tfrecord"  # a gzip TFRecord (the only compressed format read); checked when opened
    if len(head) == 12:
        n, crc = _HEAD.unpack(head)
        if crc == masked_crc(head[:8]):
            return "tfrecord"
        if n <= size - 8:
            return "ofrecord"
    elif len(head) >= 8 and struct.unpack("<q", head[:8])[0] == size - 8:
        return "ofrecord"  # one short record
    raise OFRecordError(f"{path}: not a pretraining record file: neither a TFRecord (length CRC does not match), "
                        f"gzip, HDF5 nor an OFRecord (first length does not fit the file)")


def _hdf5_after_user_block(path: str, size: int) -> bool:
    """Whether the HDF5 signature is at 512, 1024, 2048, ... bytes: where the library looks for the
    superblock of a file with a user block (h5py's ``userblock_size``), as h5py opens it."""
    at = 512
    try:
        with open(path, "rb") as f:
            while at + 8 <= size:
                if os.pread(f.fileno(), 8, at) == HDF5_MAGIC:
                    return True
                at *= 2
    except OSError:
        return False
    return False


def open_record_file(path: str, fmt: Optional[str] = None):
    """The file's reader (:class:`RecordFile`, :class:`TFRecordFile` or :class:`HDF5File`)."""
    fmt = fmt or detect(path)
    return {"ofrecord": RecordFile, "tfrecord": TFRecordFile, "hdf5": HDF5File}[fmt](path)


# --------------------------------------------------------------------------- tf.train.Example


def parse_example(buf) -> Dict[str, Tuple[str, list]]:
    """Structure of one serialized ``tf.train.Example`` as :func:`~bert_of.data.ofrecord.parse_record`
    returns an OFRecord's: ``{name: (kind, [(wire, start, stop), ...])}``, kinds bytes/float/int64."""
    mv = buf if isinstance(buf, (bytes, bytearray)) else bytes(buf)
    out: dict = {}
    for field, wire, s, e in pb.fields(mv):
        if field == 1 and wire == 2:  # Features; a repeated message field merges (map entries add up)
            parse_feature_map(mv, s, e, EXAMPLE_FIELD_KIND, out)
    return out


def decode_example(buf) -> Dict[str, object]:
    """``{name: values}`` of one serialized ``tf.train.Example``."""
    return {name: decode_values(buf, kind, spans) for name, (kind, spans) in parse_example(buf).items()}


def encode_examples(features: Dict[str, Tuple[str, np.ndarray]]) -> List[bytes]:
    """R serialized ``tf.train.Example`` from ``{name: (kind, values [R, L])}`` (kinds int64/float)."""
    data, lengths = encode_records(features, kind_field=EXAMPLE_KIND_FIELD)
    out, pos, buf = [], 0, data.tobytes()
    for n in lengths.tolist():
        body = buf[pos:pos + n]
        out.append(b"\x0a" + pb.varint(n) + body)
        pos += n
    return out


# --------------------------------------------------------------------------- TFRecord


# gzip TFRecords are read in place: never inflated to disk or whole into memory
GZIP_SNAPSHOT = 1 << 20  # a decompressor snapshot every MiB of output: a random read inflates < 1 MiB first
GZIP_RATIO = 64  # output at most 64x the file (or GZIP_FLOOR): pretraining records deflate 2-5x, zeros 1000x
GZIP_FLOOR = 1 << 22  # (a small file may still inflate to 4 MiB)
MAX_RECORD = 1 << 26  # a TFRecord frame of pretraining data is KiBs; a length beyond 64 MiB is not one
_IN, _OUT = 1 << 16, 1 << 18  # bytes of file read, and of output made, per step


class _GzipStream:
    """Random access to the inflated bytes of a gzip file (one member or several concatenated, as
    ``cat a.gz b.gz`` and TensorFlow's writer make) without staging them. :meth:`scan` inflates it
    once, streamed, handing each piece to a consumer (the frame index, which checks every frame as
    it arrives) and keeping a decompressor snapshot every GZIP_SNAPSHOT bytes of output;
    :meth:`read` inflates from the snapshot before the bytes asked for (or from where the last read
    stopped: sequential reads inflate once). The output is bounded by what the file may produce
    (GZIP_RATIO times its size): a bomb is refused, not inflated."""

    def __init__(self, f, path: str):
        self.fd, self.path = f.fileno(), path
        self.size = os.fstat(self.fd).st_size
        self.limit = max(GZIP_FLOOR, GZIP_RATIO * self.size)
        self.snaps: List[Tuple[int, int, object]] = []  # (output offset, file offset, decompressor or None)
        self.outs: List[int] = []
        self._last = None  # (output offset of piece, piece, state after it): where the last read stopped

    def _corrupt(self, why: str) -> OFRecordError:
        return OFRecordError(f"{self.path}: gzip stream is corrupt or truncated ({why}): not a readable gzip TFRecord")

    def _step(self, state):
        """(piece of output, next state) from ``state`` = (output offset, offset in the file of the
        first byte the decompressor has not consumed, decompressor or None at a member's start);
        piece None at the end of the file. Input is read from the file at that offset every step
        (never kept as a pending tail), so a snapshot of a state resumes it exactly."""
        out, pos, d = state
        if d is None or d.eof:
            if pos >= self.size:
                if d is None and pos == 0:
                    raise self._corrupt("the file is empty")
                return None, state
            if os.pread(self.fd, 2, pos) != GZIP_MAGIC:
                raise self._corrupt(f"the {self.size - pos} byte(s) after byte {pos} are not a gzip member")
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        buf = os.pread(self.fd, _IN, pos)
        if not buf:
            raise self._corrupt("the last member ends early")
        try:
            piece = d.decompress(buf, _OUT)
        except zlib.error as e:
            raise self._corrupt(str(e)) from None
        # at a member's end the bytes after it are in unused_data (and may be in unconsumed_tail too)
        pos += len(buf) - len(d.unused_data if d.eof else d.unconsumed_tail)
        return piece, (out + len(piece), pos, d)

    def scan(self, consume) -> None:
        """Inflate the whole file once, ``consume(piece)`` in order; snapshots kept on the way."""
        state, mark = (0, 0, None), -GZIP_SNAPSHOT
        while True:
            out, pos, d = state
            if out - mark >= GZIP_SNAPSHOT:
                self.snaps.append((out, pos, None if d is None or d.eof else d.copy()))
                self.outs.append(out)
                mark = out
            piece, state = self._step(state)
            if piece is None:
                return
            if state[0] > self.limit:
                raise OFRecordError(f"{self.path}: gzip stream inflates beyond {self.limit:,} bytes ({GZIP_RATIO}x "
                                    f"the file): not pretraining records (a decompression bomb?)")
            consume(piece)

    def read(self, offset: int, n: int) -> bytes:
        """Output bytes [offset, offset + n)."""
        last = self._last
        if last is not None and last[0] <= offset and offset < last[0] + len(last[1]) + 1:
            base, piece, state = last
        else:
            i = bisect.bisect_right(self.outs, offset) - 1
            out, pos, d = self.snaps[i]
            base, piece, state = out, b"", (out, pos, d.copy() if d is not None else None)
        got = bytearray(piece[offset - base:offset - base + n])
        self._last = None  # the state below advances: kept again only once the read is whole
        while len(got) < n:
            base = state[0]
            piece, state = self._step(state)
            if piece is None:
                raise self._corrupt(f"bytes {offset}..{offset + n} are past its end")
            got += piece[:n - len(got)] if offset <= base else piece[offset - base:offset - base + n - len(got)]
        self._last = (base, piece, state) if piece else last
        return bytes(got)


class _FrameIndex:
    """TFRecord frames checked as the bytes arrive (lengths and both CRCs): a corrupt frame 0 fails
    after its first 12 bytes, whatever follows."""

    def __init__(self, path: str, limit: int):
        self.path, self.limit = path, limit
        self.buf, self.base = bytearray(), 0
        self.offsets: List[int] = []
        self.lengths: List[int] = []

    def __call__(self, piece: bytes) -> None:
        self.buf += piece
        buf, pos = self.buf, 0
        while len(buf) - pos >= 12:
            n, lcrc = _HEAD.unpack_from(buf, pos)
            i, at = len(self.offsets), self.base + pos
            if lcrc != masked_crc(bytes(buf[pos:pos + 8])):
                raise OFRecordError(f"{self.path}: record {i} (byte {at}) is corrupt: the length's CRC does not "
                                    f"match (not a TFRecord frame)")
            if n > min(MAX_RECORD, self.limit):
                raise OFRecordError(f"{self.path}: record {i} (byte {at}) says {n:,} bytes, beyond any "
                                    f"pretraining record ({MAX_RECORD:,})")
            if len(buf) - pos < 16 + n:
                break
            data = memoryview(buf)[pos + 12:pos + 12 + n]
            ok = int.from_bytes(buf[pos + 12 + n:pos + 16 + n], "little") == masked_crc(data)
            data.release()
            if not ok:
                raise OFRecordError(f"{self.path}: record {i} (byte {at}) is corrupt: data CRC mismatch")
            self.offsets.append(at + 12)
            self.lengths.append(n)
            pos += 16 + n
        del buf[:pos]
        self.base += pos

    def finish(self) -> Tuple[np.ndarray, np.ndarray]:
        if self.buf:
            raise OFRecordError(f"{self.path}: record {len(self.offsets)} (byte {self.base}) is truncated: "
                                f"{len(self.buf)} byte(s) where a whole TFRecord frame was expected")
        return np.asarray(self.offsets, dtype=np.int64), np.asarray(self.lengths, dtype=np.int64)


class TFRecordFile(RecordFile):
    """Random access to the records of one TFRecord file (plain: memory-mapped; gzip: read in place,
    :class:`_GzipStream`). Every frame's length and both CRCs are checked when the file is opened
    (gzip: as the stream inflates): a corrupt or truncated file fails before training starts."""

    fmt = "tfrecord"  # len(f), close() and the context manager are RecordFile's

    def __init__(self, path: str):  # not RecordFile.__init__: that one indexes OFRecord framing
        self.path = path
        self._f = open(path, "rb")
        self._mm = b""
        self._view = None
        self._gz = None
        try:
            if self._f.read(2) == GZIP_MAGIC:
                self._gz = _GzipStream(self._f, path)
                frames = _FrameIndex(path, self._gz.limit)
                self._gz.scan(frames)
                self.offsets, self.lengths = frames.finish()
                return
            self._f.seek(0)
            size = os.fstat(self._f.fileno()).st_size
            self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            self._view = memoryview(self._mm)
            self.offsets, self.lengths = self._index(self._view)
        except BaseException:
            self.close()
            raise

    def raw(self, i: int) -> bytes:
        if self._gz is None:
            return super().raw(i)
        return self._gz.read(int(self.offsets[i]), int(self.lengths[i]))

    def _index(self, data) -> Tuple[np.ndarray, np.ndarray]:
        size, pos, i = len(data), 0, 0
        offsets, lengths = [], []
        unpack, crc = _HEAD.unpack_from, masked_crc
        while pos < size:
            if pos + 12 > size:
                raise OFRecordError(f"{self.path}: record {i} (byte {pos}) is truncated: {size - pos} byte(s) where "
                                    f"a 12-byte TFRecord header was expected")
            n, lcrc = unpack(data, pos)
            if lcrc != crc(data[pos:pos + 8]):
                raise OFRecordError(f"{self.path}: record {i} (byte {pos}) is corrupt: the length's CRC does not "
                                    f"match (not a TFRecord frame)")
            if n > size - pos - 16:
                raise OFRecordError(f"{self.path}: record {i} (byte {pos}) is truncated: length says {n} bytes, "
                                    f"{max(size - pos - 16, 0)} remain before its CRC")
            stored = int.from_bytes(data[pos + 12 + n:pos + 16 + n], "little")
            if stored != crc(data[pos + 12:pos + 12 + n]):
                raise OFRecordError(f"{self.path}: record {i} (byte {pos}) is corrupt: data CRC mismatch")
            offsets.append(pos + 12)
            lengths.append(n)
            pos += 16 + n
            i += 1
        return np.asarray(offsets, dtype=np.int64), np.asarray(lengths, dtype=np.int64)

    def parse(self, i: int):
        """(raw bytes, :func:`parse_example` of them); a malformed Example names file and record."""
        raw = self.raw(i)
        try:
            return raw, parse_example(raw)
        except ValueError as e:
            raise OFRecordError(f"{self.path}: record {i} is not a valid tf.train.Example ({e})") from None

    def record(self, i: int) -> Dict[str, object]:
        raw, fields = self.parse(i)
        try:
            return {name: decode_values(raw, kind, spans) for name, (kind, spans) in fields.items()}
        except ValueError as e:
            raise OFRecordError(f"{self.path}: record {i} is not a valid tf.train.Example ({e})") from None


class TFRecordWriter:
    """Append serialized records to one TFRecord file (``compress``: gzip, as TF's "GZIP" option)."""

    def __init__(self, path: str, compress: bool = False):
        self.path, self.count = path, 0
        self._raw = open(path, "wb")
        self._f = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0) if compress else self._raw

    def write(self, record: bytes) -> None:
        head = struct.pack("<Q", len(record))
        self._f.write(head + struct.pack("<I", masked_crc(head)) + record + struct.pack("<I", masked_crc(record)))
        self.count += 1

    def close(self) -> None:
        if not self._raw.closed:
            if self._f is not self._raw:
                self._f.close()
            self._raw.flush()
            os.fsync(self._raw.fileno())
            self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------- HDF5


def weights_of_positions(positions: np.ndarray) -> np.ndarray:
    """NVIDIA's reading of a shard without weights: the slots before the first position 0 count."""
    return np.cumprod(positions != 0, axis=-1).astype(np.float32)


def _unstored(ds) -> str:
    """What of a dataset's declared extent has no storage ("" when all of it has): its size is then
    what the file holds, not what a header declares (memory follows the record count)."""
    if ds.size == 0:
        return ""
    if ds.chunks is None:
        return "" if ds.id.get_storage_size() > 0 else "nothing"
    need = 1
    for extent, chunk in zip(ds.shape, ds.chunks):
        need *= -(-extent // chunk)
    have = ds.id.get_num_chunks()
    return "" if have >= need else f"only {have:,} of its {need:,} chunks"


class HDF5File:
    """The records of one NVIDIA HDF5 shard (h5py). Dataset names, dtypes (integers) and shapes are
    checked when the file is opened; ``masked_lm_weights`` is derived (:func:`weights_of_positions`)."""

    fmt = "hdf5"

    def __init__(self, path: str):
        import h5py

        self.path = path
        try:
            self._h = h5py.File(path, "r")
        except Exception as e:  # h5py raises OSError, ValueError, KeyError... for a damaged file
            raise OFRecordError(f"{path}: not a readable HDF5 file ({e})") from None
        try:
            self._ds, n = {}, None
            for name in HDF5_NAMES:
                ds = self._h.get(name)
                if not isinstance(ds, h5py.Dataset):
                    raise OFRecordError(f"{path}: HDF5 shard has no dataset {name!r} (it has: "
                                        f"{', '.join(sorted(self._h.keys())) or 'none'})")
                if ds.dtype.kind not in "iu":
                    raise OFRecordError(f"{path}: dataset {name!r} is {ds.dtype}, expected integers")
                want = (1, 2) if name == "next_sentence_labels" else (2,)
                if ds.ndim not in want or (ds.ndim == 2 and name == "next_sentence_labels" and ds.shape[1] != 1):
                    raise OFRecordError(f"{path}: dataset {name!r} has shape {ds.shape}, expected "
                                        f"{'[N]' if name == 'next_sentence_labels' else '[N, length]'}")
                if n is not None and ds.shape[0] != n:
                    raise OFRecordError(f"{path}: dataset {name!r} has {ds.shape[0]} records, input_ids has {n}")
                missing = _unstored(ds)
                if missing:
                    raise OFRecordError(f"{path}: dataset {name!r} declares {ds.shape[0]:,} records but stores "
                                        f"{missing} (h5py reads what is not stored as zeros): not a whole shard")
                n = ds.shape[0] if n is None else n
                self._ds[name] = ds
            self.n = int(n)
        except BaseException:
            self._h.close()
            raise

    def width(self, name: str) -> int:
        if name == "next_sentence_labels":
            return 1
        return int(self._ds["masked_lm_positions" if name == "masked_lm_weights" else name].shape[1])

    def __len__(self) -> int:
        return self.n

    def stored(self) -> Dict[str, dict]:
        """What the shard holds, as stored: ``{name: {"dtype", "shape": [per record]}}`` (NVIDIA's
        int32/int8, not the int64 :meth:`rows` widens to), and ``masked_lm_weights`` marked as rebuilt
        from ``masked_lm_positions`` (NVIDIA's shards do not hold it)."""
        out = {name: {"dtype": str(ds.dtype), "shape": [self.width(name)], "stored": True}
               for name, ds in sorted(self._ds.items())}
        out["masked_lm_weights"] = {"dtype": "float32", "shape": [self.width("masked_lm_weights")], "stored": False,
                                    "rebuilt_from": "masked_lm_positions"}
        return dict(sorted(out.items()))

    def rows(self, idx: Sequence[int]) -> Dict[str, np.ndarray]:
        """Records ``idx`` (any order, repeats allowed) as ``{feature: int64/float32 [len(idx), L]}``."""
        idx = np.asarray(idx, dtype=np.int64)
        uniq, inv = np.unique(idx, return_inverse=True)
        out = {}
        try:
            for name, ds in self._ds.items():
                a = ds[uniq] if len(uniq) < self.n else ds[()]  # h5py wants increasing indices
                out[name] = np.asarray(a).astype(np.int64).reshape(len(uniq), -1)[inv]
        except (OSError, ValueError) as e:
            raise OFRecordError(f"{self.path}: records {int(uniq[0])}..{int(uniq[-1])} cannot be read ({e})") from None
        out["masked_lm_weights"] = weights_of_positions(out["masked_lm_positions"])
        return out

    def record(self, i: int) -> Dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.rows([i]).items()}

    def close(self) -> None:
        try:
            self._h.close()
        except Exception:  # already closed
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HDF5Writer:
    """One NVIDIA HDF5 shard: rows are collected and written (gzip, NVIDIA's dtypes) on close."""

    def __init__(self, path: str):
        self.path, self.count = path, 0
        self._rows: Dict[str, list] = {k: [] for k in HDF5_NAMES}
        self._closed = False

    def write_batch(self, batch: Dict[str, np.ndarray], where: str = "") -> None:
        """Append records ``{feature: [R, L]}``; refuses a record HDF5 cannot hold unchanged."""
        pos = np.asarray(batch["masked_lm_positions"]).reshape(len(batch["masked_lm_positions"]), -1)
        w = np.asarray(batch["masked_lm_weights"], dtype=np.float32).reshape(pos.shape)
        bad = np.flatnonzero((w != weights_of_positions(pos)).any(axis=1))
        if bad.size:
            raise OFRecordError(f"{where or self.path}: record {self.count + int(bad[0])}: masked_lm_weights "
                                f"{w[bad[0]].tolist()} are not 1 before the first position 0 and 0 after: NVIDIA's "
                                f"HDF5 layout has no weights and would change them")
        for name, dt in HDF5_NAMES.items():
            v = np.asarray(batch[name]).reshape(len(pos), -1)
            info = np.iinfo(dt)
            if v.size and (v.min() < info.min or v.max() > info.max):
                r = int(np.flatnonzero(((v < info.min) | (v > info.max)).any(axis=1))[0])
                raise OFRecordError(f"{where or self.path}: record {self.count + r}: {name} does not fit "
                                    f"NVIDIA's {np.dtype(dt).name}")
            self._rows[name].append(v.astype(dt))
        self.count += len(pos)

    def close(self) -> None:
        if self._closed:
            return
        import h5py

        self._closed = True
        with h5py.File(self.path, "w") as f:
            for name, dt in HDF5_NAMES.items():
                parts = self._rows[name]
                a = np.concatenate(parts) if parts else np.zeros((0, 1), dtype=dt)
                if name == "next_sentence_labels":
                    a = a.reshape(-1)
                f.create_dataset(name, data=a, dtype=dt, compression="gzip")
        with open(self.path, "rb+") as fh:
            os.fsync(fh.fileno())
        self._rows = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------- writing records


OFRECORD_KINDS = {"input_ids": "int32", "input_mask": "int32", "segment_ids": "int32",
                  "masked_lm_positions": "int32", "masked_lm_ids": "int32", "masked_lm_weights": "float",
                  "next_sentence_labels": "int32"}  # what create-pretraining writes
EXAMPLE_KINDS = {k: ("float" if v == "float" else "int64") for k, v in OFRECORD_KINDS.items()}  # Google's


class record_writer:
    """Write pretraining records ``{feature: [R, L]}`` to one file of ``fmt`` (``compress``: gzip
    TFRecord). OFRecord keeps create-pretraining's kinds (int32), TFRecord Google's (int64)."""

    def __init__(self, path: str, fmt: str, compress: bool = False):
        self.fmt = fmt
        if fmt == "ofrecord":
            self._w = OFRecordWriter(path)
        elif fmt == "tfrecord":
            self._w = TFRecordWriter(path, compress)
        elif fmt == "hdf5":
            self._w = HDF5Writer(path)
        else:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")

    @property
    def count(self) -> int:
        return self._w.count

    def write_batch(self, batch: Dict[str, np.ndarray], where: str = "") -> None:
        if self.fmt == "hdf5":
            return self._w.write_batch(batch, where)
        R = len(batch["input_ids"])
        if self.fmt == "ofrecord":
            feats = {k: (OFRECORD_KINDS[k], np.asarray(batch[k]).reshape(R, -1)) for k in OFRECORD_KINDS}
            data, lengths = encode_records(feats)
            buf, pos = data.tobytes(), 0
            for n in lengths.tolist():
                self._w.write(buf[pos:pos + n])
                pos += n
        else:
            feats = {k: (EXAMPLE_KINDS[k], np.asarray(batch[k]).reshape(R, -1)) for k in EXAMPLE_KINDS}
            for rec in encode_examples(feats):
                self._w.write(rec)

    def write_raw(self, record: bytes) -> None:
        self._w.write(record)

    def close(self) -> None:
        self._w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def feature_kind_problem(name: str, kind: Optional[str]) -> Optional[str]:
    """What is wrong with a pretraining feature stored as a ``kind`` list (None: no value list), or
    None. Google's input_fn parses every feature as int64 but masked_lm_weights (float32), and
    TensorFlow refuses a value list of another type ("Data types don't match") or none at all:
    so does bert_of, instead of truncating 7.7 to 7 or reading an absent list as width 0."""
    want = "float" if name == "masked_lm_weights" else "int64"
    if kind is None:
        return f"feature {name!r} has no value list (TensorFlow refuses it)"
    if kind == "bytes":
        return f"feature {name!r} is a bytes_list, expected numbers"
    if (want == "float") != (kind == "float"):
        return (f"feature {name!r} is a {kind} list, expected {want} (TensorFlow refuses it: data types do not "
                f"match; values are never converted)")
    return None


def iter_file_batches(f, features: Sequence[str], batch: int = 1024) -> Iterator[Dict[str, np.ndarray]]:
    """The records of an open record file as ``{feature: array [r, L]}`` chunks (file order),
    each record decoded by the file's own reader (errors name the file and record); a feature
    stored as the wrong kind of list is refused (:func:`feature_kind_problem`)."""
    for lo in range(0, len(f), batch):
        hi = min(lo + batch, len(f))
        if isinstance(f, HDF5File):
            rows = f.rows(range(lo, hi))
        else:
            recs = []
            for i in range(lo, hi):
                raw, fields = f.parse(i)
                for name in features:
                    why = feature_kind_problem(name, fields[name][0]) if name in fields else None
                    if why:
                        raise OFRecordError(f"{f.path}: record {i}: {why}")
                recs.append(f.record(i))
            rows = {}
            for name in features:
                vals = []
                for i, r in zip(range(lo, hi), recs):
                    if name not in r:
                        raise OFRecordError(f"{f.path}: record {i} has no feature {name!r}")
                    vals.append(np.asarray(r[name]))
                if len({v.size for v in vals}) > 1:
                    raise OFRecordError(f"{f.path}: records {lo}..{hi - 1}: feature {name!r} changes length")
                rows[name] = np.stack(vals)
        yield {k: rows[k] for k in features}

