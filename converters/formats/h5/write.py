"""Writing HuggingFace's Keras h5 (``of2h5``): tf_model.h5 as Keras 2's save_weights writes it for a
transformers TF BERT class (the layout: converters/formats/h5/), its config.json and vocab.txt."""

from __future__ import annotations

import json
import os

import numpy as np

from bert_of.checkpoint import copy_file
from bert_of.config import BertConfig
from bert_of.errors import CheckpointError, OutputError
from bert_of.files.atomic import writes_to
from bert_of.tensors import nbytes
from bert_of.converters.containers import hdf5
from bert_of.converters.formats.hf.config import HF_ACT_LABEL, config_to_hf
from bert_of.converters.source import Options, Source
from bert_of.converters.mapping import apply, apply_shape, inverse
from bert_of.converters.formats.h5.names import CONFIG_FILE, LAYOUTS, POOLER_NAMES, VOCAB_FILE, WEIGHTS_FILE, Layout

# The Keras release whose save_weights layout this writer reproduces (Keras
# only converts weights on load for version "1" files or other backends).
KERAS_VERSION = "2.15.0"
# Keras splits attributes larger than this (HDF5's object header limit).
_ATTR_LIMIT = 64512
_HF_TF_ACTS = ("gelu", "gelu_new", "relu", "tanh", "silu")  # of those, what transformers' TF code computes


def _hf_config_dict(config: BertConfig, architecture: str) -> dict:
    """HF's config.json for ``config``, naming the Keras class written."""
    return dict(config_to_hf(config, [architecture]), architectures=[architecture])


def _layout_of(names: set, notes: list, kind: str = "sequence") -> Layout:
    """The transformers class a set of canonical tensors is: a fine-tuned head wins."""
    heads = {"pretraining": any(n.startswith("cls.") for n in names), "qa": "qa_outputs.weight" in names,
             "classifier": "classifier.weight" in names}
    for key in ("qa", "classifier"):
        if heads[key]:
            return LAYOUTS["token" if key == "classifier" and kind == "token" else key]
    if heads["pretraining"]:
        if {"cls.predictions.bias", "cls.seq_relationship.weight"} <= names:
            return LAYOUTS["pretraining"]
        if "cls.predictions.bias" in names and not any(n.startswith("cls.seq_relationship.") for n in names):
            return LAYOUTS["mlm"]
        notes.append("note: only part of the pretraining heads is present; writing TFBertModel without them")
    return LAYOUTS["model"]


def _set_list_attr(obj, name: str, values: list) -> None:
    """Keras' way: a list of utf-8 bytes, split into name0, name1... past 64 KB."""
    data = [v.encode("utf8") for v in values]
    if not data:
        obj.attrs[name] = data  # Keras writes an empty float64 array here
        return
    arr, n = np.asarray(data), 1
    chunks = [arr]
    while any(c.nbytes > _ATTR_LIMIT for c in chunks):
        n += 1
        chunks = np.array_split(arr, n)
    if n == 1:
        obj.attrs[name] = data
    else:
        for k, c in enumerate(chunks):
            obj.attrs[f"{name}{k}"] = list(c)


def _write_error(path: str, e: Exception) -> OutputError:
    text = str(e)
    if getattr(e, "errno", None) == 28 or "errno = 28," in text or "No space left on device" in text:
        return OutputError(f"{path}: no space left on the device")
    return OutputError(f"{path}: cannot write ({hdf5.first_line(e)})")


def _check_space(d: str, need: int, path: str) -> None:
    """HDF5 reports a full disk late (at flush or close, from every open object, sometimes ending
    in a crash), so the free space is checked before writing: a full disk is one clear line."""
    try:
        st = os.statvfs(d)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise OutputError(f"{path}: no space left on the device (needs about {need:,} bytes, {free:,} free)")


def write_files(source: Source, d: str, opts: Options) -> list:
    """tf_model.h5, config.json (+ vocab.txt) into the (staging) directory ``d``."""
    import h5py

    notes = []
    by_name = {s.name: (s, p) for s, p in source.tensors}
    layout = _layout_of(set(by_name), notes, source.config.classifier_kind)
    rows = layout.weights(source.config.num_hidden_layers)
    placed = {c for _, _, c, _ in rows}
    for name, (spec, prod) in by_name.items():
        if name in placed:
            continue
        if name in POOLER_NAMES and not layout.pooler:
            if name.endswith(".weight") and not np.any(prod()):
                notes.append(f"note: {layout.cls} has no pooler: the zero pooler filled in when reading was left out")
            elif name.endswith(".weight"):
                notes.append(f"note: {layout.cls} has no pooler (HF's add_pooling_layer=False): "
                             f"bert.pooler.dense.* not written")
            continue
        notes.append(f"note: {name} has no place in {layout.cls}: not written")
    for _, _, canonical, _ in rows:
        if canonical not in by_name:
            raise CheckpointError(f"{source.path}: tensor {canonical} is missing ({layout.cls} needs it)")
        dt = np.dtype(by_name[canonical][0].dtype)
        if dt.kind != "f":
            raise CheckpointError(f"{source.path}: tensor {canonical} is {dt}: Keras h5 holds float16/32/64 "
                                  f"weights (pass --dtype float32 or --dtype float16)")
    if opts.with_optimizer:
        n = len(source.optimizer)
        notes.append(f"note: optimizer state is not representable in HF Keras h5 (weights only): "
                     f"{n} optimizer tensor(s) not written" if n else
                     "note: --with-optimizer: HF Keras h5 holds weights only, and the source has no optimizer state")
    label = HF_ACT_LABEL[source.config.hidden_act]
    if label not in _HF_TF_ACTS:
        notes.append(f"note: transformers' TF code has no {label!r} activation; config.json says {label!r} anyway")

    weights = os.path.join(d, WEIGHTS_FILE)
    data = sum(nbytes(by_name[c][0].shape, by_name[c][0].dtype) for _, _, c, _ in rows)
    _check_space(d, data + 4096 * len(rows) + (256 << 10), weights)
    try:
        with h5py.File(weights, "w") as f:
            _write_weights(f, layout, rows, by_name, source)
        fd = os.open(weights, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except (OSError, RuntimeError, ValueError) as e:
        raise _write_error(weights, e) from None
    cfg = os.path.join(d, CONFIG_FILE)
    with writes_to(cfg), open(cfg, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(_hf_config_dict(source.config, layout.architecture), indent=2, sort_keys=True) + "\n")
    if source.vocab_file:
        copy_file(source.vocab_file, os.path.join(d, VOCAB_FILE))
    return notes


def _write_weights(f, layout, rows, by_name, source) -> None:
    _set_list_attr(f, "layer_names", layout.groups)
    f.attrs["backend"] = b"tensorflow"
    f.attrs["keras_version"] = KERAS_VERSION.encode("utf8")
    written = {}  # canonical -> dataset path (the tied copies are HDF5 copies of it)
    for group in sorted(layout.groups):  # Keras writes the groups in name order
        g = f.create_group(group)
        names = []
        for grp, name, canonical, transform in rows:
            if grp != group:
                continue
            w = f"{layout.scope}/{name}"
            names.append(w)
            path = f"{group}/{w}"
            if canonical in written:
                f.copy(f[written[canonical]], path)
                continue
            spec, prod = by_name[canonical]
            arr = np.asarray(apply(inverse(transform), prod()))
            want = apply_shape(inverse(transform), spec.shape)
            if tuple(arr.shape) != tuple(want) or arr.dtype != np.dtype(spec.dtype):
                raise CheckpointError(f"{source.path}: tensor {canonical} produced {arr.dtype}"
                                      f"{list(arr.shape)}, expected {np.dtype(spec.dtype)}{list(want)}")
            ds = f.create_dataset(path, arr.shape, dtype=arr.dtype)
            if arr.size:
                ds[...] = arr
            written[canonical] = path
            del arr
        _set_list_attr(g, "weight_names", names)
    _set_list_attr(f.create_group("top_level_model_weights"), "weight_names", [])
