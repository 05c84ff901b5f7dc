"""bert_of checkpoint directories and safetensors I/O (NumPy only, no OneFlow).

A checkpoint is a directory::

    config.json             BertConfig (bert_of's unambiguous numerics)
    vocab.txt               WordPiece vocabulary
    model.safetensors       canonical names, nothing pickled
    optimizer.safetensors   optional: m/<name>, v/<name>, step + semantics in metadata

Directories are written in a staging folder beside the target and swapped into
place (bert_of.files.publish), so a crash never leaves a directory that loads. safetensors files
are written tensor by tensor (peak memory ~ one tensor) and read through a
positioned reads with every offset checked.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
from safetensors import SafetensorError, safe_open

import bert_of.resolver as _resolver
from bert_of.config import BertConfig
from bert_of.errors import BertOfError, CheckpointError, InputTypeError
from bert_of.files.atomic import writes_to
from bert_of.files.pinned import PinnedDir
from bert_of.files.publish import publishing, publishing_into
from bert_of.files.reading import read_json
from bert_of.files.owned import register_own_files
from bert_of.progress import log
from bert_of.tensors import TensorSpec, check_optimizer, check_shape, check_tensors, nbytes

__all__ = ["SafetensorsFile", "Checkpoint", "load_checkpoint", "write_checkpoint", "write_checkpoint_files",
           "write_safetensors", "save_safetensors", "load_safetensors", "is_checkpoint_dir", "resolve_checkpoint"]

CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.txt"
WEIGHTS_NAME = "model.safetensors"
OPTIMIZER_NAME = "optimizer.safetensors"
register_own_files((CONFIG_NAME, VOCAB_NAME, WEIGHTS_NAME, OPTIMIZER_NAME))
MAX_HEADER = 100 << 20  # the safetensors library's own limit

# safetensors dtype codes <-> NumPy. bfloat16 comes from ml_dtypes when present.
_ST_TO_NP = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}


def _bf16():
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # pragma: no cover - ml_dtypes ships with TF and safetensors users
        return None


def st_dtype(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    for code, dt in _ST_TO_NP.items():
        if dt == dtype:
            return code
    if dtype.name == "bfloat16":
        return "BF16"
    raise CheckpointError(f"dtype {dtype} cannot be stored in safetensors")


def np_dtype(code: str, where: str) -> np.dtype:
    if code == "BF16":
        dt = _bf16()
        if dt is not None:
            return dt
    if not isinstance(code, str) or code not in _ST_TO_NP:
        raise CheckpointError(f"{where}: unsupported safetensors dtype {str(code)[:40]!r}")
    return _ST_TO_NP[code]


# --------------------------------------------------------------------------- safetensors


def write_safetensors(path: str, specs: list, produce: Callable[[TensorSpec], np.ndarray],
                      metadata: Optional[dict] = None) -> None:
    """Write ``path`` tensor by tensor: ``produce(spec)`` returns each array in turn.

    The header is built from the specs first, so only one tensor is in memory at
    a time. Writes to ``path`` directly: callers write inside a staging directory.
    An I/O error (a full disk) is one line naming ``path``.
    """
    header, offset = {}, 0
    for s in specs:
        if s.name in header or s.name == "__metadata__":
            raise CheckpointError(f"{path}: tensor name {s.name!r} twice or reserved")
        header[s.name] = {"dtype": st_dtype(s.dtype), "shape": [int(d) for d in s.shape],
                          "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned for mmap readers
    with writes_to(path), open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for s in specs:
            arr = np.asarray(produce(s))
            if tuple(arr.shape) != tuple(s.shape) or arr.dtype != np.dtype(s.dtype):
                raise CheckpointError(
                    f"{path}: tensor {s.name} produced {arr.dtype}{list(arr.shape)}, "
                    f"expected {np.dtype(s.dtype)}{list(s.shape)}")
            f.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
        f.flush()
        os.fsync(f.fileno())


def save_safetensors(path: str, tensors: dict, metadata: Optional[dict] = None) -> None:
    specs = [TensorSpec(k, np.asarray(v).dtype, tuple(np.shape(v))) for k, v in tensors.items()]
    write_safetensors(path, specs, lambda s: tensors[s.name], metadata)


class _Duplicate(ValueError):
    pass


def _unique_keys(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise _Duplicate(k)
        d[k] = v
    return d


def _no_constant(name):  # NaN / Infinity are not JSON (the library's parser refuses them too)
    raise ValueError(f"{name} is not JSON")


def parse_safetensors_header(raw: bytes, data_len: int, where: str):
    """Check a safetensors header as strictly as the safetensors library does and return
    ``(entries, metadata)``: ``entries`` = {name: (dtype, shape, start, end)} (offsets into the data).

    Unique keys (at every level), a dtype bert_of reads, a shape of non-negative ints, offsets in
    order that neither overlap nor leave gaps and cover the data exactly, ``__metadata__`` a
    string-to-string map (or null).
    """
    try:
        text = raw.decode("utf-8")
        header = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except _Duplicate as e:
        raise CheckpointError(f"{where}: header has the key {str(e)[:80]!r} twice") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CheckpointError(f"{where}: not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: not a safetensors file (header is not an object)")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{where}: __metadata__ is not a map of strings to strings")
    entries = {}
    for name, e in header.items():
        t = f"{where}: tensor {name[:200]}"
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
            raise CheckpointError(f"{t}: malformed header entry (needs dtype, shape, data_offsets)")
        dtype = np_dtype(e["dtype"], t)
        if not isinstance(e["shape"], list):
            raise CheckpointError(f"{t}: shape {str(e['shape'])[:40]} is not a list")
        shape = check_shape(e["shape"], t)
        offs = e["data_offsets"]
        if not (isinstance(offs, list) and len(offs) == 2 and
                all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in offs)):
            raise CheckpointError(f"{t}: data_offsets {str(offs)[:60]} are not two non-negative integers")
        start, end = offs
        want = nbytes(shape, dtype)
        if end < start or end - start != want:
            raise CheckpointError(f"{t}: {end - start} bytes for shape {list(shape)} {dtype} (needs {want})")
        if end > data_len:
            raise CheckpointError(f"{t}: data ends at byte {end} but the file holds {data_len} (truncated?)")
        entries[name] = (dtype, shape, start, end)
    ranges = sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3]))
    pos, prev = 0, None
    for name, (_, _, start, end) in ranges:  # overlaps first: they are the attack, gaps follow from them
        if start < pos:
            raise CheckpointError(f"{where}: tensors {prev} and {name} share bytes [{start}, {min(end, pos)}) "
                                  f"(overlapping data)")
        pos, prev = max(pos, end), name
    pos = 0
    for name, (_, _, start, end) in ranges:
        if start > pos:
            raise CheckpointError(f"{where}: bytes [{pos}, {start}) of the data belong to no tensor")
        pos = end
    if pos != data_len:
        raise CheckpointError(f"{where}: {data_len - pos} bytes after the last tensor belong to no tensor")
    return entries, metadata


def _library_check(path: str, fd: int) -> None:
    """The safetensors library's own header check (its parser, not a second looser one) on the
    file open as ``fd`` (through /proc where there is one, so it checks the very file we read)."""
    proc = f"/proc/self/fd/{fd}"
    try:
        with safe_open(proc if os.path.exists(proc) else path, framework="numpy"):
            pass
    except SafetensorError as e:
        msg = str(e).replace("Error while deserializing header: ", "").splitlines()[0][:200]
        raise CheckpointError(f"{path}: not a valid safetensors file ({msg})") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot open ({e.strerror or e})") from None


class SafetensorsFile:
    """Read-only view of a safetensors file; tensors are copied out on demand.

    The header is checked in full before any tensor is read (:func:`parse_safetensors_header`,
    then the safetensors library's parser); tensors are read with positioned reads.
    """

    def __init__(self, path: str, file=None):
        """``file``: the file already open (binary); ``path`` then only names it."""
        self.path = path
        try:
            self._f = file if file is not None else open(path, "rb")
        except OSError as e:
            raise CheckpointError(f"{path}: cannot open ({e.strerror})") from None
        try:
            self._parse()
        except BaseException:
            self._f.close()
            raise

    def _parse(self):
        path = self.path
        st = os.fstat(self._f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path}: not a regular file")
        size = st.st_size
        if size < 8:
            raise CheckpointError(f"{path}: not a safetensors file (only {size} bytes)")
        n = int.from_bytes(os.pread(self._f.fileno(), 8, 0), "little")
        if n > size - 8 or n > MAX_HEADER:
            raise CheckpointError(f"{path}: not a safetensors file (header length {n} exceeds file size {size})")
        raw = os.pread(self._f.fileno(), n, 8)
        if len(raw) != n:
            raise CheckpointError(f"{path}: file ended inside its header")
        self._base = 8 + n
        self.entries, self.metadata = parse_safetensors_header(raw, size - self._base, path)
        _library_check(path, self._f.fileno())

    def keys(self):
        return list(self.entries)

    def shape(self, name):
        return self.entries[name][1]

    def dtype(self, name):
        return self.entries[name][0]

    def spec(self, name) -> TensorSpec:
        return TensorSpec(name, self.dtype(name), self.shape(name))

    def get(self, name: str) -> np.ndarray:
        """A fresh, writable array. Read with pread, not mmap: pages of a mapped
        file count in RSS, and a streaming conversion must hold one tensor only."""
        dtype, shape, _, _ = self.entries[name]
        out = np.empty(shape, dtype=dtype)
        self.read_into(name, out)
        return out

    def read_into(self, name: str, out: np.ndarray) -> None:
        """Read tensor ``name`` into ``out``, C-contiguous memory of its dtype and shape that the caller
        owns (a parameter's own storage: a model then loads holding its weights once, not twice)."""
        dtype, shape, start, end = self.entries[name]
        if out.dtype != np.dtype(dtype) or tuple(out.shape) != tuple(shape) or not out.flags["C_CONTIGUOUS"] \
                or not out.flags["WRITEABLE"]:
            raise InputTypeError(f"read_into({name!r}): needs writable C-contiguous {np.dtype(dtype)} {list(shape)}, "
                            f"got {out.dtype} {list(out.shape)}")
        view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else memoryview(b"")
        pos, off = 0, self._base + start
        try:
            while pos < end - start:
                n = os.preadv(self._f.fileno(), [view[pos:]], off + pos)
                if n <= 0:
                    raise CheckpointError(f"{self.path}: tensor {name}: file ended early")
                pos += n
        except OSError as e:
            raise CheckpointError(f"{self.path}: tensor {name}: cannot read ({e.strerror or e})") from None

    def load_all(self) -> dict:
        return {k: self.get(k) for k in self.entries}

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load_safetensors(path: str) -> dict:
    with SafetensorsFile(path) as f:
        return f.load_all()


# --------------------------------------------------------------------------- directories


@dataclass
class Checkpoint:
    path: str
    config: BertConfig
    tensors: dict  # canonical name -> np.ndarray
    vocab_file: Optional[str]
    optimizer: dict = field(default_factory=dict)
    optimizer_meta: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)


def is_checkpoint_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, CONFIG_NAME)) and \
        os.path.isfile(os.path.join(path, WEIGHTS_NAME))


RUN_FINAL = "final"  # a training run's folder (bert_of.training.state.RunDir): its last checkpoint
RUN_CHECKPOINTS = "checkpoints"  # ... and its periodic ones, checkpoints/step-NNNNNNN
RUN_METRICS = "metrics.jsonl"


def is_run_dir(path: str) -> bool:
    """Whether ``path`` is a training run's folder (pretrain/finetune ``-o``): bert_of's run files
    (metrics.jsonl, final/, checkpoints/) and no weights at its top. A pretraining run keeps the
    ``config.json`` it was given at its top, so a config there does not make it a model."""
    if not os.path.isdir(path) or os.path.lexists(os.path.join(path, WEIGHTS_NAME)):
        return False
    return (os.path.isfile(os.path.join(path, RUN_METRICS)) or os.path.isdir(os.path.join(path, RUN_FINAL))
            or os.path.isdir(os.path.join(path, RUN_CHECKPOINTS)))


_NOTED: set = set()  # runs whose stand-in checkpoint this process has named already (one note per run)


def run_final(path: str) -> str:
    """``path``, or, when ``path`` is a training run's folder (a run is not a model), the checkpoint
    it published: ``path/final``. A run that published none (stopped before its end) stands for its
    newest periodic checkpoint (``checkpoints/step-N``), named in a note; a run with neither is a
    CheckpointError. Every command taking a model comes here (bert_of.zoo.resolve, zoo add, the
    converters' detect/read, verify, inspect), so a run is the same model everywhere."""
    if not is_run_dir(path):
        return path
    final = os.path.join(path, RUN_FINAL)
    if os.path.isdir(final):
        return final  # its reader says what is wrong with it, if anything
    ckpts = os.path.join(path, RUN_CHECKPOINTS)
    try:
        steps = sorted((n for n in os.listdir(ckpts) if n.startswith("step-")), reverse=True)
    except OSError:
        steps = []
    for n in steps:  # the newest that is a checkpoint (a save killed midway publishes nothing)
        newest = os.path.join(ckpts, n)
        if is_checkpoint_dir(newest):
            key = os.path.realpath(path)
            if key not in _NOTED:
                _NOTED.add(key)
                log.warning(f"note: {path}: a training run with no {RUN_FINAL}/ checkpoint (stopped before its end?); "
                            f"using its newest checkpoint {newest}")
            return newest
    passed = f"; {os.path.join(ckpts, steps[0])} is not a complete checkpoint" if steps else ""
    raise CheckpointError(f"{path}: a training run with no {RUN_FINAL}/ checkpoint and no periodic checkpoint "
                          f"in {RUN_CHECKPOINTS}/ (stopped before its first save?){passed}")


def resolve_checkpoint(name_or_path, vocab: Optional[str] = None) -> str:
    """A bert_of checkpoint directory for ``name_or_path``: such a directory as it is; anything else
    (a zoo name, a checkpoint in another format) through the resolver an upper layer registered
    (bert_of.resolver.register_resolver: the package facade registers the zoo's). ``vocab``: the
    vocabulary of a checkpoint in another format that holds none (``from_pretrained(vocab=...)``)."""
    path = os.fspath(name_or_path)
    if is_checkpoint_dir(path):
        try:
            config = read_json(os.path.join(path, CONFIG_NAME))
        except BertOfError:
            return path  # load_checkpoint says what is wrong with its config
        if "provenance" in config:  # HF directories hold config.json + model.safetensors too, without it
            return path
    if _resolver.resolver is None:
        raise CheckpointError(f"{path}: not a bert_of checkpoint directory (zoo names and other formats "
                              "resolve once bert_of registers its resolver: import bert_of)")
    return _resolver.resolver(path) if vocab is None else _resolver.resolver(path, vocab=vocab)


class StreamedTensors(Mapping):
    """A checkpoint's tensors left in their (open, already checked) safetensors file, each read when
    asked: ``[name]`` a fresh array, :meth:`read_into` into memory the caller owns. A model loads
    through it holding its weights once (its parameters), not twice (they and every array) -- the
    peak memory of ``from_pretrained``. The file stays open until :meth:`close` (or collection);
    an open file reads the tree it was opened in, even if the folder is replaced meanwhile."""

    def __init__(self, f: "SafetensorsFile"):
        self._f = f

    def spec(self, name: str) -> TensorSpec:
        return self._f.spec(name)

    def read_into(self, name: str, out: np.ndarray) -> None:
        self._f.read_into(name, out)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._f.get(name)

    def __iter__(self):
        return iter(self._f.keys())

    def __len__(self):
        return len(self._f.entries)

    def close(self):
        self._f.close()


def load_checkpoint(path: str, with_optimizer: bool = False, streamed: bool = False) -> Checkpoint:
    """Read a bert_of checkpoint directory; the tensors are NumPy arrays (``streamed``: a
    :class:`StreamedTensors` over the open file instead, read one tensor at a time).

    Every tensor passes :func:`bert_of.tensors.check_tensors` (dtype, shape, fit to the config)
    before any is read.
    """
    for attempt in range(5):
        if not os.path.isdir(path):
            raise CheckpointError(f"{path}: not a directory (a bert_of checkpoint is a directory)")
        try:
            d = PinnedDir(path)  # every file from one tree, even if ``path`` is replaced meanwhile
        except OSError as e:
            raise CheckpointError(f"{path}: cannot open ({e.strerror})") from None
        with d:
            try:
                return _load_pinned(d, with_optimizer, streamed)
            except (OSError, CheckpointError) as e:
                if attempt == 4 or not d.replaced():
                    if isinstance(e, OSError):
                        raise CheckpointError(f"{os.path.join(path, e.filename or '')}: "
                                              f"cannot read ({e.strerror})") from None
                    raise
                # the tree we held was replaced and deleted while we read it: read the new one


def _load_pinned(d: PinnedDir, with_optimizer: bool, streamed: bool = False) -> Checkpoint:
    path = d.path
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not d.isfile(name):
            raise CheckpointError(f"{path}: not a bert_of checkpoint (no {name})")
    config_path = os.path.join(path, CONFIG_NAME)
    config = BertConfig.from_json_file(config_path, raw=d.read(CONFIG_NAME))
    weights = os.path.join(path, WEIGHTS_NAME)
    f = SafetensorsFile(weights, d.open(WEIGHTS_NAME))
    try:
        check_tensors([f.spec(k) for k in f.keys()], config, weights)  # before anything is read
        tensors, metadata = StreamedTensors(f) if streamed else f.load_all(), dict(f.metadata)
    except BaseException:
        f.close()
        raise
    if not streamed:
        f.close()
    vocab = os.path.join(path, VOCAB_NAME)
    ck = Checkpoint(path, config, tensors, vocab if d.isfile(VOCAB_NAME) else None, metadata=metadata)
    opt = os.path.join(path, OPTIMIZER_NAME)
    if with_optimizer and d.isfile(OPTIMIZER_NAME):
        with SafetensorsFile(opt, d.open(OPTIMIZER_NAME)) as f:
            check_optimizer([f.spec(k) for k in f.keys()], config, opt)
            ck.optimizer, ck.optimizer_meta = f.load_all(), dict(f.metadata)
    return ck


def write_checkpoint(path: str, tensors, config: BertConfig, vocab_file: Optional[str] = None,
                     optimizer: Optional[tuple] = None, overwrite: bool = False,
                     metadata: Optional[dict] = None, into: bool = False) -> None:
    """Write a checkpoint directory atomically (see :func:`bert_of.files.publish.publishing`).

    tensors: list of (name, array) or of (TensorSpec, producer) pairs; the latter
    streams (one tensor in memory at a time). optimizer: the same, plus its
    metadata, as ``(items, meta)``. ``into``: ``path`` may be an existing folder, whose files of
    these names are replaced and others kept (:func:`bert_of.files.publish.publishing_into`; an optimizer
    state left there goes when none is written: it belonged to other weights).
    """
    if vocab_file is not None and not os.path.isfile(vocab_file):
        raise CheckpointError(f"{vocab_file}: vocab file not found")
    dest = (publishing_into(path, remove=() if optimizer else (OPTIMIZER_NAME,)) if into
            else publishing(path, overwrite=overwrite))
    with dest as tmp:
        write_checkpoint_files(tmp, tensors, config, vocab_file, optimizer, metadata)


def write_checkpoint_files(d: str, tensors, config: BertConfig, vocab_file: Optional[str] = None,
                           optimizer: Optional[tuple] = None, metadata: Optional[dict] = None) -> None:
    """The files of a checkpoint into an existing (staging) directory ``d``."""
    with writes_to(os.path.join(d, CONFIG_NAME)), open(os.path.join(d, CONFIG_NAME), "w") as f:
        f.write(config.to_json_string())
    if vocab_file is not None:
        copy_file(vocab_file, os.path.join(d, VOCAB_NAME))
    _write_items(os.path.join(d, WEIGHTS_NAME), tensors, metadata)
    if optimizer is not None:
        items, meta = optimizer
        _write_items(os.path.join(d, OPTIMIZER_NAME), items, meta)


def _write_items(path, items, metadata):
    items = list(items)
    if items and isinstance(items[0][0], TensorSpec):
        specs = [s for s, _ in items]
        producers = {s.name: p for s, p in items}
        write_safetensors(path, specs, lambda s: producers[s.name](), metadata)
    else:
        save_safetensors(path, dict(items), metadata)


def copy_file(src: str, dst: str) -> None:
    """Copy a side file (vocab.txt) into a staging directory; errors name the file at fault."""
    try:
        with open(src, "rb") as fin:
            with writes_to(dst), open(dst, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
    except OSError as e:  # the source side: unreadable
        raise CheckpointError(f"{src}: cannot read ({e.strerror or e})") from None
