"""Files and directories that readers never see half-written. Every write in bert_of goes here.

- ``atomic_write`` / ``atomic_open``: a file appears whole or not at all (temp file beside it,
  fsync, rename).
- ``publishing(dst)``: a directory is built in a staging folder beside ``dst`` and swapped in by
  one rename; replacing an existing one uses ``renameat2(RENAME_EXCHANGE)``, so a reader racing
  the swap sees the old tree or the new one, never a mix. One writer per destination; a staging
  folder whose owner process is gone is removed by the next write into the same parent.
- ``check_destination``: the rules every destination obeys (``publishing`` applies them): never
  the source, inside it or around it; ``overwrite`` replaces only a folder of bert_of's files.
- ``append_jsonl`` / ``read_jsonl``: whole-line appends with fsync; a torn last line (a crash or a
  full disk mid-append) is cut by the next append, with a warning, never glued to.
- ``sha256_file``, ``read_json``, ``utc_now``, ``bert_of_home``.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import errno
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import stat
import tempfile
import time

from bert_of.errors import BertOfError, OutputError
from bert_of.process import at_abrupt_end, uninterrupted
from bert_of.progress import log


_STAGE_TAG = ".tmp-"  # staging folders are named .<dst name>.tmp-<pid>-<created ns>-<random>


# --------------------------------------------------------------------------- small helpers


def utc_now() -> str:
    """The current UTC time as ISO 8601 to the second, e.g. ``2026-12-01T10:00:00Z``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def bert_of_home() -> str:
    """Where bert_of keeps its zoo cache and results store: ``$BERT_OF_HOME``, else
    ``$XDG_CACHE_HOME/bert_of``, else ``~/.cache/bert_of``."""
    env = os.environ.get("BERT_OF_HOME")
    if env:
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "bert_of")


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
            raw = f.read(limit + 1)
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


class PinnedDir:
    """A directory held open, so that several files read from it come from the same tree even if
    the path is swapped meanwhile (``publishing`` replaces trees with RENAME_EXCHANGE): a reader
    gets the old checkpoint or the new one, never one's config with the other's weights.

    ``open(name)`` opens relative to the held directory; ``path`` names files in messages.
    """

    def __init__(self, path: str):
        self.path = path = os.fspath(path)
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        self._held = []  # files kept open for later readers (hold)
        self._shown = {}  # path that reads through this pin -> the path it stands for (messages)
        self._root = f"/proc/self/fd/{self.fd}" if os.path.isdir("/proc/self/fd") else None
        if self._root:
            self._shown[self._root] = path.rstrip(os.sep) or path

    @classmethod
    def around(cls, path: str) -> "PinnedDir":
        """The tree of a checkpoint at ``path``: the folder itself, or the folder holding a file
        (an .h5) or a TF prefix."""
        return cls(path if os.path.isdir(path) else os.path.dirname(path) or ".")

    def real(self, p: str) -> str:
        """A path that opens ``p`` (``self.path`` or a path under it) in the held tree, for code
        that opens by path (h5py, numpy.fromfile): ``/proc/self/fd/<fd>/...``. A path outside the
        tree (a config beside the folder), or a system without /proc, is ``p`` itself."""
        if not self._root or self.fd is None:
            return p
        rel = os.path.relpath(os.path.abspath(p), os.path.abspath(self.path))
        if rel == os.curdir:
            return self._root
        if rel == os.pardir or rel.startswith(os.pardir + os.sep):
            return p
        return os.path.join(self._root, rel)

    def hold(self, p: str, spare: bool = False) -> str:
        """Open ``p`` (inside the tree: :meth:`real`) now and keep it open while the pin lives; a
        path that reads that very file later, even after the tree is replaced and deleted.
        ``spare``: only while this pin holds fewer than a quarter of the open-file limit (a
        snapshot's thousand variable files), else :meth:`real` (read by name later)."""
        if spare and len(self._held) >= self._budget():
            return self.real(p)
        f = open(self.real(p), "rb")
        self._held.append(f)
        if not self._root:
            return p
        held = f"/proc/self/fd/{f.fileno()}"
        self._shown[held] = self.shown(p)
        return held

    @staticmethod
    def _budget() -> int:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return 256 if soft == resource.RLIM_INFINITY else max(16, soft // 4)

    def shown(self, text: str) -> str:
        """``text`` (a message) with the paths :meth:`real` and :meth:`hold` gave back as the user
        named them."""
        for p, display in sorted(self._shown.items(), key=lambda kv: -len(kv[0])):
            text = re.sub(re.escape(p) + r"(?![0-9])", lambda m: display, text)
        return text

    def open(self, name: str):
        return os.fdopen(os.open(name, os.O_RDONLY, dir_fd=self.fd), "rb")

    def isfile(self, name: str) -> bool:
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=self.fd).st_mode)
        except OSError:
            return False

    def read(self, name: str) -> bytes:
        with self.open(name) as f:
            return f.read()

    def replaced(self) -> bool:
        """True once ``path`` no longer names the held directory (it was swapped out, and is
        perhaps being deleted)."""
        held = os.fstat(self.fd)
        try:
            now = os.stat(self.path)
        except OSError:
            return True
        return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)

    def close(self) -> None:
        for f in self._held:
            f.close()
        self._held = []
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self):  # a Source holding a pin is dropped: its files go with it
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def fsync_dir(path: str) -> None:
    """Make a rename inside ``path`` durable (best effort: some filesystems refuse)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _io_error(path: str, e: OSError) -> BertOfError:
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
        raise _io_error(path, e) from None


# What this process is writing and has not published yet: staging folders and temp files. Normally
# the with-blocks remove them as an exception unwinds; a process that must end at once (a signal
# while OneFlow's C++ is on the stack, where an exception can abort the process) runs
# ``abandon_writes`` instead (bert_of.process.at_abrupt_end).
_UNFINISHED: dict = {}  # path -> "dir" | "file"


def abandon_writes() -> None:
    """Remove this process's unfinished staging folders and temp files now."""
    for path, kind in list(_UNFINISHED.items()):
        _UNFINISHED.pop(path, None)
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
            _UNFINISHED[tmp] = "file"
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as e:
        _remove_quietly(tmp)
        if isinstance(e, OSError):
            raise _io_error(path, e) from None
        raise
    finally:
        _UNFINISHED.pop(tmp, None)
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
        raise _io_error(path, e) from None
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
            raise _io_error(path, e) from None
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


# --------------------------------------------------------------------------- locks


LOCK_NAME = ".bert_of.lock"  # the lock file of a directory one process writes at a time (a run)


@contextlib.contextmanager
def locked(path: str, what: str | None = None, wait: bool = False):
    """Hold an exclusive lock on ``path`` (a lock file) for the block.

    ``wait=False``: fail at once with one line naming the holder's pid and command.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise _held(fd, path, what) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {_command()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def check_unlocked(path: str, what: str | None = None) -> None:
    """Fail at once, naming the holder, when another process holds the lock file ``path``
    (creates nothing: for a parent about to launch the processes that take the lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _held(fd, path, what) from None
    finally:
        os.close(fd)


def _held(fd: int, path: str, what) -> OutputError:
    holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
    return OutputError(f"{what or path}: another bert_of process is writing it ({holder})")


def _command(pid="self") -> str:
    """The command line of process ``pid`` as a user typed it (``python -m`` dropped)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if len(args) > 2 and args[1] == "-m":
        args = args[2:]
    elif args:
        args[0] = os.path.basename(args[0])
    return " ".join(" ".join(args).split())[:300]


# --------------------------------------------------------------------------- destinations
#
# What bert_of writes into the folders it publishes. ``overwrite`` replaces a folder only when
# everything in it is bert_of's (or it holds nothing), so a mistyped destination never takes the
# user's own files with it. The standard files of every format, of pretraining data and of runs are
# known by name (a published folder then holds exactly its format's files, what other tools, content
# hashes and zoo manifests expect); anything else bert_of writes (tokenizer files beside an HF
# checkpoint, sidecars) is listed in FILES_MANIFEST in the published folder.

OWN_FILES = frozenset({
    "config.json", "vocab.txt", "model.safetensors", "optimizer.safetensors",  # bert_of, HF
    "bert_config.json", "checkpoint",  # TF, with <prefix>.index and <prefix>.data-NNNNN-of-NNNNN
    "tf_model.h5",  # Keras
    "out", "meta", "snapshot_done",  # lazy OneFlow snapshots: a folder per variable
    "pickled_data",  # OneFlow's flow.save folders, with tensor_N/out + meta
    "bert_of_data.json",  # pretraining data, with part-NNNNN
    "train_args.json", "trainer_state.json", "manifest.json", "metrics.jsonl", "zoo_metadata.json",  # runs
})
_OWN_PATTERN = re.compile(r"part-\d+|.+\.index|.+\.data-\d+-of-\d+|\.bert_of.*", re.DOTALL)
ZOO_MANIFEST = "zoo_manifest.json"  # a zoo cache entry is the zoo's, whatever its archive held
FILES_MANIFEST = ".bert_of-files.json"  # {"files": [relative paths]}: what else bert_of wrote here


def _own_by_name(name: str) -> bool:
    return name in OWN_FILES or bool(_OWN_PATTERN.fullmatch(name))


def record_files(folder: str) -> None:
    """List in ``folder``'s FILES_MANIFEST the files under it that are not bert_of's by name (none:
    no manifest). Called on every staged folder just before it is published. A zoo cache entry is
    the zoo's as a whole (its ZOO_MANIFEST says so): nothing to list."""
    if os.path.isfile(os.path.join(folder, ZOO_MANIFEST)):
        return
    extra = []
    for d, dirs, files in os.walk(folder):
        dirs.sort()
        for n in sorted(files):
            if not _own_by_name(n):
                extra.append(os.path.relpath(os.path.join(d, n), folder).replace(os.sep, "/"))
    if extra:
        atomic_write(os.path.join(folder, FILES_MANIFEST), json.dumps({"files": extra}, indent=1) + "\n")


def _listed(d: str) -> set:
    """The relative paths the FILES_MANIFEST in ``d`` lists (nothing when absent or not ours)."""
    try:
        with open(os.path.join(d, FILES_MANIFEST), encoding="utf-8") as f:
            files = json.load(f).get("files")
    except (OSError, ValueError, AttributeError):
        return set()
    return {f for f in files if isinstance(f, str)} if isinstance(files, list) else set()


def foreign_entry(path: str):
    """The first file under the folder ``path`` that bert_of did not write (its path relative
    to ``path``), or None when there is none."""
    if os.path.isfile(os.path.join(path, ZOO_MANIFEST)):
        return None
    listed = set()  # relative to ``path``, from every published folder's manifest under it
    for d, dirs, files in os.walk(path):
        dirs.sort()
        here = os.path.relpath(d, path)
        listed |= {os.path.normpath(os.path.join(here, f)) for f in _listed(d)}
        links = [n for n in dirs if os.path.islink(os.path.join(d, n))]  # removed, never followed
        for n in sorted(files) + links:
            rel = os.path.normpath(os.path.join(here, n))
            if not _own_by_name(n) and rel not in listed:
                return rel
    return None


def _source_path(src: str):
    """The path a source occupies: itself, or the .index file of a TF prefix; None if absent."""
    if os.path.lexists(src):
        return src
    return src + ".index" if os.path.exists(src + ".index") else None


def check_sources(dst, sources) -> None:
    """Refuse a destination that is one of ``sources`` (files, folders or TF prefixes), holds one,
    or lies inside a source folder (symlinks resolved on both sides)."""
    real = os.path.realpath(dst)
    for src in sources:
        found = _source_path(os.fspath(src)) if src else None
        if found is None:
            continue
        rs = os.path.realpath(found)
        if rs == real:
            raise OutputError(f"{dst}: is the source {src}; choose another destination")
        if rs.startswith(real.rstrip(os.sep) + os.sep):
            raise OutputError(f"{dst}: holds the source {src}; writing there would destroy it")
        if os.path.isdir(rs) and real.startswith(rs.rstrip(os.sep) + os.sep):
            raise OutputError(f"{dst}: lies inside the source {src}; choose a destination outside it")


def check_destination(dst, overwrite: bool = False, sources=()) -> str:
    """Check the rules every destination obeys and return ``dst`` as it will be written (a
    symlink resolved to its target):

    - it is not one of ``sources`` (files, folders or TF prefixes), holds none, and does not lie
      inside a source folder;
    - it exists only with ``overwrite``, and then it is a folder of nothing but what bert_of writes.
    """
    dst = os.fspath(dst)
    target = os.path.realpath(dst) if os.path.islink(dst) else os.path.abspath(dst)
    check_sources(dst, sources)
    if os.path.lexists(target):
        if not overwrite:
            raise OutputError(f"{dst}: already exists (use --overwrite to replace it)")
        if not os.path.isdir(target):
            raise OutputError(f"{dst}: exists and is not a directory; not replacing it")
        foreign = foreign_entry(target)
        if foreign:
            raise OutputError(f"{dst}: holds {foreign}, which bert_of did not write; not replacing it "
                              "(move it away, or choose another destination)")
    return target


# --------------------------------------------------------------------------- staging and publishing
#
# A staging folder is ``.<dst name>.tmp-<pid>-<created ns>-<random>`` beside its destination: its
# name says whose it is from the moment it exists (mkdir is the first step, there is no marker file
# to write or remove), and stays on it until the publish rename, and on the old tree that an
# overwrite swaps out and deletes. Its owner also holds an flock on the folder while writing.
# A staging folder is stale (removed by the next write into the same parent, saying so once) when
# nobody holds its lock and the process its name gives is gone (or is another process that got the
# pid later: it started after the folder was made). Two live writers of one destination see each
# other's folder; the older one wins, the newer one stops at once naming the holder.

# DOTALL: a name may hold any character but "/" and NUL, a newline too
_STAGE_NAME = re.compile(r"\.(?P<dst>.+)\.tmp-(?P<pid>\d+)-(?P<ns>\d+)-[a-z0-9_]+", re.DOTALL)


def _stage_path(dst: str) -> str:
    """A new, unused staging name for ``dst`` (not created)."""
    parent, name = os.path.dirname(dst), os.path.basename(dst)
    rand = next(tempfile._get_candidate_names())  # noqa: SLF001 - the same names mkdtemp uses
    return os.path.join(parent, f".{name}{_STAGE_TAG}{os.getpid()}-{time.time_ns()}-{rand}")


class _Stage:
    def __init__(self, dst: str):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        mode = 0o777 & ~_umask()  # a published folder gets mkdir's mode
        while True:
            self.path = _stage_path(dst)
            try:
                os.mkdir(self.path, mode)
                break
            except FileExistsError:
                continue
        _UNFINISHED[self.path] = "dir"
        self.fd = None
        try:
            m = _STAGE_NAME.fullmatch(os.path.basename(self.path))
            self.mark = {"pid": os.getpid(), "created_ns": int(m["ns"])}
            self.fd = os.open(self.path, os.O_RDONLY)
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            self.close(remove=True)
            raise

    def close(self, remove: bool) -> None:
        if remove:
            with uninterrupted():  # a second Ctrl-C waits until the folder is gone
                shutil.rmtree(self.path, ignore_errors=True)
        _UNFINISHED.pop(self.path, None)
        if self.fd is not None:
            os.close(self.fd)  # releases the flock
            self.fd = None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _boot_ns():
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1]) * 10**9
    return None


def _started_ns(pid: int):
    """When process ``pid`` started (ns since the epoch); None when it is gone or unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        return _boot_ns() + ticks * 10**9 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return None


def _writer_alive(pid: int, created_ns: int) -> bool:
    """Is the process that made a staging folder at ``created_ns`` still running? A process with
    that pid which started after the folder was made (by more than the clock's tick) is another one."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    started = _started_ns(pid)
    return started is None or started <= created_ns + 2 * 10**9  # btime is whole seconds


def _staging_owner(path: str):
    """``{"pid", "created_ns"}`` of a live staging folder; None when it is not one, or its writer
    is gone (then it is removed)."""
    m = _STAGE_NAME.fullmatch(os.path.basename(path))
    if m is None or os.path.islink(path) or not os.path.isdir(path):
        return None
    owner = {"pid": int(m["pid"]), "created_ns": int(m["ns"])}
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return owner  # being written
        if owner["pid"] == os.getpid() or _writer_alive(owner["pid"], owner["created_ns"]):
            return owner  # just made (not locked yet), or its old tree being deleted after the swap
        shutil.rmtree(path, ignore_errors=True)  # writer gone: stale (we hold its lock meanwhile)
        return None
    finally:
        os.close(fd)


def _stale_note(parent: str, removed: list) -> None:
    if removed:
        log.info("removed %d unfinished folder(s) in %s left by bert_of processes that died: %s",
                 len(removed), parent, ", ".join(sorted(removed)))


def remove_stale_staging(parent: str) -> None:
    """Remove every staging folder in ``parent`` whose writer is gone (one note for all)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    removed = []
    for n in names:
        if _STAGE_NAME.fullmatch(n):
            p = os.path.join(parent, n)
            if _staging_owner(p) is None and not os.path.lexists(p):
                removed.append(n)
    _stale_note(parent, removed)


def _claim(stage: _Stage, dst: str) -> None:
    """Clean stale siblings; stop if another live writer of ``dst`` started first."""
    parent, name = os.path.dirname(dst), os.path.basename(dst)
    mine = (stage.mark["created_ns"], stage.mark["pid"], stage.path)
    removed, rival = [], None
    for n in sorted(os.listdir(parent)):
        p = os.path.join(parent, n)
        m = _STAGE_NAME.fullmatch(n)
        if m is None or p == stage.path:
            continue
        owner = _staging_owner(p)
        if owner is None:
            if not os.path.lexists(p):
                removed.append(n)
            continue
        theirs = (owner["created_ns"], owner["pid"], p)
        if m["dst"] == name and theirs < mine and (rival is None or theirs < rival):
            rival = theirs
    _stale_note(parent, removed)
    if rival is not None:
        raise OutputError(f"{dst}: another bert_of process is writing it (pid {rival[1]}: {_command(rival[1])})")


_AT_FDCWD = -100
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
try:
    _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
except (AttributeError, OSError):  # pragma: no cover - glibc < 2.28 or not Linux
    _renameat2 = None


def _rename2(src: str, dst: str, flags: int) -> bool:
    """renameat2(src, dst, flags). False when the system or filesystem does not support it."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(e, os.strerror(e), dst)


def publish_dir(stage: str, dst: str, overwrite: bool = False) -> None:
    """Move the finished folder ``stage`` to ``dst`` (same filesystem) in one rename.

    New ``dst``: RENAME_NOREPLACE (a destination created meanwhile is an error, never silently
    replaced). Existing ``dst`` (with ``overwrite``): RENAME_EXCHANGE, then the old tree (now at
    ``stage``) is removed. Where the filesystem cannot exchange, the old tree is renamed aside
    first: a short window in which ``dst`` is absent, never one in which it is mixed.
    """
    fsync_dir(stage)
    parent = os.path.dirname(dst)
    if os.path.lexists(dst):
        if not overwrite:
            raise OutputError(f"{dst}: created by another process meanwhile; not replacing it")
        if _rename2(stage, dst, _RENAME_EXCHANGE):
            fsync_dir(parent)
            shutil.rmtree(stage, ignore_errors=True)  # the old tree
            return
        old = _stage_path(dst)  # the old tree is deleted under a name that says whose it is
        os.rename(dst, old)
        os.rename(stage, dst)
        fsync_dir(parent)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        done = _rename2(stage, dst, _RENAME_NOREPLACE)
    except FileExistsError:
        raise OutputError(f"{dst}: created by another process meanwhile; not replacing it") from None
    if not done:
        os.rename(stage, dst)
    fsync_dir(parent)


@contextlib.contextmanager
def publishing(dst: str, overwrite: bool = False, sources=()):
    """``with publishing(dst) as stage:`` write into ``stage``; on success it becomes ``dst``.

    Refuses at once what :func:`check_destination` refuses (a ``dst`` that exists without
    ``overwrite``, is not a directory, holds files bert_of did not write, or is, holds or lies
    inside one of ``sources``) and a ``dst`` another bert_of process is writing. A symlinked
    ``dst`` is replaced at its target. On any error (Ctrl-C and SIGTERM included) the staging
    folder is removed and ``dst`` is untouched.
    """
    dst = check_destination(dst, overwrite, sources)
    stage, ok = None, False
    try:
        with uninterrupted():  # a signal lands before the staging folder exists or once it is ours to remove
            stage = _Stage(dst)
        _claim(stage, dst)
        yield stage.path
        record_files(stage.path)
        with uninterrupted():  # the swap and the removal of the old tree go together
            publish_dir(stage.path, dst, overwrite)
            ok = True
    except OSError as e:
        raise _io_error(getattr(e, "filename", None) or dst, e) from None
    finally:
        if stage is not None:
            stage.close(remove=not ok)


@contextlib.contextmanager
def publishing_into(dst: str, remove=()):
    """``with publishing_into(dst) as stage:`` write files into ``stage``; on success they land in
    the folder ``dst``, new or existing, as transformers' ``save_pretrained`` writes: a new ``dst``
    is published whole (:func:`publishing`); in an existing one each staged file replaces its
    namesake by one rename (readers see the old file or the new one, whole), the names in
    ``remove`` (files of the set left from an earlier write) go, and every other file stays.
    Nothing in ``dst`` changes until every file is staged, so an error (a full disk, Ctrl-C)
    leaves it as it was. A ``dst`` another bert_of process is writing is refused."""
    target = os.path.realpath(dst) if os.path.islink(dst) else os.path.abspath(os.fspath(dst))
    if not os.path.lexists(target):
        with publishing(dst) as stage:
            yield stage
        return
    if not os.path.isdir(target):
        raise OutputError(f"{dst}: exists and is not a directory")
    stage = None
    try:
        with uninterrupted():
            stage = _Stage(target)
        _claim(stage, target)
        yield stage.path
        names = sorted(os.listdir(stage.path))
        with uninterrupted():  # the renames go together
            for n in names:
                os.replace(os.path.join(stage.path, n), os.path.join(target, n))
            for n in remove:
                if n not in names and os.path.isfile(os.path.join(target, n)):
                    os.remove(os.path.join(target, n))
            fsync_dir(target)
    except OSError as e:
        raise _io_error(getattr(e, "filename", None) or dst, e) from None
    finally:
        if stage is not None:
            stage.close(remove=True)
