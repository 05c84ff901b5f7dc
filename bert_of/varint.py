"""Protocol-buffer base-128 varints, once: TF's checkpoint index (converters/tf1_bundle.py) and
OFRecord files (bert_of/data/ofrecord.py) both speak them.

A varint is 1 to 10 bytes, 7 bits each, least significant first, high bit set on every byte but
the last; a negative int64 is its 64-bit two's complement (10 bytes).
"""

from __future__ import annotations

_U64 = 1 << 64


def encode(n: int) -> bytes:
    if n < 0:
        n += _U64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode(buf, pos: int, end: int | None = None, error=ValueError) -> tuple[int, int]:
    """(value, position after it) of the varint at ``buf[pos]``; ``error`` (a ValueError) if it runs
    past ``end`` (default: the end of ``buf``) or past 10 bytes."""
    end = len(buf) if end is None else end
    result = shift = 0
    while True:
        if pos >= end:
            raise error("varint runs past the end")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise error("varint longer than 10 bytes")
