"""Reading a file bert_of did not necessarily write: a regular file's bytes, bounded (``read_bounded``),
JSON with one line per failure, a file's sha256."""

from __future__ import annotations

import hashlib
import json
import os
import stat

from bert_of.errors import BertOfError


def sha256_file(path: str) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks into one reused buffer."""
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    try:
        with open(path, "rb") as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                h.update(view[:n])
    except OSError as e:
        raise BertOfError(f"{path}: cannot read ({e.strerror})") from None
    return h.hexdigest()


MAX_TEXT = 1 << 30  # a text input (JSON, YAML, CSV, vocab) read whole: 1 GiB is more than any real one


def read_bounded(path: str, limit: int, what: str = "file", error: type = BertOfError) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, or ``error`` in one line.
    Opened without blocking (a FIFO does not hang the reader), checked to be a regular file on the
    descriptor read (a symlink to /dev/zero or a device is refused, not read for GBs), its size
    checked before reading, and no more than ``limit`` + 1 bytes read (a file growing meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{path}: is a directory, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: not a regular file (a {what} is one)")
        if st.st_size > limit:
            raise error(f"{path}: {st.st_size} bytes, more than a {what} holds ({limit})")
        try:
            # as many bytes as fstat said (read(n) allocates n up front: never the whole limit), then,
            # for a file that grew meanwhile, the rest a block at a time up to limit + 1
            want = min(limit, st.st_size) + 1
            parts = [f.read(want)]
            n = len(parts[0])
            while n == want and n <= limit:
                block = f.read(min(1 << 20, limit + 1 - n))
                if not block:
                    break
                parts.append(block)
                n += len(block)
                want = n
            raw = b"".join(parts) if len(parts) > 1 else parts[0]
        except OSError as e:
            raise error(f"{path}: cannot read {what} ({e.strerror})") from None
    if len(raw) > limit:
        raise error(f"{path}: grew past {limit} bytes while it was read (a {what} holds fewer)")
    return raw


def read_json(path: str, what: str = "JSON file", error: type = BertOfError, expect: type | None = dict,
              raw: bytes | None = None):
    """Parse ``path`` as JSON (UTF-8, a BOM allowed); any failure is ``error`` with one line naming
    the file. ``expect``: the type the top level must have (None: anything). ``raw``: the file's
    bytes, already read (``path`` then only names it)."""
    if raw is None:
        raw = read_bounded(path, MAX_TEXT, what, error)
    if not raw.strip():
        raise error(f"{path}: empty file (expected a {what})")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to be a {what}") from None
    if expect is not None and not isinstance(data, expect):
        kind = "object" if expect is dict else "array" if expect is list else expect.__name__
        raise error(f"{path}: expected a JSON {kind} ({what})")
    return data
