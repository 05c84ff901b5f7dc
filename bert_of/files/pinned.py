"""Several files read from one directory tree, even while its path is swapped.

A reader and a publisher cooperate through ``flock`` on the tree's directory: a reader holds a
shared lock while it opens the checkpoint's files (:class:`PinnedDir` until :meth:`release`); a
publisher that swapped a tree out takes the exclusive lock before deleting it
(:func:`retire`), so a read in progress is never cut off halfway by the deletion, however slow the
reader (a loaded machine) and however fast the writer (``convert --overwrite`` in a loop).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
import re
import resource
import stat

from bert_of.errors import BertOfError


class PinnedDir:
    """A directory held open, so that several files read from it come from the same tree even if
    the path is swapped meanwhile (``publishing`` replaces trees with RENAME_EXCHANGE): a reader
    gets the old checkpoint or the new one, never one's config with the other's weights.

    ``open(name)`` opens relative to the held directory; ``path`` names files in messages.
    """

    def __init__(self, path: str):
        self.path = path = os.fspath(path)
        self.fd = _open_reading(path)
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
        # without blocking (a FIFO would hang the reader), and only a regular file (a device or a
        # FIFO is refused here, for every reader: what is held is read as a file)
        fd = os.open(self.real(p), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise BertOfError(f"{p}: not a regular file (a checkpoint's files are)")
        f = os.fdopen(fd, "rb")
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

    def release(self) -> None:
        """The files are open (or the read failed): a publisher may delete this tree once it is
        swapped out; what reads it later holds its files open or fails with ``SourceChanged``."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        for f in self._held:
            f.close()
        self._held = []
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self):  # a Source holding a pin is dropped: its files go with it
        try:  # no module global here (contextlib...): at interpreter exit they may be None already
            self.close()
        except Exception:  # noqa: BLE001 - a finaliser has no one to tell
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_REOPEN = 200  # a tree being deleted is met again only if the path names it still (a fallback swap)
RETIRE_WAIT = 10.0  # seconds a publisher waits for readers still opening an old tree's files


def _open_reading(path: str) -> int:
    """The directory ``path`` opened, with a shared lock (a reader opening its files). A tree
    whose lock a publisher holds is being deleted (it was swapped out): open the path again."""
    for _ in range(_REOPEN):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            os.close(fd)
        except OSError:  # a filesystem without flock: read unlocked (a swap may then cost a retry)
            return fd
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def retire(old: str, wait: float | None = None) -> None:
    """Delete the tree ``old`` (swapped out by a publish) once no reader is opening its files;
    after ``wait`` seconds it goes anyway (a reader stopped mid-read then reads the new tree)."""
    try:
        fd = os.open(old, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        deadline, pause = time.monotonic() + (RETIRE_WAIT if wait is None else wait), 0.001
        while True:  # polled, not blocking: bounded, and a signal is never stuck behind a reader
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
            except OSError:
                break
        shutil.rmtree(old, ignore_errors=True)
    finally:
        os.close(fd)  # the lock goes with it: readers that waited find the path swapped
