"""Reading a file bert_of did not necessarily write: JSON with one line per failure, a file's sha256."""

from __future__ import annotations

import hashlib
import json

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


def read_json(path: str, what: str = "JSON file", error: type = BertOfError, expect: type | None = dict,
              raw: bytes | None = None):
    """Parse ``path`` as JSON (UTF-8, a BOM allowed); any failure is ``error`` with one line naming
    the file. ``expect``: the type the top level must have (None: anything). ``raw``: the file's
    bytes, already read (``path`` then only names it)."""
    try:
        if raw is None:
            with open(path, "rb") as f:
                raw = f.read()
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror})") from None
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
