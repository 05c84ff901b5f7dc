"""LevelDB's SSTable ("table") format, read and built: what a TensorFlow checkpoint's ``.index`` is.

Data blocks of prefix-compressed ``(key, value)`` entries with restart points, each block followed
by a 5-byte trailer (compression byte + masked CRC32C of contents+type byte); then a metaindex block
(empty), an index block of ``(separator key, BlockHandle)``, and a 48-byte footer (two varint
BlockHandles, zero padding, 8-byte magic). :func:`table_items` walks one (uncompressed, every CRC
checked); :func:`build_table` lays one out as TF's TableBuilder does (block size, restart interval,
separator keys), byte for byte. The keys and values mean nothing here: converters/containers/tf1_bundle.py
reads them as a bundle's entries, converters/containers/tf1_bundle_writer.py writes them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

import crc32c as _crc32c

import bert_of.protobuf as pb


class Corrupt(ValueError):
    """Malformed bytes in a table or its entries; the bundle reader turns it into a CheckpointError
    naming the file."""


_M32 = 0xFFFFFFFF
_MAGIC = 0xDB4775248B80FB57
_FOOTER_LEN = 48
_TRAILER_LEN = 5
_BLOCK_SIZE = 262144  # TF's table::Options default; matches what SaveV2 emits
_RESTART_INTERVAL = 16


def mask(crc: int) -> int:
    """TF/LevelDB store CRCs "masked" so a CRC of data containing CRCs stays well-behaved."""
    return ((((crc >> 15) | (crc << 17)) & _M32) + 0xA282EAD8) & _M32


def crc(data) -> int:
    return _crc32c.crc32c(data)


def _read_handle(buf, pos: int) -> tuple[int, int, int]:
    off, pos = pb.read_varint(buf, pos)
    size, pos = pb.read_varint(buf, pos)
    return off, size, pos


def _block(data: bytes, off: int, size: int, what: str) -> memoryview:
    """Return a block's contents after checking bounds, compression byte and CRC."""
    end = off + size + _TRAILER_LEN
    if end > len(data) - _FOOTER_LEN:
        raise Corrupt(f"{what} block [{off}, {end}) runs past the end of the table ({len(data)} bytes): truncated index")
    mv = memoryview(data)
    ctype = data[off + size]
    stored = int.from_bytes(data[off + size + 1 : end], "little")
    actual = mask(crc(mv[off : off + size + 1]))
    if stored != actual:
        raise Corrupt(f"{what} block at offset {off} fails its CRC (stored 0x{stored:08x}, computed 0x{actual:08x})")
    if ctype == 1:
        raise Corrupt(f"{what} block at offset {off} is snappy-compressed, which this reader does not support")
    if ctype != 0:
        raise Corrupt(f"{what} block at offset {off} has unknown compression type {ctype}")
    return mv[off : off + size]


def _block_entries(block: memoryview) -> Iterator[tuple[bytes, memoryview]]:
    n = len(block)
    if n < 4:
        raise Corrupt("block too short for its restart count")
    num_restarts = int.from_bytes(block[n - 4 :], "little")
    limit = n - 4 - 4 * num_restarts
    if num_restarts < 1 or limit < 0:
        raise Corrupt(f"block has an impossible restart count {num_restarts}")
    key = b""
    pos = 0
    while pos < limit:
        shared, pos = pb.read_varint(block, pos)
        unshared, pos = pb.read_varint(block, pos)
        vlen, pos = pb.read_varint(block, pos)
        if shared > len(key) or pos + unshared + vlen > limit:
            raise Corrupt("block entry overruns its block")
        key = key[:shared] + bytes(block[pos : pos + unshared])
        pos += unshared
        yield key, block[pos : pos + vlen]
        pos += vlen


def table_items(data: bytes) -> Iterator[tuple[bytes, memoryview]]:
    if len(data) < _FOOTER_LEN:
        raise Corrupt(f"too short to be a checkpoint index ({len(data)} bytes, footer alone is {_FOOTER_LEN})")
    footer = data[-_FOOTER_LEN:]
    magic = int.from_bytes(footer[-8:], "little")
    if magic != _MAGIC:
        raise Corrupt(f"bad table magic 0x{magic:016x} (want 0x{_MAGIC:016x}): not a TensorFlow checkpoint index, or truncated")
    _, _, pos = _read_handle(footer, 0)  # metaindex: TF writes it empty; we only check its bounds
    idx_off, idx_size, _ = _read_handle(footer, pos)
    index = _block(data, idx_off, idx_size, "index")
    prev = None
    for _, handle in _block_entries(index):
        off, size, _ = _read_handle(handle, 0)
        for key, value in _block_entries(_block(data, off, size, "data")):
            if prev is not None and key <= prev:
                raise Corrupt(f"keys out of order ({prev!r} then {key!r})")
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


def build_table(items: Iterable[tuple[bytes, bytes]]) -> bytes:
    """Serialize sorted (key, value) pairs as an uncompressed SSTable, laid out like TF's TableBuilder."""
    out = bytearray()

    def emit(contents: bytes) -> bytes:
        handle = pb.varint(len(out)) + pb.varint(len(contents))
        out.extend(contents)
        out.extend(b"\x00" + struct.pack("<I", mask(crc(contents + b"\x00"))))
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
