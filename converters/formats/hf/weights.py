"""The weights of a HuggingFace directory: one ``model.safetensors`` or ``pytorch_model.bin``, or an
index of shards (``*.index.json``), opened as one name -> tensor view."""

from __future__ import annotations

import os

import numpy as np

from bert_of.checkpoint import SafetensorsFile
from bert_of.errors import CheckpointError
from bert_of.converters.containers.torch_zip import TorchZipFile
from bert_of.converters.formats.hf.config import read_hf_json
from bert_of.converters.formats.hf.names import PT_BIN, PT_BIN_INDEX, SAFETENSORS, SAFETENSORS_INDEX


class Weights:
    """name -> (file object) over one file or an index of shards (every file opened now, in
    ``pin``'s tree: bert_of.files.pinned.PinnedDir)."""

    def __init__(self, path: str, pin):
        self.files, self.where, self.pin = {}, {}, pin
        self.held = {}  # name -> the file holding it (every shard's tensors, listed in the index or not)
        st, st_idx = os.path.join(path, SAFETENSORS), os.path.join(path, SAFETENSORS_INDEX)
        pt, pt_idx = os.path.join(path, PT_BIN), os.path.join(path, PT_BIN_INDEX)
        isfile = lambda p: os.path.isfile(pin.real(p))  # noqa: E731
        if isfile(st):
            self._add(st, SafetensorsFile)
        elif isfile(st_idx):
            self._index(path, st_idx, SafetensorsFile)
        elif isfile(pt):
            self._add(pt, TorchZipFile)
        elif isfile(pt_idx):
            self._index(path, pt_idx, TorchZipFile)
        else:
            hint = " (tf_model.h5 is the h5 format: use h52of)" if os.path.isfile(os.path.join(path, "tf_model.h5")) \
                else ""
            raise CheckpointError(f"{path}: no {SAFETENSORS} or {PT_BIN} in this HuggingFace directory{hint}")
        self.file = next(iter(self.files)) if len(self.files) == 1 else path

    def _add(self, fpath, cls, names=None):
        f = cls(self.pin.hold(fpath))  # its messages name fpath (reader.whole)
        self.files[fpath] = f
        for k in f.keys():
            if names is not None and k in self.held:
                # transformers loads every shard whole, in order: the last copy wins, whatever the
                # index says; two copies are one too many to guess between
                raise CheckpointError(f"{fpath}: tensor {k} is also in {self.pin.shown(self.held[k])} (the index "
                                      f"names {names.get(k)!r}; transformers would keep the last shard's copy): "
                                      f"a tensor belongs in one shard")
            self.held[k] = f.path
            if names is not None and names.get(k) != os.path.basename(fpath):
                continue
            if k in self.where:
                raise CheckpointError(f"{fpath}: tensor {k} also in {self.pin.shown(self.where[k].path)}")
            self.where[k] = f

    def _index(self, path, idx, cls):
        d = read_hf_json(self.pin.real(idx), "shard index")
        wm = d.get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise CheckpointError(f"{idx}: no weight_map")
        for k, fn in wm.items():  # before sorting: names of other types do not sort
            if not isinstance(fn, str) or os.path.basename(fn) != fn or fn in ("", ".", ".."):
                raise CheckpointError(f"{idx}: shard name {fn!r} (of {k}) is not a file in this directory")
        for fn in sorted(set(wm.values())):
            fpath = os.path.join(path, fn)
            if not os.path.isfile(self.pin.real(fpath)):
                raise CheckpointError(f"{fpath}: shard listed in {os.path.basename(idx)} not found")
            self._add(fpath, cls, wm)
        missing = [k for k in wm if k not in self.where]
        if missing:
            raise CheckpointError(f"{idx}: tensor {missing[0]} is not in its shard {wm[missing[0]]}")

    def names(self):
        return list(self.where)

    def shape(self, k):
        return tuple(self.where[k].shape(k))

    def dtype(self, k):
        return np.dtype(self.where[k].dtype(k))

    def get(self, k):
        return self.where[k].get(k)

    def same_view(self, a, b):
        fa, fb = self.where[a], self.where[b]
        return fa is fb and isinstance(fa, TorchZipFile) and fa.same_view(a, b)
