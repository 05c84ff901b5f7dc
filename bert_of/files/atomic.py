"""Files that appear whole or not at all, and append-safe JSON lines.

- ``atomic_write`` / ``atomic_open``: a temp file beside the target, fsync, rename.
- ``append_jsonl`` / ``read_jsonl``: whole-line appends with fsync; a torn last line (a crash or a
  full disk mid-append) is cut by the next append, with a warning, never glued to.
- ``writes_to``: an OSError while writing becomes one OutputError line naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile

from bert_of.errors import BertOfError, OutputError
from bert_of.runtime.process import at_abrupt_end, uninterrupted
from bert_of.progress import log


def fsync_dir(path: str) -> None:
    """Make a rename inside ``path`` durable (best effort: some filesystems refuse)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def io_error(path: str, e: OSError) -> BertOfError:
    """One line naming ``path``. h5py's errors carry HDF5's multi-line text: only its first line
    is kept, and a full disk is recognised in it too."""
    text = str(e.strerror or e)
    if e.errno == errno.ENOSPC or "No space left on device" in text or "errno = 28," in text:
        return OutputError(f"{path}: no space left on the device")
    return OutputError(f"{path}: cannot write ({text.splitlines()[0] if text.strip() else type(e).__name__})")


@contextlib.contextmanager
def writes_to(path: str):
    """``with writes_to(p): ...``: an OSError in the block becomes one OutputError line naming ``p``."""
    try:
        yield
    except OSError as e:
        raise io_error(path, e) from None


# What this process is writing and has not published yet: staging folders and temp files. Normally
# the with-blocks remove them as an exception unwinds; a process that must end at once (a signal
# while OneFlow's C++ is on the stack, where an exception can abort the process) runs
# ``abandon_writes`` instead (bert_of.runtime.process.at_abrupt_end).
UNFINISHED: dict = {}  # path -> "dir" | "file"


def abandon_writes() -> None:
    """Remove this process's unfinished staging folders and temp files now."""
    for path, kind in list(UNFINISHED.items()):
        UNFINISHED.pop(path, None)
        shutil.rmtree(path, ignore_errors=True) if kind == "dir" else _remove_quietly(path)


at_abrupt_end(abandon_writes)


# --------------------------------------------------------------------------- atomic files


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", encoding: str | None = "utf-8"):
    """``with atomic_open(p) as f: f.write(...)``: ``p`` is replaced only if the block succeeds."""
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = None
    try:
        with uninterrupted():  # a signal lands before the temp file exists or once it is ours to remove
            fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
            UNFINISHED[tmp] = "file"
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as e:
        _remove_quietly(tmp)
        if isinstance(e, OSError):
            raise io_error(path, e) from None
        raise
    finally:
        UNFINISHED.pop(tmp, None)
    fsync_dir(d)


def _remove_quietly(path) -> None:
    if path:
        with contextlib.suppress(OSError):
            os.remove(path)


def atomic_write(path: str, data) -> None:
    """Write ``data`` (str or bytes) to ``path`` atomically."""
    with atomic_open(path, "wb" if isinstance(data, (bytes, bytearray, memoryview)) else "w") as f:
        f.write(data)


def write_json(path: str, obj, indent: int | None = 2) -> None:
    """JSON to ``path`` atomically; NaN/inf are refused (they are not JSON)."""
    text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False)
    atomic_write(path, text + "\n")


# --------------------------------------------------------------------------- append-safe JSON lines


def append_jsonl(path: str, record: dict) -> None:
    """Append one JSON line with fsync. A torn tail left by a crash is cut first (with a warning),
    so the new record never glues onto half a line."""
    line = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise io_error(path, e) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # writers in several processes take turns
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            keep = _last_newline(fd, size)
            log.warning("%s: its last line was cut short (a crash or a full disk?); removing the "
                        "%d-byte fragment before appending", path, size - keep)
            os.ftruncate(fd, keep)
            size = keep
        try:
            n = os.pwrite(fd, line, size)
            if n != len(line):
                raise OSError(errno.ENOSPC, "short write")
            os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # leave no partial line behind
            raise io_error(path, e) from None
    finally:
        os.close(fd)


def _last_newline(fd: int, size: int) -> int:
    """Offset just after the last newline before ``size`` (0 if none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - 65536)
        chunk = os.pread(fd, pos - start, start)
        i = chunk.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def read_jsonl(path: str, what: str = "records") -> list:
    """Every JSON object line of ``path``; bad lines (a torn tail, garbage) are skipped with one
    warning naming them, so one bad line never hides the others."""
    if not os.path.isfile(path):
        return []
    out, bad = [], []
    try:
        with open(path, "rb") as f:
            for i, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw.decode("utf-8"))
                except (ValueError, UnicodeDecodeError, RecursionError):
                    bad.append(i)
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
                else:
                    bad.append(i)
    except OSError as e:
        raise BertOfError(f"{path}: cannot read {what} ({e.strerror})") from None
    if bad:
        log.warning("%s: skipped %d unreadable line(s) (line %s%s)", path, len(bad), bad[0],
                    ", ..." if len(bad) > 1 else "")
    return out


def filter_jsonl(path: str, keep) -> int:
    """Rewrite ``path`` (atomically) with only the records ``keep(record)`` accepts; unreadable
    lines go too. Returns how many records were dropped."""
    records = read_jsonl(path)
    kept = [r for r in records if keep(r)]
    if len(kept) != len(records):
        atomic_write(path, "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in kept))
    return len(records) - len(kept)
