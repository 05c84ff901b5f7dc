"""``torch.save`` zip files (``pytorch_model.bin``) read without torch and without trusting them.

A torch zip holds ``<root>/data.pkl`` (a pickle of the state dict), ``<root>/data/<key>`` (one
member per storage: raw bytes) and ``<root>/byteorder``. A member present twice is read from its
first copy, as ``torch.load`` reads it. The pickle is never unpickled as such:

1. The one safe pickle reader (:mod:`bert_of.pickles`) parses it as data: it admits only the
   globals ``torch._utils._rebuild_tensor_v2``, ``torch._utils._rebuild_parameter`` (an
   ``nn.Parameter``: its data, as ``torch.load(weights_only=True)`` reads it; ``_with_state`` too),
   ``torch.*Storage`` and ``collections.OrderedDict``
   (any other is refused by name; nothing is looked up, nothing is executed), REDUCE only of those,
   BUILD only of an OrderedDict's ``_metadata``.
2. What the pickle builds are *descriptions*, not tensors: a storage is ``(key, dtype, numel)``,
   a tensor ``(storage, offset, shape, stride)``, both immutable tuples (a BUILD opcode that
   tries to rewrite a stride or turn a storage into an int is refused).
3. After the whole pickle is read, every tensor is checked: Python ints, at most 32 dims, offset
   and strides non-negative, a stride pattern ``torch.save`` writes for real tensors (contiguous,
   permuted, sliced: no two elements at one address, stride 0 only on size-1 dims), every
   addressed element inside its storage, every storage inside its archive member.
4. A tensor is materialised only from the bytes it spans, read in bounded chunks, through
   ``np.ndarray(buffer=...)`` (which itself refuses a view outside its buffer); nothing unchecked
   reaches a stride or a raw buffer.
"""

from __future__ import annotations

import math
import struct
import zipfile
from typing import NamedTuple

import numpy as np

import bert_of.pickles as pickles
from bert_of.errors import CheckpointError, UnsafeContent
from bert_of.tensors import MAX_DIMS

_LEGACY_HINT = ("re-save it as safetensors in a PyTorch you trust: "
                "model.save_pretrained(dir, safe_serialization=True)")
_MAX_PICKLE = 256 << 20  # a state dict's pickle is KBs to a few MB; the data lives in other members
_CHUNK = 1 << 20


class _StorageType(NamedTuple):
    """Stand-in for ``torch.FloatStorage`` & co: a name and a dtype, immutable, not callable."""

    name: str
    dtype: np.dtype


def _storage_types():
    types = {"DoubleStorage": "<f8", "FloatStorage": "<f4", "HalfStorage": "<f2", "LongStorage": "<i8",
             "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1", "ByteStorage": "u1",
             "BoolStorage": "?"}
    out = {k: _StorageType(k, np.dtype(v)) for k, v in types.items()}
    try:
        import ml_dtypes

        out["BFloat16Storage"] = _StorageType("BFloat16Storage", np.dtype(ml_dtypes.bfloat16))
    except ImportError:  # pragma: no cover - ml_dtypes comes with TF
        pass
    return out


_STORAGE_TYPES = _storage_types()


class StorageRef(NamedTuple):
    key: str
    dtype: np.dtype
    numel: int

    shown = "a storage record"


class TensorRef(NamedTuple):
    """A tensor in a torch zip: a view (offset, shape, strides in elements) of a storage."""

    storage: StorageRef
    offset: int
    shape: tuple
    stride: tuple

    shown = "a tensor record"

    @property
    def dtype(self):
        return self.storage.dtype

    def same_view(self, other) -> bool:
        return (self.storage.key, self.offset, self.shape, self.stride) == \
            (other.storage.key, other.offset, other.shape, other.stride)


class _Callable(NamedTuple):
    """What a pickle's admitted global stands for (never called: REDUCE looks at which one it is)."""

    shown: str


_REBUILD = _Callable("torch._utils._rebuild_tensor_v2")
_ORDERED_DICT = _Callable("collections.OrderedDict")
# nn.Parameter's __reduce_ex__: (its data tensor, requires_grad, hooks[, the object's Python state]);
# torch.load(weights_only=True) admits both: the parameter is its data (NVIDIA's older
# run_pretraining.py saves its amp 'master params' as a list of them)
_REBUILD_PARAMETER = _Callable("torch._utils._rebuild_parameter")
_REBUILD_PARAMETER_STATE = _Callable("torch._utils._rebuild_parameter_with_state")
ADMITTED = {("torch._utils", "_rebuild_tensor_v2"): _REBUILD, ("collections", "OrderedDict"): _ORDERED_DICT,
            ("torch._utils", "_rebuild_parameter"): _REBUILD_PARAMETER,
            ("torch._utils", "_rebuild_parameter_with_state"): _REBUILD_PARAMETER_STATE,
            **{("torch", name): st for name, st in _STORAGE_TYPES.items()}}


class _BadPickle(Exception):
    pass


def _is_int(x) -> bool:
    return type(x) is int


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None):
    """Stand-in for ``torch._utils._rebuild_tensor_v2``: an immutable description, types checked."""
    if type(storage) is not StorageRef or not _is_int(storage_offset) or type(size) is not tuple \
            or type(stride) is not tuple or len(size) != len(stride) or len(size) > MAX_DIMS \
            or not all(_is_int(v) for v in size + stride) or not isinstance(requires_grad, bool) \
            or (backward_hooks is not None and (not isinstance(backward_hooks, dict) or backward_hooks)):
        raise _BadPickle("malformed tensor record")
    return TensorRef(storage, storage_offset, size, stride)


def check_view(t: TensorRef) -> int:
    """Check one tensor's view of its storage; returns its extent in elements (0 when empty).

    Accepted: offset and strides >= 0; dims of size > 1 with stride >= 1 that never address one
    element twice (each stride beyond the span of the smaller ones): contiguous, transposed /
    permuted and sliced views, as ``torch.save`` writes them. Every addressed element lies in the
    storage.
    """
    s = t.storage
    if t.offset < 0 or any(n < 0 for n in t.shape) or any(d < 0 for d in t.stride):
        raise _BadPickle("negative offset, size or stride")
    if 0 in t.shape:
        if t.offset > s.numel:
            raise _BadPickle(f"offset {t.offset} beyond its storage of {s.numel} elements")
        return 0
    dims = sorted((d, n) for n, d in zip(t.shape, t.stride) if n > 1)
    span = 0  # largest offset reachable with the dims so far
    for d, n in dims:
        if d <= span:
            raise _BadPickle(f"stride pattern {list(t.stride)} for shape {list(t.shape)} addresses elements "
                             f"twice (an expanded or overlapping view; torch.save of a state dict writes none)")
        span += (n - 1) * d
    extent = span + 1
    if t.offset + extent > s.numel:
        raise _BadPickle(f"tensor view [{t.offset}, +{extent}) outside its storage of {s.numel} elements")
    return extent


def _handlers():
    """The pickle reader's REDUCE, BUILD and persistent-id handlers for a torch.save pickle."""
    storages = {}

    def reduce(fn, args):
        if fn is _REBUILD:
            if not 4 <= len(args) <= 7:
                raise _BadPickle("malformed tensor record")
            return _rebuild_tensor_v2(*args)
        if fn is _ORDERED_DICT and args == ():
            return {}
        if fn is _REBUILD_PARAMETER or fn is _REBUILD_PARAMETER_STATE:
            want = 3 if fn is _REBUILD_PARAMETER else 4
            if len(args) != want or type(args[0]) is not TensorRef or type(args[1]) is not bool \
                    or not (args[2] is None or (type(args[2]) is dict and not args[2])) \
                    or (want == 4 and type(args[3]) not in (dict, tuple)):
                raise _BadPickle("malformed parameter record")
            return args[0]  # a parameter is its data (requires_grad and its Python attributes are not weights)
        raise pickles.Refused(f"REDUCE of {pickles.show(fn)} with {len(args)} arguments")

    def build(obj, state):  # an OrderedDict's _metadata (a module's versions): not needed, dropped
        if type(obj) is dict and type(state) is dict and set(state) <= {"_metadata"}:
            return obj
        raise pickles.Refused(f"BUILD of {pickles.show(obj)}")

    def persistent(pid):
        if not (type(pid) is tuple and len(pid) == 5 and pid[0] == "storage" and type(pid[1]) is _StorageType
                and type(pid[2]) is str and type(pid[3]) is str and _is_int(pid[4]) and pid[4] >= 0):
            raise _BadPickle(f"unexpected persistent id {str(pid)[:80]}")
        _, st, key, _location, numel = pid
        s = storages.get(key)
        if s is None:
            s = storages[key] = StorageRef(key, st.dtype, numel)
        elif s.dtype != st.dtype or s.numel != numel:
            raise _BadPickle(f"storage {key[:40]} declared twice with different types or sizes")
        return s

    return dict(reduce=reduce, build=build, persistent=persistent)


def _flatten(obj, budget: int) -> dict:
    """{"a/b/0/c": TensorRef} of every tensor in a parsed tree (dict keys and list indices joined by
    "/"), walking at most ``budget`` objects."""
    pickles.plain(obj, budget, leaf=lambda x: type(x) in (TensorRef, StorageRef))
    out, stack = {}, [((), obj)]
    while stack:
        path, x = stack.pop()
        if type(x) is TensorRef:
            out["/".join(path)] = x
        elif isinstance(x, dict):
            stack.extend((path + (str(k),), v) for k, v in reversed(list(x.items())))
        elif isinstance(x, (list, tuple)):
            stack.extend((path + (str(i),), v) for i, v in reversed(list(enumerate(x))))
    return out


class TorchZipFile:
    """Tensors of a ``torch.save`` zip file, without torch (see the module docstring)."""

    def __init__(self, path: str, state_dict: bool = True):
        """``state_dict``: the pickle is a state dict (``tensors``: its names); else any tree of
        plain data and tensors (``obj``; ``tensors``: every tensor by its path, "model/bert....")."""
        self.path = path
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise CheckpointError(f"{path}: cannot open ({e.strerror})") from None
        try:
            is_zip = zipfile.is_zipfile(path)
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
        if not is_zip:
            if magic[:1] == b"\x80":
                raise CheckpointError(f"{path}: legacy (pre-1.6, non-zip) PyTorch pickle: bert_of does not "
                                      f"unpickle it; {_LEGACY_HINT}")
            if magic[:2] == b"PK":
                raise CheckpointError(f"{path}: broken zip archive (truncated?)")
            raise CheckpointError(f"{path}: not a PyTorch zip checkpoint; {_LEGACY_HINT}")
        try:
            self._zip = zipfile.ZipFile(path)
            self._first = {}  # name -> its first entry: torch.load reads the first copy of a duplicated
            for info in self._zip.infolist():  # member (zipfile's getinfo, the last)
                self._first.setdefault(info.filename, info)
            pkls = [n for n in self._first if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pkls) != 1:
                raise CheckpointError(f"{path}: not a PyTorch checkpoint (no <archive>/data.pkl)")
            self._root = pkls[0][:-len("data.pkl")]
            order = self._member(self._root + "byteorder", 16, optional=True)
            self._big = order is not None and order.strip() == b"big"
            raw = self._member(pkls[0], _MAX_PICKLE)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError,
                RuntimeError) as e:
            raise CheckpointError(f"{path}: broken zip archive ({str(e)[:120]})") from None
        self.tensors = self._unpickle(raw, state_dict)
        for name, t in self.tensors.items():
            info = self._info(self._root + "data/" + t.storage.key, name)
            need = t.storage.numel * t.dtype.itemsize
            if info.file_size < need:
                raise CheckpointError(f"{path}: tensor {name}: storage {t.storage.key} holds {info.file_size} "
                                      f"bytes, needs {need}")

    def _unpickle(self, raw: bytes, state_dict: bool) -> dict:
        try:
            obj = self.obj = pickles.parse(raw, ADMITTED, **_handlers())
            tensors = _flatten(obj, 4 * len(raw) + 64) if not state_dict else None
        except pickles.Refused as e:
            if str(e).startswith("global "):
                raise UnsafeContent(f"{self.path}: refusing to unpickle {e} (only tensor data is admitted; "
                                      f"nothing was executed)") from None
            raise CheckpointError(f"{self.path}: not a PyTorch state dict pickle ({e})") from None
        except _BadPickle as e:
            raise CheckpointError(f"{self.path}: not a PyTorch state dict ({e})") from None
        if state_dict:
            if not isinstance(obj, dict) or not all(type(k) is str and type(v) is TensorRef for k, v in obj.items()):
                raise CheckpointError(f"{self.path}: not a state dict (expected a mapping of names to tensors)")
            tensors = dict(obj)
        for name, t in tensors.items():  # the whole pickle is read: now every view is checked
            try:
                check_view(t)
            except _BadPickle as e:
                raise CheckpointError(f"{self.path}: tensor {name}: {e}") from None
        return tensors

    def _info(self, member, name=None):
        try:
            return self._first[member]
        except KeyError:
            what = f"tensor {name}: " if name else ""
            raise CheckpointError(f"{self.path}: {what}missing archive member {member}") from None

    def _member(self, member, limit, optional=False):
        try:
            info = self._first[member]
        except KeyError:
            if optional:
                return None
            raise CheckpointError(f"{self.path}: missing archive member {member}") from None
        if info.file_size > limit:
            raise CheckpointError(f"{self.path}: archive member {member} is {info.file_size} bytes "
                                  f"(more than the {limit} a state dict's {member.rpartition('/')[2]} needs)")
        return self._read(info, 0, info.file_size, whole=True)

    def _read(self, info, start: int, length: int, whole: bool) -> bytes:
        """``length`` bytes of a member from ``start``, in bounded chunks (a lying size in the
        directory costs nothing); ``whole`` reads to the end so zipfile checks the CRC."""
        out = bytearray()
        with self._zip.open(info) as f:
            if start:
                f.seek(start)
            while len(out) < length:
                chunk = f.read(min(_CHUNK, length - len(out)))
                if not chunk:
                    break
                out += chunk
            if whole and f.read(1):
                raise CheckpointError(f"{self.path}: archive member {info.filename} is longer than its size")
        return bytes(out)

    def keys(self):
        return list(self.tensors)

    def shape(self, name):
        return self.tensors[name].shape

    def dtype(self, name):
        return self.tensors[name].dtype

    def get(self, name) -> np.ndarray:
        """A fresh, native-order, C-contiguous copy. Reads only the bytes the view spans; a view
        over its whole storage (the usual case) reads the member to its end, so zipfile checks
        its CRC."""
        t = self.tensors[name]
        try:
            extent = check_view(t)  # again: the record is immutable, but the check is cheap
        except _BadPickle as e:
            raise CheckpointError(f"{self.path}: tensor {name}: {e}") from None
        info = self._info(self._root + "data/" + t.storage.key, name)
        item = t.dtype.itemsize
        start, length = t.offset * item, extent * item
        whole = start == 0 and length == info.file_size
        try:
            raw = self._read(info, start, length, whole)
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError, RuntimeError) as e:
            raise CheckpointError(f"{self.path}: tensor {name}: {str(e)[:160]}") from None  # CRC, truncation
        if len(raw) != length:
            raise CheckpointError(f"{self.path}: tensor {name}: storage ended early")
        dtype = t.dtype.newbyteorder(">") if self._big and item > 1 else t.dtype
        if math.prod(t.shape) == 0:
            return np.zeros(t.shape, t.dtype)
        # np.ndarray checks the strided view against the buffer's size itself: a second guard.
        view = np.ndarray(t.shape, dtype=dtype, buffer=raw, offset=0, strides=tuple(s * item for s in t.stride))
        return np.array(view, dtype=t.dtype, order="C")

    def same_view(self, a, b) -> bool:
        return self.tensors[a].same_view(self.tensors[b])

    def close(self):
        self._zip.close()


# --------------------------------------------------------------------------- writing



class Tensor(NamedTuple):
    """A tensor to write: ``produce()`` -> its array, read when its storage is written; tensors
    with one ``storage`` key share it (a tied weight, as torch.save writes one Parameter twice)."""

    storage: str
    dtype: np.dtype
    shape: tuple
    produce: object


def _storage_name(dtype) -> str:
    dt = np.dtype(dtype)
    key = dt.name if dt.name == "bfloat16" or dt.itemsize == 1 else dt.newbyteorder("<").str
    for name, st in _STORAGE_TYPES.items():
        st_key = st.dtype.name if st.dtype.name == "bfloat16" or st.dtype.itemsize == 1 else st.dtype.str
        if st_key == key:
            return name
    raise CheckpointError(f"dtype {dt} has no torch storage type")


def _p_int(v: int) -> bytes:
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if 0 <= v < 65536:
        return b"M" + v.to_bytes(2, "little")
    if -2 ** 31 <= v < 2 ** 31:
        return b"J" + v.to_bytes(4, "little", signed=True)
    n = (v.bit_length() + 8) // 8
    return b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)


def _p_global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _p(v) -> bytes:
    """Protocol-2 opcodes of plain data and :class:`Tensor` records (what torch.save writes for them)."""
    if v is None:
        return b"N"
    if isinstance(v, bool):
        return b"\x88" if v else b"\x89"
    if isinstance(v, int):
        return _p_int(v)
    if isinstance(v, float):
        return b"G" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode("utf-8")
        return b"X" + len(b).to_bytes(4, "little") + b
    if isinstance(v, Tensor):
        numel = int(math.prod(v.shape))
        stride = tuple(int(math.prod(v.shape[k + 1:])) for k in range(len(v.shape)))
        storage = b"(" + _p("storage") + _p_global("torch", _storage_name(v.dtype)) + _p(v.storage) + _p("cpu") \
            + _p(numel) + b"tQ"
        return (_p_global("torch._utils", "_rebuild_tensor_v2") + b"(" + storage + _p(0) + _p(tuple(v.shape))
                + _p(stride) + b"\x89" + _p_global("collections", "OrderedDict") + b")R" + b"tR")
    if isinstance(v, tuple):
        return b"(" + b"".join(_p(x) for x in v) + b"t" if v else b")"
    if isinstance(v, list):
        return b"]" + (b"(" + b"".join(_p(x) for x in v) + b"e" if v else b"")
    if isinstance(v, dict):
        head = _p_global("collections", "OrderedDict") + b")R" if getattr(v, "ordered", False) else b"}"
        return head + (b"(" + b"".join(_p(k) + _p(x) for k, x in v.items()) + b"u" if v else b"")
    raise CheckpointError(f"cannot write a {type(v).__name__} into a torch pickle")


class StateDict(dict):
    """A dict written as torch writes a module's state dict (an OrderedDict)."""

    ordered = True


def write_torch_zip(path: str, obj, root: str = "archive") -> None:
    """``obj`` (plain data, :class:`StateDict`s and :class:`Tensor`s) as ``torch.save`` writes it: a
    zip of ``<root>/data.pkl``, ``<root>/data/<storage>`` (one tensor in memory at a time),
    ``<root>/byteorder`` and ``<root>/version``; ``torch.load(path, weights_only=True)`` reads it."""
    tensors = {}

    def collect(v):
        if isinstance(v, Tensor):
            t = tensors.setdefault(v.storage, v)
            if (t.dtype, tuple(t.shape)) != (v.dtype, tuple(v.shape)):
                raise CheckpointError(f"{path}: storage {v.storage} written with two shapes")
        elif isinstance(v, dict):
            for x in v.values():
                collect(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                collect(x)
    collect(obj)
    raw = b"\x80\x02" + _p(obj) + b"."
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{root}/data.pkl", raw)
        z.writestr(f"{root}/byteorder", b"little")
        for key, t in tensors.items():
            arr = np.ascontiguousarray(np.asarray(t.produce()), dtype=t.dtype)
            if tuple(t.shape) == () and arr.shape == (1,):  # NumPy 1's ascontiguousarray makes a scalar 1-d
                arr = arr.reshape(())
            if arr.shape != tuple(t.shape):
                raise CheckpointError(f"{path}: tensor of storage {key} is {list(arr.shape)}, not {list(t.shape)}")
            z.writestr(f"{root}/data/{key}", arr.astype(arr.dtype.newbyteorder("<")).tobytes()
                       if arr.dtype.itemsize > 1 and arr.dtype.name != "bfloat16" else arr.tobytes())
        z.writestr(f"{root}/version", b"3\n")
