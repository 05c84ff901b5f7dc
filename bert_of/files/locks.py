"""One writer per directory: an exclusive lock file naming its holder (pid and command line)."""

from __future__ import annotations

import contextlib
import fcntl
import os

from bert_of.errors import OutputError


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
        os.pwrite(fd, f"pid {os.getpid()}: {command_line()}\n".encode(), 0)
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


def command_line(pid="self") -> str:
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
