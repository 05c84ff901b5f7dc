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

TFBertForQuestionAnswering is built without a pooler (HF's
``add_pooling_layer=False``). bert_of's model always has one, so reading such a
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

from bert_of.checkpoint import TensorSpec, check_against_config, copy_file, expected_shapes
from bert_of.config import BertConfig
from bert_of.errors import CheckpointError, ConfigError, OutputError
from bert_of.fs import writes_to
from bert_of.tensors import nbytes
from bert_of.converters import hdf5, hf
from bert_of.converters.common import Options, ReportLine, Source, cast_spec, write_with
from bert_of.converters.mapping import Table, apply, apply_shape, inverse

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


def _dense(h5, can):
    return [(f"{h5}/kernel:0", f"{can}.weight", "T"), (f"{h5}/bias:0", f"{can}.bias")]


def _ln(h5, can):
    return [(f"{h5}/LayerNorm/gamma:0", f"{can}.LayerNorm.weight"), (f"{h5}/LayerNorm/beta:0", f"{can}.LayerNorm.bias")]


# Format names are the weight names without the model scope (what HF's own
# loader matches on); rows are in the order HF's classes create the weights.
_L, _C = "bert/encoder/layer_._{i}", "bert.encoder.layer.{i}"
EMBEDDINGS = [
    ("bert/embeddings/word_embeddings/weight:0", "bert.embeddings.word_embeddings.weight"),
    ("bert/embeddings/token_type_embeddings/embeddings:0", "bert.embeddings.token_type_embeddings.weight"),
    ("bert/embeddings/position_embeddings/embeddings:0", "bert.embeddings.position_embeddings.weight"),
    *_ln("bert/embeddings", "bert.embeddings"),
]
LAYER = [
    *_dense(f"{_L}/attention/self/query", f"{_C}.attention.self.query"),
    *_dense(f"{_L}/attention/self/key", f"{_C}.attention.self.key"),
    *_dense(f"{_L}/attention/self/value", f"{_C}.attention.self.value"),
    *_dense(f"{_L}/attention/output/dense", f"{_C}.attention.output.dense"),
    *_ln(f"{_L}/attention/output", f"{_C}.attention.output"),
    *_dense(f"{_L}/intermediate/dense", f"{_C}.intermediate.dense"),
    *_dense(f"{_L}/output/dense", f"{_C}.output.dense"),
    *_ln(f"{_L}/output", f"{_C}.output"),
]
POOLER = _dense("bert/pooler/dense", "bert.pooler.dense")
MLM = [
    ("mlm___cls/predictions/bias:0", "cls.predictions.bias"),
    *_dense("mlm___cls/predictions/transform/dense", "cls.predictions.transform.dense"),
    *_ln("mlm___cls/predictions/transform", "cls.predictions.transform"),
]
NSP = _dense("nsp___cls/seq_relationship", "cls.seq_relationship")
QA = _dense("qa_outputs", "qa_outputs")
CLASSIFIER = _dense("classifier", "classifier")
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
    "model": Layout("TFBertModel", "tf_bert_model", ["bert"], True, []),
    "qa": Layout("TFBertForQuestionAnswering", "tf_bert_for_question_answering", ["bert", "qa_outputs"], False,
                 [("qa_outputs", QA)]),
    "classifier": Layout("TFBertForSequenceClassification", "tf_bert_for_sequence_classification",
                         ["bert", "classifier"], True, [("classifier", CLASSIFIER)]),
}
# Keras scopes of transformers' TF BERT classes bert_of has no head for.
UNSUPPORTED = {
    "tf_bert_for_masked_lm": "TFBertForMaskedLM",
    "tf_bert_lm_head_model": "TFBertLMHeadModel",
    "tf_bert_for_next_sentence_prediction": "TFBertForNextSentencePrediction",
    "tf_bert_for_token_classification": "TFBertForTokenClassification",
    "tf_bert_for_multiple_choice": "TFBertForMultipleChoice",
}

_HF_TF_ACTS = ("gelu", "gelu_new", "relu", "tanh", "silu")  # of those, what transformers' TF code computes


# --------------------------------------------------------------------------- paths, detect


def _weights_path(path: str) -> str:
    if os.path.isdir(path):
        p = os.path.join(path, WEIGHTS_FILE)
        if not os.path.isfile(p):
            if os.path.isfile(os.path.join(path, WEIGHTS_FILE + ".index.json")):
                raise CheckpointError(f"{path}: sharded Keras h5 weights ({WEIGHTS_FILE}.index.json) are not supported")
            raise CheckpointError(f"{path}: no {WEIGHTS_FILE} in the directory")
        return p
    if not os.path.isfile(path):
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


def _hf_config(path: str, numerics: str | None = None) -> BertConfig:
    """HF's config.json (shared with the safetensors format: "gelu" means erf)."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: config file not found (pass --config)")
    return hf.config_from_hf(hf._read_json(path, "HuggingFace config"), path, numerics)


def _hf_config_dict(config: BertConfig, architecture: str) -> dict:
    """HF's config.json for ``config``, naming the Keras class written."""
    return dict(hf.config_to_hf(config, [architecture]), architectures=[architecture])


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
    if "mlm___cls" in groups or "nsp___cls" in groups:
        return "pretraining"
    if "qa_outputs" in groups:
        return "qa"
    if "classifier" in groups:
        if not has_pooler:
            raise CheckpointError(f"{path}: a classifier without a pooler (a token classifier) is not supported")
        return "classifier"
    return "model"


def read(path: str, opts: Options) -> Source:
    h5 = _weights_path(path)
    f = hdf5.open_file(h5)
    with hdf5.malformed(h5):
        return _read(f, h5, opts)


def _read(f, h5: str, opts: Options) -> Source:
    entries, unlisted = _scan(f, h5)
    mapped = [(g, w, ds) for g, w, ds in entries if TABLE.to_canonical(w.partition("/")[2])]
    if not mapped:
        raise CheckpointError(f"{h5}: not a HF BERT Keras h5 (no bert/embeddings/word_embeddings or other BERT weight)")
    scopes = sorted({w.partition("/")[0] for _, w, _ in entries})
    if len(scopes) != 1:
        raise CheckpointError(f"{h5}: weights from more than one model scope ({', '.join(scopes)})")
    scope = scopes[0]
    inner = {ds: w.partition("/")[2] for _, w, ds in entries}
    has_pooler = any(inner[ds] == POOLER[0][0] for _, _, ds in entries)
    layout = LAYOUTS[_layout_for(h5, scope, {g for g, _, _ in entries}, has_pooler)]

    cfg_path = opts.config or os.path.join(os.path.dirname(h5) or ".", CONFIG_FILE)
    config = _hf_config(cfg_path, opts.numerics)
    vocab = opts.vocab or os.path.join(os.path.dirname(h5) or ".", VOCAB_FILE)
    if opts.vocab and not os.path.isfile(vocab):
        raise CheckpointError(f"{vocab}: vocab file not found")
    vocab = vocab if os.path.isfile(vocab) else None

    report, model, unknown = [], [], []
    home = {}  # canonical -> dataset, for the tied copies
    for group, w, ds in entries:
        name = inner[ds]
        hit = TABLE.to_canonical(name)
        if hit is None:
            unknown.append(ds)
            report.append(ReportLine(ds, "dropped", note="not a BERT weight (--skip-unknown)"))
            continue
        target, transform = hit
        if group != "bert" and name.startswith("bert/"):  # MLM head's reference to the embeddings
            continue
        if target in home:
            raise CheckpointError(f"{h5}: datasets {home[target]} and {ds} both hold {target}")
        home[target] = ds
        report.append(ReportLine(ds, "mapped", target, "transposed" if transform else ""))
        model.append((ds, target, transform))
    for group, w, ds in entries:  # tied copies: must equal the bert group's
        name = inner[ds]
        if group == "bert" or not name.startswith("bert/") or TABLE.to_canonical(name) is None:
            continue
        target = TABLE.to_canonical(name)[0]
        if target not in home:
            raise CheckpointError(f"{h5}: dataset {ds} has no counterpart in the bert group")
        if not _same(f, h5, home[target], ds):
            raise CheckpointError(f"{h5}: dataset {ds} differs from {home[target]} "
                                  f"(the MLM head's tied embeddings must equal the model's)")
        report.append(ReportLine(ds, "dropped", note=f"tied to {home[target]} (equal), dropped"))
    for ds in unlisted:
        unknown.append(ds)
        report.append(ReportLine(ds, "dropped", note="not listed in any weight_names (Keras ignores it)"))
    if unknown and not opts.skip_unknown:
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        raise CheckpointError(f"{h5}: unknown dataset {unknown[0]}{more} (not BERT; --skip-unknown drops them)")

    specs = {}
    for ds, target, transform in model:
        d = hdf5.plain_dataset(f, h5, ds)
        if transform == "T" and len(d.shape) != 2:
            raise CheckpointError(f"{h5}: dataset {ds} has shape {list(d.shape)}; a kernel is 2-D")
        specs[target] = (ds, d.dtype, apply_shape(transform, d.shape), transform)
    if "classifier.weight" in specs and specs["classifier.weight"][2][:1]:  # the label count is the tensor's
        config.num_labels = specs["classifier.weight"][2][0]
    added = []
    if not layout.pooler and not any(n in specs for n in _POOLER_NAMES):
        H = config.hidden_size
        dt = specs["bert.embeddings.word_embeddings.weight"][1] if "bert.embeddings.word_embeddings.weight" in specs \
            else np.dtype(np.float32)
        added = [(n, dt, shape) for n, shape in zip(_POOLER_NAMES, ((H, H), (H,)))]
        note = (f"no pooler in the source ({layout.cls} has none): bert.pooler filled with zeros, "
                f"which this head does not read")
        for r in report:  # said on the head's lines, so the counts stay those of the file
            if r.action == "mapped" and not r.target.startswith("bert."):
                r.note = f"{r.note}; {note}" if r.note else note
    shapes = {t: s[2] for t, s in specs.items()}
    shapes.update({n: shape for n, _, shape in added})
    _check(shapes, config, {t: s[0] for t, s in specs.items()}, scope, h5)

    def producer(ds, transform):
        return lambda: apply(transform, hdf5.read_dataset(f, h5, ds))

    tensors = []
    for target, (ds, dtype, shape, transform) in specs.items():
        tensors.append(cast_spec(TensorSpec(target, np.dtype(dtype), shape), producer(ds, transform), opts.dtype))
    for n, dt, shape in added:
        tensors.append(cast_spec(TensorSpec(n, np.dtype(dt), shape),
                                 lambda dt=dt, shape=shape: np.zeros(shape, dt), opts.dtype))
    return Source(h5, NAME, config, vocab, tensors, [], {}, report)


def _check(shapes, config, back, scope, where):
    """check_against_config, with messages in the file's names and [in, out] shapes."""
    def src(name):
        if name in back:
            return back[name]
        hit = TABLE.from_canonical(name)
        if hit is None:
            return name
        return f"{hit[0].partition('/')[0]}/{scope}/{hit[0]}"  # where it would be: group/scope/name

    try:
        check_against_config(shapes, config, src, where)
    except CheckpointError as err:
        msg = str(err)
        want = expected_shapes(config)
        for name, shape in shapes.items():
            if f"tensor {src(name)} has shape" in msg and name in want:
                inv = inverse(TABLE.from_canonical(name)[1])
                msg = (f"{where}: dataset {src(name)} has shape {list(apply_shape(inv, shape))} but the config "
                       f"implies {list(apply_shape(inv, want[name]))} (config does not fit the tensors)")
                break
        raise CheckpointError(msg.replace(": tensor ", ": dataset ", 1)) from None


# --------------------------------------------------------------------------- writing


def _layout_of(names: set, notes: list) -> Layout:
    """The transformers class a set of canonical tensors is: a fine-tuned head wins."""
    heads = {"pretraining": any(n.startswith("cls.") for n in names), "qa": "qa_outputs.weight" in names,
             "classifier": "classifier.weight" in names}
    for key in ("qa", "classifier"):
        if heads[key]:
            return LAYOUTS[key]
    if heads["pretraining"]:
        if {"cls.predictions.bias", "cls.seq_relationship.weight"} <= names:
            return LAYOUTS["pretraining"]
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


def write(source: Source, dst: str, opts: Options) -> list:
    """Write ``dst/`` as transformers' TF directory: tf_model.h5, config.json (+ vocab.txt)."""
    return write_with(write_files, source, dst, opts)


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
    layout = _layout_of(set(by_name), notes)
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
    label = hf.HF_ACT_LABEL[source.config.hidden_act]
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
