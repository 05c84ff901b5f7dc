"""Several files read from one directory tree, even while its path is swapped."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import stat


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
