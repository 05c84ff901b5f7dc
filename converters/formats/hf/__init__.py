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
memory-safe reader of ``converters.containers.torch_zip`` turns it into checked tensor
descriptions (torch is never imported, nothing is executed, no view can reach
outside its storage). Legacy (pre-1.6, non-zip) torch pickles are refused.

The names: converters/formats/hf/names.py; config.json <-> BertConfig: converters/formats/hf/config.py;
the weight files and shard indexes: converters/formats/hf/weights.py; writing: converters/formats/hf/write.py.
"""

from __future__ import annotations

import json
import os

import numpy as np

from bert_of.errors import CheckpointError
from bert_of.converters.source import Options, ReportLine, Source
from bert_of.converters.reader import (CLASSIFIER, POOLER, WORD_EMB, Entry, Hit, finish, hit, pooler_zeros,
                                       sort, whole)
from bert_of.converters.descriptor import TRANSFORMERS, Format
from bert_of.converters.verify import reference_np
from bert_of.vocab import TOKENIZER_JSON, vocab_from_tokenizer_json
from bert_of.converters.formats.hf.config import config_from_hf, read_hf_json
from bert_of.converters.formats.hf.names import (ARCH, BARE_ROOTS, CLASSIFIER_KIND, CONFIG_FILE, DECODER_B, DECODER_W,
                                         MLM_BIAS, NAME, POSITION_IDS, SAFETENSORS, SAFETENSORS_INDEX, TABLE,
                                         TOKEN_TYPE_IDS, VOCAB_FILE, WEIGHT_FILES, head_kind)
from bert_of.converters.formats.hf.weights import Weights
from bert_of.converters.formats.hf.write import write_files

# HF classes whose classifier.* bert_of computes as neither of those.
_OTHER_CLASSIFIERS = ("BertForMultipleChoice",)


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
    except OSError:
        return False
    except (ValueError, RecursionError):  # HF weights beside a config.json that does not parse (a
        return True  # 5000-digit integer, 100k-deep nesting): the reader says what in one line
    return isinstance(d, dict) and "provenance" not in d



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
    raw_cfg = read_hf_json(held_cfg, "HuggingFace config")
    if "provenance" in raw_cfg:
        raise CheckpointError(f"{cfg_path}: this is a bert_of config.json (has \"provenance\"); "
                              f"read the directory as format of")
    vocab = None
    if opts.vocab:
        vocab = pin.hold(_side_path(path, opts.vocab, VOCAB_FILE, "vocab", pin))
    elif os.path.isfile(pin.real(os.path.join(path, VOCAB_FILE))):
        vocab = pin.hold(os.path.join(path, VOCAB_FILE))
    elif os.path.isfile(pin.real(os.path.join(path, TOKENIZER_JSON))):  # a fast tokenizer's only file
        vocab = vocab_from_tokenizer_json(pin.real(os.path.join(path, TOKENIZER_JSON)))[0]  # read now, whole
    config = config_from_hf(raw_cfg, cfg_path, opts.numerics)
    weights = Weights(path, pin)
    names = weights.names()
    where = weights.file

    bare = bool(names) and not any(n.startswith(("bert.", "cls.")) for n in names)

    def full(n):  # HF name -> canonical-side HF name (prefix restored for bare BertModel files)
        return "bert." + n if bare and n.startswith(BARE_ROOTS) else n

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
    if CLASSIFIER in kept and arch0 in CLASSIFIER_KIND:  # the same tensors: the class says what they compute
        config.classifier_kind = CLASSIFIER_KIND[arch0]
    kind = head_kind(kept, config)
    if arch == [ARCH[kind][0]]:
        del config.extra["architectures"]  # recomputed on write
    head_note = ""
    if arch0 in _OTHER_CLASSIFIERS and "classifier.weight" in kept:
        head_note = f"HF {arch0}: bert_of's classifier head computes sequence classification on the pooled output"
    fill = []
    if not any(p in kept for p in POOLER):
        head_note = head_note or (f"no pooler in the source ({arch0 or ARCH[kind][0]} has none): "
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
    config = config_from_hf(read_hf_json(pin.real(cfg_path), "HuggingFace config"), cfg_path)
    weights = Weights(path, pin)
    names = weights.names()
    bare = bool(names) and not any(n.startswith(("bert.", "cls.")) for n in names)
    out = []
    for n in names:
        full = "bert." + n if bare and n.startswith(BARE_ROOTS) else n
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
        if isinstance(arch, list) and arch and arch[0] in CLASSIFIER_KIND:
            config.classifier_kind = CLASSIFIER_KIND[arch[0]]
    return {"config": config.to_dict(), "tensors": out, "path": weights.file}



FORMAT = Format(NAME, "HuggingFace directory (config.json + model.safetensors)", detect, read, write_files,
                reference_np.HuggingFace, owns=(CONFIG_FILE, SAFETENSORS, SAFETENSORS_INDEX, VOCAB_FILE),
                owns_patterns=(r"model-\d{5}-of-\d{5}\.safetensors",), shards=True,
                token_classifier=True,  # config.json's architectures
                table=TABLE, ecosystem=TRANSFORMERS,
                # "gelu" is erf in transformers, but a Google model converted keeps the label it was
                # trained under (tanh): --numerics says which the weights were made for
                numerics_flag=("tf1", "lazy", "hf"))
