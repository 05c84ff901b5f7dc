"""Opening HDF5 files nobody vouches for (``tf_model.h5``): what h5py and libhdf5 do on a malformed
or hostile file, kept to one clear line.

- libhdf5 can hang or crash on a malformed file: :func:`open_file` first has a child process touch
  everything the reader will (:data:`_PROBE`); its crash or hang is one line here.
- Only hard links inside the file are followed (:func:`hard_links_only`); datasets keeping their
  data in other files (external storage, virtual datasets) are refused (:func:`plain_dataset`), so a
  file cannot make bert_of read ``/etc/passwd`` into a checkpoint.
- h5py's own exceptions on odd structures become one line (:func:`malformed`, :func:`read_dataset`).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys

import numpy as np

from bert_of.errors import CheckpointError
from bert_of.tensors import check_dtype, check_shape


# libhdf5 itself can loop forever or crash on a malformed file (found by the fuzz smoke: a zeroed
# run in the global heap hangs H5Aread of a variable-length string attribute, in HDF5 2.0.0). So a
# child process first touches everything this reader will: every attribute, every object header
# reachable through hard links, and the data of every dataset (contiguous data, a plain read of
# bytes whose place and size the header gives, only at its first element; chunked or filtered
# data in full), each error caught. Only if the child finishes does this process open the file;
# a crash or a hang there is one line here.
_PROBE = r"""
import sys, h5py, numpy as np
def touch(obj):
    for k in list(obj.attrs):
        try: obj.attrs[k]
        except Exception: pass
    if isinstance(obj, h5py.Dataset):
        try:
            plist = obj.id.get_create_plist()
            if plist.get_external_count() or obj.is_virtual or obj.size == 0: return
            if plist.get_layout() == h5py.h5d.CONTIGUOUS and obj.shape:
                obj[(0,) * len(obj.shape)]
            elif obj.nbytes < 1 << 34:
                out = np.empty(obj.shape, obj.dtype)
                obj.read_direct(out)
        except Exception: pass
try:
    f = h5py.File(open(sys.argv[1], "rb"), "r")  # a file object: a deleted file held open reads too
except Exception:
    sys.exit(0)
touch(f)
def visit(name, obj):
    try: touch(obj)
    except Exception: pass
try: f.visititems(visit)
except Exception: pass
"""


def _probe(path: str, opened: str) -> None:
    """Run :data:`_PROBE` on ``path`` (read as ``opened``) in a child process; its crash or hang is a
    one-line error."""
    if not sys.executable:  # an embedded interpreter: no Python to start; read in this process
        return
    m = re.fullmatch(r"/proc/self/fd/(\d+)", opened)
    try:
        size = os.path.getsize(opened)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    # generous: reading 1.3 GB (BERT-large) from a cold disk; BERT_OF_HDF5_TIMEOUT sets the base
    timeout = float(os.environ.get("BERT_OF_HDF5_TIMEOUT") or 15) + size / 20e6
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, opened], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=timeout, pass_fds=(int(m[1]),) if m else ())
    except subprocess.TimeoutExpired:
        raise CheckpointError(f"{path}: malformed HDF5 file: the HDF5 library did not finish reading it within "
                              f"{timeout:.0f} s") from None
    if r.returncode < 0:
        raise CheckpointError(f"{path}: malformed HDF5 file: the HDF5 library crashed reading it "
                              f"(signal {-r.returncode})")


def open_file(path: str, opened: str | None = None):
    """``h5py.File(path, "r")`` after the probe; a file HDF5 refuses is one line. ``opened``: the
    path that reads the file (a file held open: ``/proc/self/fd/N``, passed on to the probe's
    child, so both read the very file ``path`` named when it was opened); messages name ``path``."""
    import h5py

    opened = opened or path
    _probe(path, opened)
    try:
        fobj = open(opened, "rb")
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    try:
        # through a file object: HDF5 resolves a name's real path, which a held file (/proc/self/fd/N)
        # whose folder was replaced and deleted no longer has
        return h5py.File(fobj, "r")
    except OSError as e:
        fobj.close()
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        m = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", reason)
        if m:
            raise CheckpointError(f"{path}: truncated HDF5 file ({m.group(1)} bytes; its superblock says "
                                  f"{m.group(2)})") from None
        raise CheckpointError(f"{path}: not a readable HDF5 file ({reason})") from None


def first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


@contextlib.contextmanager
def malformed(path: str):
    """h5py's own exceptions on a malformed file (odd objects, broken attributes) as one line."""
    try:
        yield
    except (OSError, KeyError, ValueError, RuntimeError, TypeError, AttributeError, IndexError) as e:
        raise CheckpointError(f"{path}: malformed Keras weights file ({first_line(e)})") from None


def hard_links_only(f, path: str, name: str) -> bool:
    """Whether ``name`` exists, every step of it a hard link inside this file: checked from the root
    down, so no soft or external link is ever followed (an external one would open another file)."""
    import h5py

    parts = [p for p in name.split("/") if p]
    if not parts:
        return False
    # prefixes of this (read-only) file already found to be hard links: each one is looked up once per
    # file, not once per dataset under it (HDF5 resolves every prefix from the root: the cost of a read)
    seen = f.__dict__.setdefault("_bert_of_hard_links", set())
    for i in range(1, len(parts) + 1):
        sub = "/".join(parts[:i])
        if sub in seen:
            continue
        link = f.get(sub, getlink=True)
        if link is None:
            return False
        if not isinstance(link, h5py.HardLink):
            raise CheckpointError(f"{path}: {sub} is a {type(link).__name__} (a link elsewhere); "
                                  f"refusing to follow it")
        seen.add(sub)
    return True


def plain_dataset(f, path: str, name: str):
    """The dataset ``name``, stored in this file (no external storage, virtual mapping or external
    link: those would read other files), holding numbers of a sane shape."""
    import h5py

    if not hard_links_only(f, path, name):
        raise CheckpointError(f"{path}: dataset {name} does not exist")
    ds = f[name]
    if not isinstance(ds, h5py.Dataset):
        raise CheckpointError(f"{path}: {name} is not a dataset")
    plist = ds.id.get_create_plist()
    if plist.get_external_count() or ds.is_virtual:
        raise CheckpointError(f"{path}: dataset {name} keeps its data in other files (external or virtual "
                              f"storage); refusing to read them")
    check_dtype(ds.dtype, f"{path}: dataset {name}")
    check_shape(ds.shape if ds.shape is not None else (None,), f"{path}: dataset {name}")
    return ds


def read_dataset(f, path: str, name: str) -> np.ndarray:
    """A dataset's data as a fresh array (after :func:`plain_dataset`); read errors are one line."""
    try:
        ds = plain_dataset(f, path, name)
        out = np.empty(ds.shape, ds.dtype)
        if out.size:
            ds.read_direct(out)
        return out
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as e:
        raise CheckpointError(f"{path}: dataset {name}: cannot be read ({first_line(e)})") from None
