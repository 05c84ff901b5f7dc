"""HuggingFace Keras weights (``tf_model.h5`` + ``config.json``) <-> canonical names.

The layout is Keras 2's ``save_weights`` HDF5 format as transformers' TF BERT
classes write it (``save_pretrained``), read and written with h5py alone (no
TensorFlow, no transformers):

- root attrs ``backend``, ``keras_version``, ``layer_names`` (the model's
  top-level layers in order: ``bert``, then the heads);
- one group per layer with attr ``weight_names``: the layer's weights in
  order, each ``<model scope>/<inner name>``, stored as a dataset at
  ``<layer>/<scope>/<inner name>``; the scope is the Keras model's name
  (``tf_bert_for_pre_training``, ``tf_bert_model``, ...) and is read from the
  file, never assumed; Keras splits an attr over 64 KB into ``name0``,
  ``name1``, ...;
- an empty ``top_level_model_weights`` group.

TFBertForPreTraining stores the tied word/position/token-type embeddings and
embedding LayerNorm a second time in its ``mlm___cls`` group (the MLM head
holds a reference to the embedding layer): the copies must equal the ``bert``
group's and are reported "tied, dropped". Kernels are [in, out] (transposed to
canonical [out, in]), the NSP kernel too ([H, 2]).

TFBertForQuestionAnswering and TFBertForMaskedLM (the MLM head alone, its tied copies as
TFBertForPreTraining's) are built without a pooler (HF's ``add_pooling_layer=False``). bert_of's model always has one, so reading such a
file fills ``bert.pooler`` with zeros (the QA head never reads it; said in the
report on the head's lines), and writing a QA layout leaves the pooler out
again (with a note when it is not that zero placeholder).

``config.json`` has HuggingFace semantics: ``"gelu"`` is erf-GELU,
``"gelu_new"`` the tanh form, ``layer_norm_eps`` defaults to 1e-12. Keys bert_of
does not use are kept in ``config.extra`` and written back.

The names and the transformers classes' layouts: converters/formats/h5/names.py; writing:
converters/formats/h5/write.py; HDF5 itself: converters/containers/hdf5.py.
"""

from __future__ import annotations

import os
import re

import numpy as np

from bert_of.config import BertConfig
from bert_of.errors import CheckpointError, ConfigError
from bert_of.converters.containers import hdf5
from bert_of.converters.formats.hf.config import config_from_hf, read_hf_json
from bert_of.converters.source import Options, ReportLine, Source
from bert_of.converters.reader import Entry, finish, hit, pooler_zeros, sort, whole
from bert_of.converters.descriptor import TF_WEIGHTS, Format
from bert_of.converters.verify import reference_np
from bert_of.converters.formats.h5.names import (CONFIG_FILE, LAYOUTS, NAME, POOLER, POOLER_NAMES, TABLE, UNSUPPORTED,
                                         VOCAB_FILE, WEIGHTS_FILE)
from bert_of.converters.formats.h5.write import write_files

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


# --------------------------------------------------------------------------- paths, detect


def _weights_path(path: str, pin) -> str:
    if os.path.isdir(path):
        p = os.path.join(path, WEIGHTS_FILE)
        if not os.path.isfile(pin.real(p)):
            if os.path.isfile(pin.real(os.path.join(path, WEIGHTS_FILE + ".index.json"))):
                raise CheckpointError(f"{path}: sharded Keras h5 weights ({WEIGHTS_FILE}.index.json) are not supported")
            raise CheckpointError(f"{path}: no {WEIGHTS_FILE} in the directory")
        return p
    if not os.path.isfile(pin.real(path)):
        raise CheckpointError(f"{path}: no such file or directory")
    return path


def _is_hdf5(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(8) == HDF5_MAGIC
    except OSError:
        return False


def detect(path: str) -> bool:
    """A directory holding tf_model.h5, or an HDF5 file."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, WEIGHTS_FILE))
    return os.path.isfile(path) and _is_hdf5(path)


# --------------------------------------------------------------------------- config


def _hf_config(path: str, held: str, numerics: str | None = None) -> BertConfig:
    """HF's config.json (shared with the safetensors format: "gelu" means erf); ``held``: the
    path that reads it (bert_of.files.pinned.PinnedDir.hold)."""
    return config_from_hf(read_hf_json(held, "HuggingFace config"), path, numerics)


# --------------------------------------------------------------------------- reading


def _attr_list(obj, name: str) -> list | None:
    """A Keras list attribute as str, joining the ``name0``, ``name1``... chunks."""
    if name in obj.attrs:
        values = obj.attrs[name]
    elif f"{name}0" in obj.attrs:
        values, k = [], 0
        while f"{name}{k}" in obj.attrs:
            values.extend(obj.attrs[f"{name}{k}"])
            k += 1
    else:
        return None
    out = []
    for v in np.atleast_1d(values):
        out.append(v.decode("utf8") if isinstance(v, bytes) else str(v))
    return out


def _same(f, path: str, a: str, b: str, rows: int = 4096) -> bool:
    """Bitwise equality of two datasets, a block of rows at a time."""
    da, db = hdf5.plain_dataset(f, path, a), hdf5.plain_dataset(f, path, b)
    if da.shape != db.shape or da.dtype != db.dtype:
        return False
    if not da.shape:
        return hdf5.read_dataset(f, path, a).tobytes() == hdf5.read_dataset(f, path, b).tobytes()
    for start in range(0, da.shape[0], rows):
        try:
            xa, xb = da[start:start + rows], db[start:start + rows]
        except (OSError, ValueError, RuntimeError, TypeError) as e:
            raise CheckpointError(f"{path}: dataset {a}: cannot be read ({hdf5.first_line(e)})") from None
        if xa.tobytes() != xb.tobytes():
            return False
    return True


def _scan(f, path: str):
    """[(group, weight name, dataset path)] in file order, plus unlisted datasets."""
    import h5py

    layers = _attr_list(f, "layer_names")
    if layers is None:
        raise CheckpointError(f"{path}: not a Keras weights file (no layer_names attribute)")
    listed, entries = set(), []
    for layer in layers + ["top_level_model_weights"]:
        if not hdf5.hard_links_only(f, path, layer):
            if layer == "top_level_model_weights":
                continue
            raise CheckpointError(f"{path}: layer {layer!r} is listed in layer_names but has no group")
        names = _attr_list(f[layer], "weight_names") or []
        for w in names:
            ds = f"{layer}/{w}"
            if not hdf5.hard_links_only(f, path, ds) or not isinstance(f.get(ds), h5py.Dataset):
                raise CheckpointError(f"{path}: dataset {ds} is listed in weight_names but missing")
            entries.append((layer, w, ds))
            listed.add(ds)
    unlisted = []
    f.visititems(lambda n, o: unlisted.append(n) if isinstance(o, h5py.Dataset) and n not in listed else None)
    return entries, unlisted


def _layout_for(path: str, scope: str, groups: set, has_pooler: bool) -> str:
    base = re.sub(r"_\d+$", "", scope)  # Keras numbers a second model of a class: tf_bert_model_1
    if base in UNSUPPORTED:
        raise CheckpointError(f"{path}: {UNSUPPORTED[base]} weights are not supported (bert_of reads "
                              f"{', '.join(l.cls for l in LAYOUTS.values())})")
    if base == LAYOUTS["mlm"].scope:
        return "mlm"
    if "mlm___cls" in groups or "nsp___cls" in groups:
        return "pretraining"
    if "qa_outputs" in groups:
        return "qa"
    if "classifier" in groups:
        if base == LAYOUTS["token"].scope:
            return "token"
        if not has_pooler:
            raise CheckpointError(f"{path}: a sequence classifier without a pooler (the head reads the pooled output)")
        return "classifier"
    return "model"


def read(path: str, opts: Options) -> Source:
    path = os.fspath(path)  # a PathLike from a Python caller
    return whole(path, lambda pin: _read_pinned(pin, path, opts))


def _read_pinned(pin, path: str, opts: Options) -> Source:
    """The .h5 file, its config and vocab from ``pin``'s tree (bert_of.files.pinned.PinnedDir): one checkpoint."""
    h5 = _weights_path(path, pin)
    held = pin.hold(h5)
    side = {}  # display path -> held path: the config and vocab opened with the weights (the probe takes a while)
    for p in (opts.config or os.path.join(os.path.dirname(h5) or ".", CONFIG_FILE),
              opts.vocab or os.path.join(os.path.dirname(h5) or ".", VOCAB_FILE)):
        if os.path.isfile(pin.real(p)):
            side[p] = pin.hold(p)
    f = hdf5.open_file(h5, held)
    with hdf5.malformed(h5):
        return _read(f, h5, opts, side)


def _read(f, h5: str, opts: Options, side: dict) -> Source:
    entries, unlisted = _scan(f, h5)
    mapped = [(g, w, ds) for g, w, ds in entries if TABLE.to_canonical(w.partition("/")[2])]
    if not mapped:
        raise CheckpointError(f"{h5}: not a HF BERT Keras h5 (no bert/embeddings/word_embeddings or other BERT weight)")
    scopes = sorted({w.partition("/")[0] for _, w, _ in entries})
    if len(scopes) != 1:
        raise CheckpointError(f"{h5}: weights from more than one model scope ({', '.join(scopes)})")
    scope = scopes[0]
    inner = {ds: w.partition("/")[2] for _, w, ds in entries}
    group = {ds: g for g, _, ds in entries}
    has_pooler = any(inner[ds] == POOLER[0][0] for _, _, ds in entries)
    layout = LAYOUTS[_layout_for(h5, scope, {g for g, _, _ in entries}, has_pooler)]

    cfg_path = opts.config or os.path.join(os.path.dirname(h5) or ".", CONFIG_FILE)
    if cfg_path not in side:
        raise ConfigError(f"{cfg_path}: config file not found (pass --config)")
    held_cfg = side[cfg_path]
    config = _hf_config(cfg_path, held_cfg, opts.numerics)
    if layout is LAYOUTS["token"]:
        config.classifier_kind = "token"
    vocab = opts.vocab or os.path.join(os.path.dirname(h5) or ".", VOCAB_FILE)
    if opts.vocab and vocab not in side:
        raise CheckpointError(f"{vocab}: vocab file not found")
    vocab = side.get(vocab)

    tied = []  # (dataset, canonical, its report line): the MLM head's references to the embeddings

    def classify(e):
        if e.name not in inner:
            return ReportLine(e.name, "unknown", note="not listed in any weight_names (Keras ignores it)")
        found = hit(TABLE, inner[e.name])
        if found and group[e.name] != "bert" and inner[e.name].startswith("bert/"):
            tied.append((e.name, found.target, ReportLine(e.name, "dropped")))
            return tied[-1][2]
        return found

    found = sort([Entry(ds) for _, _, ds in entries] + [Entry(ds) for ds in unlisted], classify, opts, h5,
                 "dataset", TABLE)
    home = {h.target: e.name for e, h in found.model}
    for ds, target, line in tied:  # must equal the bert group's
        if target not in home:
            raise CheckpointError(f"{h5}: dataset {ds} has no counterpart in the bert group")
        if not _same(f, h5, home[target], ds):
            raise CheckpointError(f"{h5}: dataset {ds} differs from {home[target]} "
                                  f"(the MLM head's tied embeddings must equal the model's)")
        line.note = f"tied to {home[target]} (equal), dropped"
    for e, h in found.model:
        d = hdf5.plain_dataset(f, h5, e.name)
        if h.transform == "T" and len(d.shape) != 2:
            raise CheckpointError(f"{h5}: dataset {e.name} has shape {list(d.shape)}; a kernel is 2-D")
        e.shape, e.dtype = tuple(d.shape), d.dtype
        e.read = lambda ds=e.name: hdf5.read_dataset(f, h5, ds)

    fill = []
    if not layout.pooler and not any(h.target in POOLER_NAMES for _, h in found.model):
        word = next((e for e, h in found.model if h.target == "bert.embeddings.word_embeddings.weight"), None)
        fill = pooler_zeros(config, word.dtype if word else np.float32)
        note = (f"no pooler in the source ({layout.cls} has none): bert.pooler filled with zeros, "
                f"which this head does not read")
        for r in found.report:  # said on the head's lines, so the counts stay those of the file
            if r.action == "mapped" and not r.target.startswith("bert."):
                r.note = f"{r.note}; {note}" if r.note else note

    def shown(name):  # where a missing weight would be: group/scope/name
        spelled = TABLE.from_canonical(name)
        return f"{spelled[0].partition('/')[0]}/{scope}/{spelled[0]}" if spelled else name

    return finish(h5, NAME, config, vocab, found, opts, TABLE, fill, noun="dataset", shown=shown, config_file=held_cfg)


FORMAT = Format(NAME, "HuggingFace Keras weights (tf_model.h5 + config.json)", detect, read, write_files,
                reference_np.Keras, owns=(WEIGHTS_FILE, CONFIG_FILE, VOCAB_FILE),
                token_classifier=True,  # config.json's architectures
                table=TABLE, ecosystem=TF_WEIGHTS, dtypes=("float32", "float16"),
                numerics_flag=("tf1", "lazy", "hf"))  # config.json as hf's  # h5py has no bfloat16
