"""bert_of checkpoint directories and safetensors I/O (NumPy only, no OneFlow).

A checkpoint is a directory::

    config.json             BertConfig (bert_of's unambiguous numerics)
    vocab.txt               WordPiece vocabulary
    model.safetensors       canonical names, nothing pickled
    optimizer.safetensors   optional: m/<name>, v/<name>, step + semantics in metadata

Directories are written in a staging folder beside the target and swapped into
place (bert_of.fs), so a crash never leaves a directory that loads. safetensors files
are written tensor by tensor (peak memory ~ one tensor) and read through a
positioned reads with every offset checked.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import numpy as np

import bert_of.hooks as _hooks
from bert_of.config import BertConfig
from bert_of.errors import BertOfError, CheckpointError
from bert_of.fs import publishing, read_json

CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.txt"
WEIGHTS_NAME = "model.safetensors"
OPTIMIZER_NAME = "optimizer.safetensors"

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
    if code not in _ST_TO_NP:
        raise CheckpointError(f"{where}: unsupported safetensors dtype {code}")
    return _ST_TO_NP[code]


# --------------------------------------------------------------------------- safetensors


@dataclass
class TensorSpec:
    name: str
    dtype: np.dtype
    shape: tuple

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def write_safetensors(path: str, specs: list, produce: Callable[[TensorSpec], np.ndarray],
                      metadata: Optional[dict] = None) -> None:
    """Write ``path`` tensor by tensor: ``produce(spec)`` returns each array in turn.

    The header is built from the specs first, so only one tensor is in memory at
    a time. Writes to ``path`` directly: callers write inside a temp directory.
    """
    header, offset = {}, 0
    for s in specs:
        header[s.name] = {"dtype": st_dtype(s.dtype), "shape": [int(d) for d in s.shape],
                          "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned for mmap readers
    with open(path, "wb") as f:
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


class SafetensorsFile:
    """Read-only view of a safetensors file; tensors are copied out on demand."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._f = open(path, "rb")
        except OSError as e:
            raise CheckpointError(f"{path}: cannot open ({e.strerror})") from None
        size = os.fstat(self._f.fileno()).st_size
        if size < 8:
            raise CheckpointError(f"{path}: not a safetensors file (only {size} bytes)")
        n = int.from_bytes(self._f.read(8), "little")
        if n > size - 8 or n > 100 << 20:
            raise CheckpointError(f"{path}: not a safetensors file (header length {n} exceeds file size {size})")
        try:
            header = json.loads(self._f.read(n))
        except ValueError:
            raise CheckpointError(f"{path}: not a safetensors file (header is not JSON)") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: not a safetensors file (header is not an object)")
        self.metadata = header.pop("__metadata__", None) or {}
        self._base = 8 + n
        data_len = size - self._base
        self.entries = {}
        for name, e in header.items():
            try:
                dtype = np_dtype(e["dtype"], f"{path}: tensor {name}")
                shape = tuple(int(d) for d in e["shape"])
                start, end = (int(x) for x in e["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise CheckpointError(f"{path}: tensor {name}: malformed header entry") from None
            want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if end - start != want or start < 0:
                raise CheckpointError(
                    f"{path}: tensor {name}: {end - start} bytes for shape {list(shape)} {dtype} (needs {want})")
            if end > data_len:
                raise CheckpointError(
                    f"{path}: tensor {name}: data ends at byte {end} but the file holds {data_len} (truncated?)")
            self.entries[name] = (dtype, shape, start, end)

    def keys(self):
        return list(self.entries)

    def shape(self, name):
        return self.entries[name][1]

    def dtype(self, name):
        return self.entries[name][0]

    def get(self, name: str) -> np.ndarray:
        """A fresh, writable array. Read with pread, not mmap: pages of a mapped
        file count in RSS, and a streaming conversion must hold one tensor only."""
        dtype, shape, start, end = self.entries[name]
        out = np.empty(shape, dtype=dtype)
        view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else memoryview(b"")
        pos, off = 0, self._base + start
        while pos < end - start:
            n = os.preadv(self._f.fileno(), [view[pos:]], off + pos)
            if n <= 0:
                raise CheckpointError(f"{self.path}: tensor {name}: file ended early")
            pos += n
        return out

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


def resolve_checkpoint(name_or_path) -> str:
    """A bert_of checkpoint directory for ``name_or_path``: such a directory as it is; anything else
    (a zoo name, a checkpoint in another format) through the resolver an upper layer registered
    (bert_of.hooks.register_resolver: the package facade registers the zoo's)."""
    path = os.fspath(name_or_path)
    if is_checkpoint_dir(path):
        try:
            config = read_json(os.path.join(path, CONFIG_NAME))
        except BertOfError:
            return path  # load_checkpoint says what is wrong with its config
        if "provenance" in config:  # HF directories hold config.json + model.safetensors too, without it
            return path
    if _hooks.resolver is None:
        raise CheckpointError(f"{path}: not a bert_of checkpoint directory (zoo names and other formats "
                              "resolve once bert_of registers its resolver: import bert_of)")
    return _hooks.resolver(path)


def load_checkpoint(path: str, with_optimizer: bool = False) -> Checkpoint:
    """Read a bert_of checkpoint directory; the tensors are NumPy arrays."""
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory (a bert_of checkpoint is a directory)")
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not os.path.isfile(os.path.join(path, name)):
            raise CheckpointError(f"{path}: not a bert_of checkpoint (no {name})")
    config = BertConfig.from_json_file(os.path.join(path, CONFIG_NAME))
    with SafetensorsFile(os.path.join(path, WEIGHTS_NAME)) as f:
        tensors, metadata = f.load_all(), dict(f.metadata)
    vocab = os.path.join(path, VOCAB_NAME)
    ck = Checkpoint(path, config, tensors, vocab if os.path.isfile(vocab) else None, metadata=metadata)
    opt = os.path.join(path, OPTIMIZER_NAME)
    if with_optimizer and os.path.isfile(opt):
        with SafetensorsFile(opt) as f:
            ck.optimizer, ck.optimizer_meta = f.load_all(), dict(f.metadata)
    return ck


def write_checkpoint(path: str, tensors, config: BertConfig, vocab_file: Optional[str] = None,
                     optimizer: Optional[tuple] = None, overwrite: bool = False,
                     metadata: Optional[dict] = None) -> None:
    """Write a checkpoint directory atomically (see :func:`bert_of.fs.publishing`).

    tensors: list of (name, array) or of (TensorSpec, producer) pairs; the latter
    streams (one tensor in memory at a time). optimizer: the same, plus its
    metadata, as ``(items, meta)``.
    """
    if vocab_file is not None and not os.path.isfile(vocab_file):
        raise CheckpointError(f"{vocab_file}: vocab file not found")
    with publishing(path, overwrite=overwrite) as tmp:
        write_checkpoint_files(tmp, tensors, config, vocab_file, optimizer, metadata)


def write_checkpoint_files(d: str, tensors, config: BertConfig, vocab_file: Optional[str] = None,
                           optimizer: Optional[tuple] = None, metadata: Optional[dict] = None) -> None:
    """The files of a checkpoint into an existing (staging) directory ``d``."""
    with open(os.path.join(d, CONFIG_NAME), "w") as f:
        f.write(config.to_json_string())
    if vocab_file is not None:
        shutil.copyfile(vocab_file, os.path.join(d, VOCAB_NAME))
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


def expected_shapes(config: BertConfig) -> dict:
    """Canonical name -> shape for BertModel and every head bert_of knows."""
    H, I, V = config.hidden_size, config.intermediate_size, config.vocab_size
    s = {
        "bert.embeddings.word_embeddings.weight": (V, H),
        "bert.embeddings.position_embeddings.weight": (config.max_position_embeddings, H),
        "bert.embeddings.token_type_embeddings.weight": (config.type_vocab_size, H),
        "bert.embeddings.LayerNorm.weight": (H,), "bert.embeddings.LayerNorm.bias": (H,),
        "bert.pooler.dense.weight": (H, H), "bert.pooler.dense.bias": (H,),
        "cls.predictions.bias": (V,),
        "cls.predictions.transform.dense.weight": (H, H), "cls.predictions.transform.dense.bias": (H,),
        "cls.predictions.transform.LayerNorm.weight": (H,), "cls.predictions.transform.LayerNorm.bias": (H,),
        "cls.seq_relationship.weight": (2, H), "cls.seq_relationship.bias": (2,),
        "qa_outputs.weight": (2, H), "qa_outputs.bias": (2,),
        "classifier.weight": (config.num_labels, H), "classifier.bias": (config.num_labels,),
    }
    for i in range(config.num_hidden_layers):
        p = f"bert.encoder.layer.{i}."
        for n in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            s[p + n + ".weight"], s[p + n + ".bias"] = (H, H), (H,)
        s[p + "intermediate.dense.weight"], s[p + "intermediate.dense.bias"] = (I, H), (I,)
        s[p + "output.dense.weight"], s[p + "output.dense.bias"] = (H, I), (H,)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            s[p + n + ".weight"], s[p + n + ".bias"] = (H,), (H,)
    return s


def backbone_names(config: BertConfig) -> list:
    return [k for k in expected_shapes(config) if k.startswith("bert.")]


def check_against_config(shapes: dict, config: BertConfig, source: Callable[[str], str], where: str,
                         source_shape: Optional[Callable] = None) -> None:
    """Every backbone tensor present, every tensor the shape the config implies.

    shapes: canonical name -> canonical shape. ``source(name)`` gives the name
    in the input format and ``source_shape(name, shape)`` the shape as stored
    there, so messages show what is on disk.
    """
    on_disk = source_shape or (lambda name, shape: tuple(shape))
    want = expected_shapes(config)
    for name, shape in shapes.items():
        if name not in want:
            m = name.split(".")
            if len(m) > 3 and m[:3] == ["bert", "encoder", "layer"] and m[3].isdigit():
                raise CheckpointError(
                    f"{where}: tensor {source(name)} is layer {m[3]} but the config has "
                    f"num_hidden_layers {config.num_hidden_layers}")
            raise CheckpointError(f"{where}: tensor {source(name)} has no place in a BERT model")
        if tuple(shape) != tuple(want[name]):
            raise CheckpointError(
                f"{where}: tensor {source(name)} has shape {list(on_disk(name, shape))} but the config implies "
                f"{list(on_disk(name, want[name]))} (config does not fit the tensors)")
    for name in backbone_names(config):
        if name not in shapes:
            raise CheckpointError(f"{where}: tensor {source(name)} is missing")
