"""Reading a file bert_of did not necessarily write: a regular file's bytes, bounded (``read_bounded``),
a user's input however the shell hands it over (``read_input``: a file, ``-``, /dev/stdin, a FIFO or
process substitution), JSON with one line per failure, a file's sha256."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys

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


STDIN = ("-", "/dev/stdin")
_STREAMS: dict = {}  # (device, inode) of a pipe read once -> its bytes (a stream cannot be read twice)


def is_stream(path: str) -> bool:
    """``path`` is standard input (``-``) or a FIFO / pipe (``<(...)``, ``/dev/stdin`` from a pipe):
    read once, front to back, its size unknown until its end."""
    if path == "-":
        return True
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def _stream_key(path: str):
    """(device, inode) of the pipe ``path`` names, without opening it (a FIFO opened again waits)."""
    try:
        st = os.fstat(sys.stdin.fileno()) if path == "-" else os.stat(path)
    except (OSError, ValueError, AttributeError):
        return None
    if path == "-" or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):  # `-` is stdin, whatever it is
        return (st.st_dev, st.st_ino)
    return None


def read_input(path: str, limit: int, what: str = "file", error: type = BertOfError) -> bytes:
    """The bytes of a user's input ``path``: a regular file (:func:`read_bounded`), or standard input
    (``-``, ``/dev/stdin``) or a FIFO (process substitution ``<(...)``), read in blocks up to
    ``limit`` bytes (more: ``error`` in one line). A pipe is read once; asking again in the same
    process (the run's data checked, then read; its hash recorded) returns the same bytes."""
    key = _stream_key(path) if path == "-" or is_stream(path) else None
    if key is not None and key in _STREAMS:
        return _STREAMS[key]
    if path == "-":
        if key is None:
            raise error(f"-: no standard input to read the {what} from")
        f, close = sys.stdin.buffer, False
    elif key is not None:
        try:
            f, close = open(path, "rb"), True  # blocks until a writer opens it: that is what a FIFO is for
        except OSError as e:
            raise error(f"{path}: cannot read {what} ({e.strerror})") from None
    else:
        return read_bounded(path, limit, what, error)
    try:
        st = os.fstat(f.fileno())
        if stat.S_ISREG(st.st_mode):  # `- < rows.csv`: a file after all, its size known first
            if st.st_size - f.tell() > limit:
                raise error(f"{path}: {st.st_size} bytes, more than a {what} holds ({limit})")
        elif not (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
            raise error(f"{path}: not a file or a pipe (a {what} is one)")  # a terminal, /dev/zero
        parts, n = [], 0
        while n <= limit:
            block = f.read(min(1 << 20, limit + 1 - n))
            if not block:
                break
            parts.append(block)
            n += len(block)
        if n > limit:
            raise error(f"{path}: more than {limit} bytes (a {what} holds fewer)")
        raw = b"".join(parts)
        _STREAMS[(st.st_dev, st.st_ino)] = raw  # `-` from a file is read once too (its offset moved)
        return raw
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror})") from None
    finally:
        if close:
            f.close()


def input_sha256(path: str) -> str:
    """Hex SHA-256 of a user's input: a file's (:func:`sha256_file`), or the bytes a pipe or standard
    input gave (:func:`read_input` keeps them: a pipe cannot be read again)."""
    if path == "-" or is_stream(path):
        return hashlib.sha256(read_input(path, MAX_TEXT)).hexdigest()
    return sha256_file(path)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def refuse_surrogates(data, text: str, where: str, error: type = BertOfError) -> None:
    """JSON may spell a lone UTF-16 surrogate (``"\\ud800"``): a str Python holds but no UTF-8 file
    can (writing it fails far from here). ``error`` naming ``where`` and the value, at reading.
    ``text``: the JSON as read (the walk runs only when it spells a surrogate)."""
    if not _SURROGATE_ESCAPE.search(text):
        return
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise error(f"{where}: text {v[max(0, e.start - 20):e.start + 20]!a} holds a lone surrogate "
                            f"({v[e.start]!a}): not a character, it cannot be written as UTF-8") from None


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
    except ValueError as e:  # an integer past Python's digit limit (int_max_str_digits), ...
        raise error(f"{path}: not a {what} ({str(e).split(';')[0]})") from None
    refuse_surrogates(data, text, path, error)
    if expect is not None and not isinstance(data, expect):
        kind = "object" if expect is dict else "array" if expect is list else expect.__name__
        raise error(f"{path}: expected a JSON {kind} ({what})")
    return data
