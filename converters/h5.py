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
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from bert_of.checkpoint import copy_file
from bert_of.config import BertConfig
from bert_of.errors import CheckpointError, ConfigError, OutputError
from bert_of.files.atomic import writes_to
from bert_of.tensors import nbytes
from bert_of.converters import hdf5
from bert_of.converters.hf_config import HF_ACT_LABEL, config_from_hf, config_to_hf, read_hf_json
from bert_of.converters.source import Options, ReportLine, Source
from bert_of.converters.mapping import Table, apply, apply_shape, inverse, spell
from bert_of.converters.reader import Entry, finish, hit, pooler_zeros, sort, whole
from bert_of.converters.descriptor import Format
from bert_of.converters import reference_np

NAME = "h5"
WEIGHTS_FILE = "tf_model.h5"
CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.txt"
# The Keras release whose save_weights layout this writer reproduces (Keras
# only converts weights on load for version "1" files or other backends).
KERAS_VERSION = "2.15.0"
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# Keras splits attributes larger than this (HDF5's object header limit).
_ATTR_LIMIT = 64512


def _scope(canonical: str) -> str:
    scope = canonical
    if scope.startswith(("cls.predictions", "cls.seq_relationship")):  # the heads' Keras layers
        scope = ("mlm___" if scope.startswith("cls.predictions") else "nsp___") + scope
    return scope.replace(".", "/").replace("layer/{i}", "layer_._{i}")


# How HF's Keras layers name their weights (every Dense kernel [in, out]).
PARAMS = {
    "embedding": [("/weight:0", ".weight")],
    "table": [("/embeddings:0", ".weight")],
    "dense": [("/kernel:0", ".weight", "T"), ("/bias:0", ".bias")],
    "ln": [("/LayerNorm/gamma:0", ".LayerNorm.weight"), ("/LayerNorm/beta:0", ".LayerNorm.bias")],
    "bias": [("/bias:0", ".bias")],
}
_OWN = {"bert.embeddings.token_type_embeddings": ("bert/embeddings/token_type_embeddings", "table"),
        "bert.embeddings.position_embeddings": ("bert/embeddings/position_embeddings", "table")}


def _rows(*groups):
    return spell(_scope, PARAMS, _OWN, groups)


# Format names are the weight names without the model scope (what HF's own
# loader matches on); rows are in the order HF's classes create the weights.
EMBEDDINGS, LAYER, POOLER = _rows("embeddings"), _rows("layer"), _rows("pooler")
MLM = sorted(_rows("mlm"), key=lambda r: r[1] != "cls.predictions.bias")  # TFBertMLMHead creates its bias first
NSP, QA, CLASSIFIER = _rows("nsp"), _rows("qa"), _rows("classifier")
TABLE = Table([*EMBEDDINGS, *LAYER, *POOLER, *MLM, *NSP, *QA, *CLASSIFIER])
_POOLER_NAMES = [r[1] for r in POOLER]


class Layout:
    """One transformers TF class: its Keras scope, top-level layers and weights."""

    def __init__(self, cls, scope, groups, pooler, heads):
        self.cls, self.scope, self.groups, self.pooler, self.heads = cls, scope, groups, pooler, heads

    @property
    def architecture(self):  # what HF's save_pretrained records in config.json
        return self.cls[2:]

    def weights(self, num_layers: int) -> list:
        """[(group, format name, canonical, transform)] in HF's order."""
        rows = [("bert", *_row(r)) for r in EMBEDDINGS]
        for i in range(num_layers):
            rows += [("bert", n.format(i=i), c.format(i=i), t) for n, c, t in map(_row, LAYER)]
        rows += [("bert", *_row(r)) for r in POOLER] if self.pooler else []
        for group, head in self.heads:
            rows += [(group, *_row(r)) for r in head]
        return rows


def _row(r):
    return (r[0], r[1], r[2] if len(r) > 2 else None)


LAYOUTS = {
    "pretraining": Layout("TFBertForPreTraining", "tf_bert_for_pre_training", ["bert", "nsp___cls", "mlm___cls"],
                          True, [("nsp___cls", NSP), ("mlm___cls", MLM + EMBEDDINGS)]),
    # the same MLM head without NSP, and no pooler (transformers' add_pooling_layer=False)
    "mlm": Layout("TFBertForMaskedLM", "tf_bert_for_masked_lm", ["bert", "mlm___cls"], False,
                  [("mlm___cls", MLM + EMBEDDINGS)]),
    "model": Layout("TFBertModel", "tf_bert_model", ["bert"], True, []),
    "qa": Layout("TFBertForQuestionAnswering", "tf_bert_for_question_answering", ["bert", "qa_outputs"], False,
                 [("qa_outputs", QA)]),
    "classifier": Layout("TFBertForSequenceClassification", "tf_bert_for_sequence_classification",
                         ["bert", "classifier"], True, [("classifier", CLASSIFIER)]),
    # the same classifier.* on every position (config.classifier_kind "token"), no pooler
    "token": Layout("TFBertForTokenClassification", "tf_bert_for_token_classification", ["bert", "classifier"],
                    False, [("classifier", CLASSIFIER)]),
}
# Keras scopes of transformers' TF BERT classes bert_of has no head for.
UNSUPPORTED = {
    "tf_bert_lm_head_model": "TFBertLMHeadModel",
    "tf_bert_for_next_sentence_prediction": "TFBertForNextSentencePrediction",
    "tf_bert_for_multiple_choice": "TFBertForMultipleChoice",
}

_HF_TF_ACTS = ("gelu", "gelu_new", "relu", "tanh", "silu")  # of those, what transformers' TF code computes


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


def _hf_config_dict(config: BertConfig, architecture: str) -> dict:
    """HF's config.json for ``config``, naming the Keras class written."""
    return dict(config_to_hf(config, [architecture]), architectures=[architecture])


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
    if not layout.pooler and not any(h.target in _POOLER_NAMES for _, h in found.model):
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


# --------------------------------------------------------------------------- writing


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
        if name in _POOLER_NAMES and not layout.pooler:
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


FORMAT = Format(NAME, "HuggingFace Keras weights (tf_model.h5 + config.json)", detect, read, write_files,
                reference_np.Keras, owns=(WEIGHTS_FILE, CONFIG_FILE, VOCAB_FILE),
                token_classifier=True,  # config.json's architectures
                table=TABLE, ecosystem="tf-weights", dtypes=("float32", "float16"))  # h5py has no bfloat16
