"""A directory built in a staging folder beside its destination and swapped in by one rename.

``publishing(dst)``: replacing an existing tree uses ``renameat2(RENAME_EXCHANGE)``, so a reader
racing the swap sees the old tree or the new one, never a mix. One writer per destination; a
staging folder whose owner process is gone is removed by the next write into the same parent.
``publishing_into(dst)``: files staged, then each renamed over its namesake in an existing folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import tempfile
import time

from bert_of.errors import OutputError
from bert_of.files.atomic import UNFINISHED, fsync_dir, io_error
from bert_of.files.locks import command_line
from bert_of.files.owned import check_destination, record_files
from bert_of.files.pinned import retire
from bert_of.runtime.process import uninterrupted
from bert_of.progress import log


# A staging folder is ``.<dst name>.tmp-<pid>-<created ns>-<random>`` beside its destination: its
# name says whose it is from the moment it exists (mkdir is the first step, there is no marker file
# to write or remove), and stays on it until the publish rename, and on the old tree that an
# overwrite swaps out and deletes. Its owner also holds an flock on the folder while writing.
# A staging folder is stale (removed by the next write into the same parent, saying so once) when
# nobody holds its lock and the process its name gives is gone (or is another process that got the
# pid later: it started after the folder was made). Two live writers of one destination see each
# other's folder; the older one wins, the newer one stops at once naming the holder.

_STAGE_TAG = ".tmp-"
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
        UNFINISHED[self.path] = "dir"
        self.fd = None
        try:
            m = _STAGE_NAME.fullmatch(os.path.basename(self.path))
            self.mark = {"pid": os.getpid(), "created_ns": int(m["ns"])}
            self.fd = os.open(self.path, os.O_RDONLY)
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            self.close(remove=True)
            raise

    def unlock(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self, remove: bool) -> None:
        if remove:
            with uninterrupted():  # a second Ctrl-C waits until the folder is gone
                shutil.rmtree(self.path, ignore_errors=True)
        UNFINISHED.pop(self.path, None)
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
        raise OutputError(f"{dst}: another bert_of process is writing it (pid {rival[1]}: {command_line(rival[1])})")


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
            retire(stage)  # the old tree, once readers opening its files have them
            return
        old = _stage_path(dst)  # the old tree is deleted under a name that says whose it is
        os.rename(dst, old)
        os.rename(stage, dst)
        fsync_dir(parent)
        retire(old)
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
            stage.unlock()  # the tree becomes dst: readers lock it (its name still says whose it is)
            publish_dir(stage.path, dst, overwrite)
            ok = True
    except OSError as e:
        raise io_error(getattr(e, "filename", None) or dst, e) from None
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
        raise io_error(getattr(e, "filename", None) or dst, e) from None
    finally:
        if stage is not None:
            stage.close(remove=True)
