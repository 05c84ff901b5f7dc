"""HuggingFace BERT directories (transformers) <-> canonical names.

A HuggingFace directory is ``config.json`` (no ``"provenance"`` key: that one
is bert_of's) plus weights: ``model.safetensors`` (or a sharded
``model.safetensors.index.json``) or, failing that, ``pytorch_model.bin``
(or ``pytorch_model.bin.index.json``). ``vocab.txt`` is optional in HF dirs.

Names: HF's are the canonical ones (``bert.encoder.layer.0.attention.self.
query.weight``, Linear weights [out, in]); a bare ``BertModel`` saves them
without the ``bert.`` prefix (``embeddings.word_embeddings.weight``). Old
pytorch-pretrained-bert files say ``LayerNorm.gamma/beta``; both are read.

What transformers 4.57 writes, and so what ``write`` mimics (checked against
``save_pretrained`` and ``from_pretrained`` with no missing/unexpected keys):

- ``model.safetensors`` with metadata ``{"format": "pt"}`` (transformers
  refuses a file without it);
- tied tensors omitted: ``cls.predictions.decoder.weight`` (= word
  embeddings) and ``cls.predictions.decoder.bias`` (= ``cls.predictions.bias``)
  are not in safetensors files; ``pytorch_model.bin`` files keep both;
- no ``position_ids`` / ``token_type_ids`` buffers (non-persistent since 4.31;
  older files have ``bert.embeddings.position_ids``, an arange);
- ``BertModel`` with bare names; ``BertForPreTraining``/``...ForSequenceClassification``
  with the ``bert.`` prefix; ``BertForQuestionAnswering``, ``BertForMaskedLM`` and
  ``BertForTokenClassification`` have **no pooler**;
- ``classifier.*`` is the same pair of tensors in ``...ForSequenceClassification`` (on the pooled
  output) and ``...ForTokenClassification`` (on every position): ``architectures`` says which,
  read into ``BertConfig.classifier_kind`` and written back from it; ``id2label`` (string ids),
  ``label2id`` and ``problem_type`` travel in BertConfig's fields of the same names;
- ``config.json``: sorted keys, indent 2, ``model_type "bert"``, ``architectures``.

Reading: tied decoder tensors are checked equal to what bert_of ties them to
(else an error: bert_of cannot hold an untied decoder) and reported dropped;
buffers are checked (arange / zeros) and reported dropped; a missing pooler
(QA / MLM checkpoints) is filled with zeros, which the QA and MLM heads never
read, and written back out as HF's class has it: absent.

``pytorch_model.bin`` is a pickle. It is never unpickled as such: the restricted,
memory-safe reader of ``converters.torch_zip`` turns it into checked tensor
descriptions (torch is never imported, nothing is executed, no view can reach
outside its storage). Legacy (pre-1.6, non-zip) torch pickles are refused.

Numerics: HF's ``"gelu"`` is exact erf GELU, ``"gelu_new"``/``"gelu_pytorch_tanh"``
the tanh form (``bert_of.config.HF_ACT``); ``layer_norm_eps`` defaults to 1e-12.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np

from bert_of.checkpoint import SafetensorsFile, TensorSpec, copy_file, write_safetensors
from bert_of.config import HF_ACT, BertConfig, pop_task_fields
from bert_of.errors import CheckpointError, ConfigError
from bert_of.files.atomic import write_json, writes_to
from bert_of.files.reading import read_json
from bert_of.converters.source import Options, ReportLine, Source, lower_case_of
from bert_of.converters.mapping import Table, spell
from bert_of.converters.reader import (CLASSIFIER, POOLER, WORD_EMB, Entry, Hit, finish, hit, pooler_zeros,
                                       sort, whole)
from bert_of.converters.torch_zip import TorchZipFile
from bert_of.tokenizer import hf_tokenizer_files
from bert_of.converters.descriptor import Format
from bert_of.converters import reference_np

NAME = "hf"
CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.txt"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PT_BIN = "pytorch_model.bin"
PT_BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PT_BIN, PT_BIN_INDEX)
ST_METADATA = {"format": "pt"}

# bert_of activation -> the label HF's config.json uses for it.
HF_ACT_LABEL = {"gelu_erf": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "tanh": "tanh", "silu": "silu",
                "linear": "linear"}
# Other HF spellings of the same function are remembered here (in config.extra) for the round trip.
ACT_SPELLING_KEY = "bert_of_hf_hidden_act"

# HF config keys that are BertConfig fields (HF's BertConfig defaults equal bert_of's, except "gelu").
_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
           "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
           "initializer_range", "layer_norm_eps")

# --------------------------------------------------------------------------- names


# HF's names are the canonical ones: every scope spelled as it is, Linear weights [out, in].
PARAMS = {"embedding": [(".weight", ".weight")], "dense": [(".weight", ".weight"), (".bias", ".bias")],
          "ln": [(".LayerNorm.weight", ".LayerNorm.weight"), (".LayerNorm.bias", ".LayerNorm.bias")],
          "bias": [(".bias", ".bias")]}
# pytorch-pretrained-bert's LayerNorm spelling; read only (rows after the modern ones)
OLD_PARAMS = {"embedding": [], "dense": [], "bias": [],
              "ln": [(".LayerNorm.gamma", ".LayerNorm.weight"), (".LayerNorm.beta", ".LayerNorm.bias")]}
TABLE = Table(spell(str, PARAMS) + spell(str, OLD_PARAMS))

# Tensors HF files hold that bert_of does not: name -> what they are.
DECODER_W = "cls.predictions.decoder.weight"  # tied to the word embeddings
DECODER_B = "cls.predictions.decoder.bias"  # the same Parameter as cls.predictions.bias
POSITION_IDS = "bert.embeddings.position_ids"  # buffer: arange(max_position_embeddings)[None]
TOKEN_TYPE_IDS = "bert.embeddings.token_type_ids"  # buffer: zeros
MLM_BIAS = "cls.predictions.bias"
_BARE_ROOTS = ("embeddings.", "encoder.", "pooler.")

# HF classes bert_of computes, by the head tensors present (canonical prefixes); pooler or not.
_ARCH = {
    "pretraining": ("BertForPreTraining", True),
    "mlm": ("BertForMaskedLM", False),
    "nsp": ("BertForNextSentencePrediction", True),
    "qa": ("BertForQuestionAnswering", False),
    "classifier": ("BertForSequenceClassification", True),
    "token": ("BertForTokenClassification", False),  # classifier.* on every position (config.classifier_kind)
    "bare": ("BertModel", True),
}
# HF class -> bert_of's config.classifier_kind, for the classes whose classifier.* bert_of computes.
_CLASSIFIER_KIND = {"BertForSequenceClassification": "sequence", "BertForTokenClassification": "token"}
# HF classes built without a pooler (add_pooling_layer=False).
_NO_POOLER = ("BertForQuestionAnswering", "BertForMaskedLM", "BertForTokenClassification", "BertLMHeadModel")
# HF classes whose classifier.* bert_of computes as neither of those.
_OTHER_CLASSIFIERS = ("BertForMultipleChoice",)


def _head_kind(names, config: BertConfig | None = None) -> str:
    names = set(names)
    mlm = any(n.startswith("cls.predictions.") for n in names)
    nsp = any(n.startswith("cls.seq_relationship.") for n in names)
    if mlm and nsp:
        return "pretraining"
    if mlm:
        return "mlm"
    if nsp:
        return "nsp"
    if any(n.startswith("qa_outputs.") for n in names):
        return "qa"
    if any(n.startswith("classifier.") for n in names):
        return "token" if config is not None and config.classifier_kind == "token" else "classifier"
    return "bare"


# --------------------------------------------------------------------------- detect


def detect(path: str) -> bool:
    """A directory with HF weights and a config.json without bert_of's "provenance"."""
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        return False
    if not any(os.path.isfile(os.path.join(path, w)) for w in WEIGHT_FILES):
        return False
    try:
        with open(os.path.join(path, CONFIG_FILE), encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(d, dict) and "provenance" not in d


# --------------------------------------------------------------------------- config


def config_from_hf(d: dict, where: str, numerics=None) -> BertConfig:
    """HF config.json -> BertConfig; keys bert_of does not use are kept in ``extra``."""
    d = dict(d)
    model_type = d.pop("model_type", None) or "bert"  # absent or null: transformers' BertConfig does not ask
    if model_type != "bert":
        raise ConfigError(f"{where}: model_type {model_type!r} is not BERT")
    if d.get("position_embedding_type", "absolute") != "absolute":
        null = " (null: transformers then adds no position embeddings at all)" \
            if d["position_embedding_type"] is None else ""
        raise ConfigError(f"{where}: position_embedding_type {d['position_embedding_type']!r}{null}: bert_of "
                          f"computes absolute position embeddings only")
    if d.get("is_decoder"):
        raise ConfigError(f"{where}: is_decoder is true (causal attention); bert_of computes the BERT encoder only")
    label = d.pop("hidden_act", "gelu")
    if not isinstance(label, str) or label not in HF_ACT:
        raise ConfigError(f"{where}: hidden_act {label!r} is not one bert_of computes "
                          f"(known HF labels: {', '.join(HF_ACT)})")
    act = HF_ACT[label]
    remembered = d.pop(ACT_SPELLING_KEY, None)
    kw = {k: d.pop(k) for k in _FIELDS if k in d}
    if "layer_norm_eps" not in kw:
        kw["layer_norm_eps"] = 1e-12
    num_labels = 2
    if isinstance(d.get("id2label"), dict) and d["id2label"]:
        num_labels = len(d["id2label"])
    if isinstance(d.get("num_labels"), int):
        num_labels = d["num_labels"]
    kw.update(pop_task_fields(d))
    if numerics == "tf1":
        act, kw["layer_norm_eps"] = "gelu_tanh", 1e-12
    elif numerics == "lazy":
        act, kw["layer_norm_eps"] = "gelu_erf", 1e-5
    spelling = label if label != HF_ACT_LABEL.get(act) else remembered
    if spelling is not None and HF_ACT.get(spelling) == act and spelling != HF_ACT_LABEL.get(act):
        d[ACT_SPELLING_KEY] = spelling
    try:
        return BertConfig(hidden_act=act, num_labels=num_labels, provenance="hf", extra=d, **kw)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"{where}: {str(e).removeprefix('config: ')}") from None


# config.json keys that describe a classifier's labels
_LABEL_KEYS = ("num_labels", "id2label", "label2id", "problem_type")


def config_to_hf(config: BertConfig, architectures: list, float_dtype=None) -> dict:
    """BertConfig -> HF config.json dict (sorted on write, as transformers writes it).

    For a question-answering class the label fields describe its span head, whatever the config
    carried: transformers builds ``qa_outputs`` with ``num_labels`` outputs, and the head has 2
    (start, end)."""
    if architectures and str(architectures[0]).endswith("ForQuestionAnswering"):
        config = replace(config, num_labels=2, id2label=None, problem_type=None,
                         extra={k: v for k, v in config.extra.items() if k not in _LABEL_KEYS})
    d = {k: v for k, v in config.extra.items() if k != ACT_SPELLING_KEY}
    for k in _FIELDS:
        d[k] = getattr(config, k)
    label = HF_ACT_LABEL[config.hidden_act]
    spelling = config.extra.get(ACT_SPELLING_KEY)
    if isinstance(spelling, str) and HF_ACT.get(spelling) == config.hidden_act:
        label = spelling
    d["hidden_act"] = label
    d["model_type"] = "bert"
    d.setdefault("architectures", architectures)
    if config.id2label is not None:
        d["id2label"] = {str(i): v for i, v in sorted(config.id2label.items())}
        d.setdefault("label2id", config.label2id)
    if config.problem_type is not None:
        d["problem_type"] = config.problem_type
    if config.num_labels != 2 and "id2label" not in d and "num_labels" not in d:
        d["id2label"] = {str(i): f"LABEL_{i}" for i in range(config.num_labels)}
        d["label2id"] = {f"LABEL_{i}": i for i in range(config.num_labels)}
    if float_dtype is not None:
        for key in ("dtype", "torch_dtype"):  # keep what the file says true after a --dtype cast
            if key in d:
                d[key] = float_dtype
    return d


def _read_json(path: str, what: str) -> dict:
    return read_json(path, what, ConfigError)


# --------------------------------------------------------------------------- weights


class _Weights:
    """name -> (file object) over one file or an index of shards (every file opened now, in
    ``pin``'s tree: bert_of.files.pinned.PinnedDir)."""

    def __init__(self, path: str, pin):
        self.files, self.where, self.pin = {}, {}, pin
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
            if names is not None and names.get(k) != os.path.basename(fpath):
                continue
            if k in self.where:
                raise CheckpointError(f"{fpath}: tensor {k} also in {self.pin.shown(self.where[k].path)}")
            self.where[k] = f

    def _index(self, path, idx, cls):
        d = _read_json(self.pin.real(idx), "shard index")
        wm = d.get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise CheckpointError(f"{idx}: no weight_map")
        for fn in sorted(set(wm.values())):
            if not isinstance(fn, str) or os.path.basename(fn) != fn or fn in ("", ".", ".."):
                raise CheckpointError(f"{idx}: shard name {fn!r} is not a file in this directory")
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


# --------------------------------------------------------------------------- read


def _side_path(path, override, name, what, pin=None):
    p = override or os.path.join(path, name)
    if not os.path.isfile(pin.real(p) if pin else p):
        flag = "--config" if what == "config" else "--vocab"
        raise CheckpointError(f"{p}: {what} file not found (pass {flag})")
    return p


def read(path: str, opts: Options) -> Source:
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory (a HuggingFace checkpoint is a directory with "
                              f"config.json and model.safetensors)")
    path = os.fspath(path)  # a PathLike from a Python caller
    return whole(path, lambda pin: _read(pin, path, opts))


def _read(pin, path: str, opts: Options) -> Source:
    """Every file through ``pin`` (bert_of.files.pinned.PinnedDir): one checkpoint, whatever replaces ``path``."""
    cfg_path = _side_path(path, opts.config, CONFIG_FILE, "config", pin)
    held_cfg = pin.hold(cfg_path)
    raw_cfg = _read_json(held_cfg, "HuggingFace config")
    if "provenance" in raw_cfg:
        raise CheckpointError(f"{cfg_path}: this is a bert_of config.json (has \"provenance\"); "
                              f"read the directory as format of")
    vocab = None
    if opts.vocab:
        vocab = pin.hold(_side_path(path, opts.vocab, VOCAB_FILE, "vocab", pin))
    elif os.path.isfile(pin.real(os.path.join(path, VOCAB_FILE))):
        vocab = pin.hold(os.path.join(path, VOCAB_FILE))
    config = config_from_hf(raw_cfg, cfg_path, opts.numerics)
    weights = _Weights(path, pin)
    names = weights.names()
    where = weights.file

    bare = bool(names) and not any(n.startswith(("bert.", "cls.")) for n in names)

    def full(n):  # HF name -> canonical-side HF name (prefix restored for bare BertModel files)
        return "bert." + n if bare and n.startswith(_BARE_ROOTS) else n

    canon = {TABLE.to_canonical(full(n))[0] for n in names if TABLE.to_canonical(full(n))}
    twins = {}  # canonical -> [HF names of its tied copies], checked equal when it is read

    def classify(e):  # tied copies and buffers: accounted for, checked, dropped
        name = full(e.name)
        if name == DECODER_W:
            if WORD_EMB not in canon:
                raise CheckpointError(f"{where}: tensor {e.name} without bert.embeddings.word_embeddings.weight")
            twins.setdefault(WORD_EMB, []).append(e.name)
            return ReportLine(e.name, "dropped", note="tied to the word embeddings, equal (bert_of ties them)")
        if name == DECODER_B and MLM_BIAS in canon:
            twins.setdefault(MLM_BIAS, []).append(e.name)
            return ReportLine(e.name, "dropped", note="tied to cls.predictions.bias, equal")
        if name == DECODER_B:
            return Hit(MLM_BIAS, note="tied decoder bias = cls.predictions.bias")
        if name in (POSITION_IDS, TOKEN_TYPE_IDS):
            arange = name == POSITION_IDS
            _check_buffer(weights, e.name, where, "arange" if arange else "zeros")
            return ReportLine(e.name, "dropped", note="buffer: position ids 0..P-1 (bert_of computes them)"
                              if arange else "buffer: zero token type ids")
        return hit(TABLE, name)

    found = sort([Entry(n) for n in names], classify, opts, where, table=TABLE)
    for e, h in found.model:
        e.shape, e.dtype = weights.shape(e.name), weights.dtype(e.name)
        e.read = _producer(weights, e.name, twins.get(h.target, []), where)

    kept = {h.target for _, h in found.model}
    arch = config.extra.get("architectures")
    arch0 = arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else None
    if CLASSIFIER in kept and arch0 in _CLASSIFIER_KIND:  # the same tensors: the class says what they compute
        config.classifier_kind = _CLASSIFIER_KIND[arch0]
    kind = _head_kind(kept, config)
    if arch == [_ARCH[kind][0]]:
        del config.extra["architectures"]  # recomputed on write
    head_note = ""
    if arch0 in _OTHER_CLASSIFIERS and "classifier.weight" in kept:
        head_note = f"HF {arch0}: bert_of's classifier head computes sequence classification on the pooled output"
    fill = []
    if not any(p in kept for p in POOLER):
        head_note = head_note or (f"no pooler in the source ({arch0 or _ARCH[kind][0]} has none): "
                                  f"bert.pooler filled with zeros" + (", which this head does not read"
                                                                      if kind in ("qa", "mlm", "token") else ""))
        word = next((e for e, h in found.model if h.target == WORD_EMB), None)
        fill = pooler_zeros(config, word.dtype if word else np.float32)
    has_head = any(not c.startswith("bert.") for c in kept)
    for r in found.report:  # said on the head's lines (or the embeddings'), so counts stay the file's
        if head_note and r.action == "mapped" and (not r.target.startswith("bert.") if has_head
                                                   else r.target == WORD_EMB):
            r.note = head_note

    def shown(name):  # a tensor the file lacks, as this file would name it
        return name[len("bert."):] if bare and name.startswith("bert.") else name

    return finish(where, NAME, config, vocab, found, opts, TABLE, fill, shown=shown, config_file=held_cfg)


def _producer(weights, name, twins, where):
    """Read ``name``; first check every tied twin holds the same bytes (bert_of keeps one copy)."""

    def produce():
        arr = weights.get(name)
        for twin in twins:
            if weights.same_view(name, twin):
                continue
            other = weights.get(twin)
            if other.dtype != arr.dtype or other.shape != arr.shape or other.tobytes() != arr.tobytes():
                raise CheckpointError(f"{where}: tensor {twin} differs from {name}; bert_of ties them "
                                      f"(an untied MLM decoder cannot be converted)")
            del other
        return arr

    return produce


def _check_buffer(weights, name, where, kind):
    arr = weights.get(name)
    if arr.dtype.kind not in "iu":
        raise CheckpointError(f"{where}: buffer {name} has dtype {arr.dtype}, expected integers")
    flat = arr.reshape(-1)
    ok = (np.array_equal(flat, np.arange(flat.size)) if kind == "arange" else not flat.any()) and arr.ndim in (1, 2)
    if not ok:
        want = "0, 1, 2, ..." if kind == "arange" else "all zeros"
        raise CheckpointError(f"{where}: buffer {name} is not {want}; bert_of computes it that way")


def inspect(path: str) -> dict:
    """For ``bert-of inspect``: {"config": bert_of config dict, "tensors": [{name, shape, dtype, kind}]}.

    kind: "model" (mapped), "tied"/"buffer" (checked and dropped on conversion), "unknown".
    """
    path = os.fspath(path)  # a PathLike from a Python caller
    return whole(path, lambda pin: _inspect(pin, path))


def _inspect(pin, path: str) -> dict:
    cfg_path = _side_path(path, None, CONFIG_FILE, "config", pin)
    config = config_from_hf(_read_json(pin.real(cfg_path), "HuggingFace config"), cfg_path)
    weights = _Weights(path, pin)
    names = weights.names()
    bare = bool(names) and not any(n.startswith(("bert.", "cls.")) for n in names)
    out = []
    for n in names:
        full = "bert." + n if bare and n.startswith(_BARE_ROOTS) else n
        if TABLE.to_canonical(full):
            kind = "model"
        elif full in (DECODER_W, DECODER_B):
            kind = "tied"
        elif full in (POSITION_IDS, TOKEN_TYPE_IDS):
            kind = "buffer"
        else:
            kind = "unknown"
        out.append({"name": n, "shape": list(weights.shape(n)), "dtype": str(weights.dtype(n)), "kind": kind})
    if "classifier.weight" in names and weights.shape("classifier.weight")[:1]:
        config.num_labels = weights.shape("classifier.weight")[0]
        arch = config.extra.get("architectures")
        if isinstance(arch, list) and arch and arch[0] in _CLASSIFIER_KIND:
            config.classifier_kind = _CLASSIFIER_KIND[arch[0]]
    return {"config": config.to_dict(), "tensors": out, "path": weights.file}


# --------------------------------------------------------------------------- write


def write_files(source: Source, d: str, opts: Options) -> list:
    """config.json, model.safetensors (+ vocab.txt) into the (staging) directory ``d``.

    Layout: bare BertModel names when the source has no head, else the
    ``bert.`` prefix with the heads (BertForPreTraining, ...QuestionAnswering,
    ...SequenceClassification, ...MaskedLM). Tied decoder tensors and buffers are
    not written (transformers omits them); the pooler is not written for the
    classes that have none (QA, MLM).
    """
    notes = []
    by_name = {s.name: (s, p) for s, p in source.tensors}
    kind = _head_kind(by_name, source.config)
    cls_name = _ARCH[kind][0]
    arch = source.config.extra.get("architectures")
    label = arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else cls_name
    if label in _CLASSIFIER_KIND and cls_name in _CLASSIFIER_KIND:  # the config's classifier_kind decides
        label = cls_name
    has_pooler = label not in _NO_POOLER
    families = {f for f, prefix in (("cls", "cls."), ("qa", "qa_outputs."), ("classifier", "classifier."))
                if any(n.startswith(prefix) for n in by_name)}
    if len(families) > 1:
        notes.append(f"note: several task heads; config.json names {label}, transformers will report the "
                     f"others' tensors as unexpected")
    items = []
    for name, (spec, prod) in by_name.items():
        if name in POOLER and not has_pooler:
            continue
        hit = TABLE.from_canonical(name)
        if hit is None:
            raise CheckpointError(f"{source.path}: tensor {name} has no HuggingFace name")
        hf_name = hit[0][len("bert."):] if kind == "bare" and hit[0].startswith("bert.") else hit[0]
        items.append((TensorSpec(hf_name, spec.dtype, spec.shape), prod))
    if not has_pooler and any(p in by_name for p in POOLER):
        if any(np.any(by_name[p][1]()) for p in POOLER if p in by_name):
            notes.append(f"note: bert.pooler not written: transformers' {label} has no pooler "
                         f"(its outputs do not use it)")
    if opts.with_optimizer and source.optimizer:
        notes.append("note: optimizer state not written: a HuggingFace model directory does not hold it")
    if kind == "qa" and source.config.num_labels != 2:
        notes.append(f"note: num_labels {source.config.num_labels} written as 2: transformers' "
                     f"BertForQuestionAnswering reads num_labels as its span head's outputs (start, end)")
    items.sort(key=lambda it: it[0].name)
    floats = sorted({np.dtype(s.dtype).name for s, _ in items if np.dtype(s.dtype).kind == "f"
                     or np.dtype(s.dtype).name == "bfloat16"})
    cfg = config_to_hf(source.config, [cls_name], floats[0] if len(floats) == 1 else None)
    if label != cfg["architectures"][0] and label == cls_name:
        cfg["architectures"] = [cls_name]

    producers = {s.name: p for s, p in items}
    shards = shard([s for s, _ in items], opts.max_shard_size)
    if len(shards) == 1:
        write_safetensors(os.path.join(d, SAFETENSORS), shards[0], lambda s: producers[s.name](), ST_METADATA)
    else:  # transformers' save_pretrained naming and index
        weight_map = {}
        for i, specs in enumerate(shards):
            name = SHARD_NAME.format(i + 1, len(shards))
            write_safetensors(os.path.join(d, name), specs, lambda s: producers[s.name](), ST_METADATA)
            weight_map.update({s.name: name for s in specs})
        index = {"metadata": {"total_size": sum(s.nbytes for s, _ in items)}, "weight_map": weight_map}
        with writes_to(os.path.join(d, SAFETENSORS_INDEX)):
            write_json(os.path.join(d, SAFETENSORS_INDEX), index)
    cfg_path = os.path.join(d, CONFIG_FILE)
    with writes_to(cfg_path), open(cfg_path, "w", encoding="utf-8") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if source.vocab_file:
        copy_file(source.vocab_file, os.path.join(d, VOCAB_FILE))
        _write_tokenizer_files(source, d)
    return notes


SHARD_NAME = "model-{:05d}-of-{:05d}.safetensors"
def shard(specs: list, max_size) -> list:
    """The tensors in shards of at most ``max_size`` bytes, in order, as transformers' save_pretrained
    splits a state dict: a tensor that would overflow the current shard starts the next one; a
    tensor larger than ``max_size`` is a shard of its own. None: one shard."""
    if not max_size:
        return [list(specs)]
    out, size = [[]], 0
    for s in specs:
        if s.nbytes > max_size:
            out.append([s])
            out.append([])
            size = 0
            continue
        if out[-1] and size + s.nbytes > max_size:
            out.append([])
            size = 0
        out[-1].append(s)
        size += s.nbytes
    return [x for x in out if x]


def _write_tokenizer_files(source: Source, d: str) -> None:
    """tokenizer_config.json and special_tokens_map.json as transformers' BertTokenizer saves them
    (:func:`bert_of.tokenizer.hf_tokenizer_files`), lower-casing as the checkpoint's own tokenizer does."""
    files = hf_tokenizer_files(source.vocab_file, lower_case_of(source), source.config.max_position_embeddings)
    for name, obj in files.items():
        with writes_to(os.path.join(d, name)):
            write_json(os.path.join(d, name), obj)


FORMAT = Format(NAME, "HuggingFace directory (config.json + model.safetensors)", detect, read, write_files,
                reference_np.HuggingFace, owns=(CONFIG_FILE, SAFETENSORS, SAFETENSORS_INDEX, VOCAB_FILE),
                owns_patterns=(r"model-\d{5}-of-\d{5}\.safetensors",), shards=True,
                token_classifier=True,  # config.json's architectures
                table=TABLE, ecosystem="transformers")
