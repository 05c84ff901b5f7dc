"""OneFlow's own save format (``flow.save(state_dict, dir)``, OneFlow 0.6-0.9), read as data.

A ``flow.save`` folder::

    <dir>/pickled_data          pickle (protocol 4) of {"protocol_version": 1, "data": <state dict>}
    <dir>/tensor_N/out, meta    a local tensor: raw C-order little-endian bytes + VariableMetaInfo text
    <dir>/global_tensor_N/...   a global tensor saved with ``global_dst_rank=0`` (LiBai, the models repo)

The state dict is a ``collections.OrderedDict`` built by REDUCE, each value a ``oneflow.Tensor``
(buffers) or ``oneflow.nn.Parameter`` made by NEWOBJ with BUILD state ``{"path": "tensor_N"}``;
OneFlow also BUILDs the dict itself with ``{"_metadata": OrderedDict()}``. A tensor saved twice
under two keys (a tied weight) is one pickled object, so both keys name one folder. The older
eager layout (OneFlow 0.5-0.7) has no ``pickled_data``: one folder per key, named by the key
(``snapshot_done`` beside them).

``pickled_data`` is never given to ``pickle``: :func:`parse_pickled_data` parses it as data with
the one safe pickle reader (:mod:`bert_of.pickles`), admitting exactly the structures above (the
three globals, an OrderedDict made by REDUCE, tensors made by NEWOBJ and BUILD) and refusing
anything else in one line naming it, so nothing in the file can run. Folders are plain names inside ``<dir>``
(no ``/``, ``..``, symlinks); every ``out`` is size-checked against its ``meta`` before a tensor
is read, one tensor at a time.

Writing (:func:`write_state_dict`) produces the bytes OneFlow 0.9's ``flow.save`` writes for the
same state dict (the tests compare them), so ``flow.load`` reads the folder back.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import struct
from typing import NamedTuple

import numpy as np

import bert_of.pickles as pickles
from bert_of.errors import CheckpointError, UnsafeContent
from bert_of.files.atomic import writes_to
from bert_of.files.reading import read_bounded
from bert_of.tensors import nbytes
from bert_of.converters.containers.variable_meta import format_meta, parse_meta
from bert_of.converters.formats.lazy.names import DATA_FILE, META_FILE

PICKLE_FILE = "pickled_data"
PROTOCOL_VERSION = 1
MAX_PICKLE = 64 << 20  # a state dict's pickle is KBs; the tensors live in their folders
_MAX_META = 1 << 16


class TensorRecord(NamedTuple):
    """What ``pickled_data`` says about one tensor: its class and the folder holding it."""

    cls: str  # "oneflow.Tensor" | "oneflow.nn.Parameter"
    folder: str

    @property
    def shown(self):
        return self.cls


class _Global(NamedTuple):
    name: str  # "collections.OrderedDict", "oneflow.Tensor", "oneflow.nn.Parameter"

    @property
    def shown(self):
        return self.name


class _Unbuilt(NamedTuple):  # a NEWOBJ'd tensor before its BUILD
    cls: str
    ident: int

    @property
    def shown(self):
        return self.cls


ADMITTED = {("collections", "OrderedDict"): "collections.OrderedDict",
            ("oneflow", "Tensor"): "oneflow.Tensor",
            ("oneflow.nn", "Parameter"): "oneflow.nn.Parameter"}
_TENSOR_CLASSES = ("oneflow.Tensor", "oneflow.nn.Parameter")


def parse_pickled_data(raw: bytes, where: str) -> dict:
    """``pickled_data`` bytes -> {key: TensorRecord}, in the file's order; CheckpointError otherwise."""
    try:
        obj = pickles.parse(raw, {k: _Global(v) for k, v in ADMITTED.items()}, reduce=_reduce,
                            newobj=_newobj(), build=_build)
    except pickles.Refused as e:
        error = UnsafeContent if str(e).startswith("global ") else CheckpointError
        raise error(f"{where}: refused: {e} (only a flow.save'd state dict is admitted; nothing was run)") from None
    if not isinstance(obj, dict) or set(obj) != {"protocol_version", "data"}:
        raise CheckpointError(f"{where}: refused: not flow.save's {{protocol_version, data}} record")
    if obj["protocol_version"] != PROTOCOL_VERSION:
        raise CheckpointError(f"{where}: protocol_version {obj['protocol_version']!r} (OneFlow writes "
                              f"{PROTOCOL_VERSION})")
    data = obj["data"]
    if not isinstance(data, _ODict):
        raise CheckpointError(f"{where}: refused: its data is not a state dict (an OrderedDict of tensors)")
    out = {}
    for k, v in data.items():
        if type(v) is _Unbuilt:
            raise CheckpointError(f"{where}: refused: a tensor without its state (nothing was run)")
        if type(k) is not str or type(v) is not TensorRecord:
            raise CheckpointError(f"{where}: refused: state dict entry {str(k)[:80]!r} is not a name -> tensor")
        out[k] = v
    return out


class _ODict(dict):
    """An OrderedDict the pickle made (a dict keeps order); ``built``: its BUILD state was applied."""

    built = False
    shown = "an OrderedDict"


def _reduce(fn, args):
    if type(fn) is not _Global or fn.name != "collections.OrderedDict":
        raise pickles.Refused(f"REDUCE of {pickles.show(fn)} (only collections.OrderedDict() is admitted)")
    if args != ():
        raise pickles.Refused("REDUCE of collections.OrderedDict with arguments")
    return _ODict()


def _newobj():
    made = [0]

    def newobj(cls, args):
        if type(cls) is not _Global or cls.name not in _TENSOR_CLASSES or args != ():
            raise pickles.Refused(f"NEWOBJ of {pickles.show(cls)} (only oneflow.Tensor / oneflow.nn.Parameter)")
        made[0] += 1
        return _Unbuilt(cls.name, made[0])
    return newobj


def _build(obj, state):
    """A tensor's state is {"path": folder} (the built tensor replaces it in the memo); an
    OrderedDict's is {"_metadata": {}}."""
    if type(obj) is _Unbuilt:
        if type(state) is not dict or set(state) != {"path"} or type(state["path"]) is not str:
            raise pickles.Refused(f"{obj.cls} state {pickles.show(state)} (flow.save writes {{'path': folder}})")
        return TensorRecord(obj.cls, state["path"])
    if type(obj) is _ODict and not obj.built:
        if type(state) is not dict or set(state) - {"_metadata"} or \
                not all(isinstance(v, dict) and not v for v in state.values()):
            raise pickles.Refused(f"OrderedDict state {pickles.show(state)} (flow.save writes {{'_metadata': {{}}}})")
        obj.built = True
        return obj
    raise pickles.Refused(f"BUILD of {pickles.show(obj)}")


# --------------------------------------------------------------------------- the folder


class Entry(NamedTuple):
    key: str
    cls: str  # "oneflow.Tensor" | "oneflow.nn.Parameter" | "" (old layout)
    folder: str  # absolute path of the tensor's folder
    shape: tuple
    dtype: np.dtype


def is_flow_save_dir(path: str) -> bool:
    """A folder with ``pickled_data``, or the older layout: folders holding ``out`` + ``meta``."""
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, PICKLE_FILE)):
        return True
    try:  # symlinked folders count here, so that reading refuses them by name
        entries = [e for e in os.scandir(path) if e.is_dir()]
    except OSError:
        return False
    return bool(entries) and all(os.path.isfile(os.path.join(e.path, DATA_FILE)) and
                                 os.path.isfile(os.path.join(e.path, META_FILE)) for e in entries[:8])


def _regular(path: str, what: str) -> os.stat_result:
    try:
        st = os.lstat(path)
    except OSError as e:
        raise CheckpointError(f"{path}: {what} cannot be read ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointError(f"{path}: refused: {what} is a symlink (a flow.save folder holds none)")
    return st


def _tensor_folder(root: str, name: str, where: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise CheckpointError(f"{where}: refused: tensor folder {name[:80]!r} is not a folder inside {root}")
    d = os.path.join(root, name)
    st = _regular(d, "tensor folder")
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"{d}: tensor folder is not a directory")
    for f in (DATA_FILE, META_FILE):
        fst = _regular(os.path.join(d, f), f"tensor file {f}")
        if not stat.S_ISREG(fst.st_mode):
            raise CheckpointError(f"{os.path.join(d, f)}: not a regular file")
    return d


def _meta(d: str):
    p = os.path.join(d, META_FILE)
    raw = read_bounded(p, _MAX_META, "VariableMetaInfo", CheckpointError)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{p}: cannot read ({e})") from None
    shape, dtype = parse_meta(text, p)
    need = nbytes(shape, dtype)
    size = os.path.getsize(os.path.join(d, DATA_FILE))
    if size != need:
        raise CheckpointError(f"{os.path.join(d, DATA_FILE)}: {size} bytes, but its meta says "
                              f"{np.dtype(dtype).name} {list(shape)}, which needs {need}"
                              + (" (truncated?)" if size < need else ""))
    return shape, dtype


def read_dir(path: str, root: str | None = None) -> list:
    """The tensors of a flow.save folder: [Entry] in the state dict's order (nothing read yet).
    ``root``: the path that reads the folder (bert_of.files.pinned.PinnedDir.real); the entries' folders are
    under it."""
    st = _regular(path, "folder")
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"{path}: not a directory (a flow.save checkpoint is a folder)")
    path = root or path
    pk = os.path.join(path, PICKLE_FILE)
    out = []
    if os.path.lexists(pk):
        pst = _regular(pk, PICKLE_FILE)
        if not stat.S_ISREG(pst.st_mode):
            raise CheckpointError(f"{pk}: not a regular file")
        if pst.st_size > MAX_PICKLE:
            raise CheckpointError(f"{pk}: {pst.st_size} bytes, more than a state dict's pickle ({MAX_PICKLE})")
        records = parse_pickled_data(read_bounded(pk, MAX_PICKLE, PICKLE_FILE, CheckpointError), pk)
        for key, rec in records.items():
            d = _tensor_folder(path, rec.folder, pk)
            shape, dtype = _meta(d)
            out.append(Entry(key, rec.cls, d, tuple(shape), np.dtype(dtype)))
        return out
    for e in sorted(os.scandir(path), key=lambda e: e.name):  # older layout: one folder per key
        if e.is_file(follow_symlinks=False):  # snapshot_done, a config, a vocab: flow.load skips them too
            continue
        d = _tensor_folder(path, e.name, path)
        shape, dtype = _meta(d)
        out.append(Entry(e.name, "", d, tuple(shape), np.dtype(dtype)))
    return out


def read_tensor(e: Entry, data: str | None = None) -> np.ndarray:
    """One tensor, fresh and native-order (size checked again: the file may have changed).
    ``data``: the path that reads its ``out`` (a file held open since the folder was read)."""
    p = os.path.join(e.folder, DATA_FILE)
    n = math.prod(e.shape)
    try:
        arr = np.fromfile(data or p, dtype=e.dtype, count=n)
    except OSError as err:
        raise CheckpointError(f"{p}: cannot read ({err.strerror or err})") from None
    if arr.size != n:
        raise CheckpointError(f"{p}: file ended early ({arr.size} of {n} elements)")
    return arr.reshape(e.shape)


# --------------------------------------------------------------------------- writing


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return (b"\x8c" + bytes([len(b)]) if len(b) < 256 else b"X" + struct.pack("<I", len(b))) + b


class _Writer:
    """Emits what Python's pickler (protocol 4) emits for flow.save's state-dict record."""

    def __init__(self):
        self.out, self.n = bytearray(), 0
        self.memo = {}  # (kind, value) -> memo index

    def memoize(self, key=None):
        self.out += b"\x94"
        if key is not None:
            self.memo[key] = self.n
        self.n += 1

    def get(self, i):
        self.out += b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)

    def string(self, s, share=False):
        if share and ("s", s) in self.memo:
            return self.get(self.memo[("s", s)])
        self.out += _str(s)
        self.memoize(("s", s) if share else None)

    def global_(self, module, name):
        key = ("g", module, name)
        if key in self.memo:
            return self.get(self.memo[key])
        self.string(module)
        self.string(name)
        self.out += b"\x93"
        self.memoize(key)


def pickle_state_dict(items) -> bytes:
    """flow.save's ``pickled_data`` for ``items`` = [(key, cls, folder)], cls "oneflow.Tensor" or
    "oneflow.nn.Parameter"; keys naming the same folder are one object, as a tied tensor is."""
    w = _Writer()
    w.out += b"}"
    w.memoize()
    w.out += b"("
    w.string("protocol_version")
    w.out += b"K\x01"
    w.string("data")
    w.global_("collections", "OrderedDict")
    w.out += b")R"
    w.memoize()
    objs = {}
    if items:
        w.out += b"("
    for key, cls, folder in items:
        w.string(key)
        if folder in objs:
            w.get(objs[folder])
            continue
        module, _, name = cls.rpartition(".")
        w.global_(module, name)
        w.out += b")\x81"
        objs[folder] = w.n
        w.memoize()
        w.out += b"}"
        w.memoize()
        w.string("path", share=True)
        w.string(folder)
        w.out += b"sb"
    if items:
        w.out += b"u"
    w.out += b"}"
    w.memoize()
    w.string("_metadata")
    w.global_("collections", "OrderedDict")
    w.out += b")R"
    w.memoize()
    w.out += b"sbu."
    body = bytes(w.out)
    head = b"\x80\x04"
    if len(body) >= 4:  # protocol 4 frames what follows PROTO (one frame: any reader takes it)
        head += b"\x95" + struct.pack("<Q", len(body))
    return head + body


def write_tensor(d: str, arr: np.ndarray) -> None:
    """``d/out`` + ``d/meta`` as OneFlow's _save_tensor_to_disk writes them."""
    with writes_to(d):
        os.makedirs(d)
    dtype = arr.dtype
    if dtype.byteorder == ">":
        arr = arr.astype(dtype.newbyteorder("<"))
    arr = np.ascontiguousarray(arr)
    out = os.path.join(d, DATA_FILE)
    with writes_to(out), open(out, "wb") as f:
        if arr.size:
            f.write(memoryview(arr.reshape(-1).view(np.uint8)))
    meta = os.path.join(d, META_FILE)
    with writes_to(meta), open(meta, "w") as f:
        f.write(format_meta(arr.shape, arr.dtype))


def write_state_dict(d: str, items, folder_prefix: str = "tensor_") -> None:
    """A flow.save folder in the existing (staging) directory ``d``.

    items: [(key, cls, what)] in state-dict order; ``what`` is a producer of the array, or
    ``("tied", other_key)`` for a key that is the same tensor as an earlier one (written once, both
    keys naming its folder, as flow.save pickles a tied Parameter). One tensor in memory at a time.
    """
    rows, folder_of, n = [], {}, 0
    for key, cls, prod in items:
        if isinstance(prod, tuple) and prod[0] == "tied":
            rows.append((key, cls, folder_of[prod[1]]))
            folder_of[key] = folder_of[prod[1]]
            continue
        folder = f"{folder_prefix}{n}"
        n += 1
        write_tensor(os.path.join(d, folder), np.asarray(prod()))
        folder_of[key] = folder
        rows.append((key, cls, folder))
    p = os.path.join(d, PICKLE_FILE)
    with writes_to(p), open(p, "wb") as f:
        f.write(pickle_state_dict(rows))



# The digest of the last pickle keys_of parsed and its answer, one tuple (swapped whole, so a thread
# never pairs one file's digest with another's keys). Detection asks once per flow.save format and
# again when a reader fails (converters/convert.py): five parses of the same bytes, each up to the
# bounded work a hostile pickle costs (seconds near MAX_PICKLE), where one answers all. Keyed by
# content, not by path or mtime: a file rewritten in place is parsed again.
_last_keys: tuple = (None, None)


def keys_of(path: str):
    """The state-dict keys of a flow.save folder, cheaply, for detection: a list, or None when
    ``pickled_data`` is there but not admitted (reading then says why)."""
    global _last_keys
    pk = os.path.join(path, PICKLE_FILE)
    if os.path.lexists(pk):
        try:  # a FIFO, a device, a link to /dev/zero: refused, not read
            raw = read_bounded(pk, MAX_PICKLE, PICKLE_FILE, CheckpointError)
        except (OSError, CheckpointError):
            return None
        digest, keys = hashlib.sha256(raw).digest(), None
        last = _last_keys
        if last[0] == digest:
            keys = last[1]
        else:
            try:
                keys = tuple(parse_pickled_data(raw, pk))
            except (OSError, CheckpointError):
                keys = None
            _last_keys = (digest, keys)
        return None if keys is None else list(keys)
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir())
    except OSError:
        return []
