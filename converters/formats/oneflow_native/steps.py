"""The shared steps of the three flow.save formats (ofsd, ofmodels, libai): a name table in, a Source out.

Each format module declares a :class:`Layout`: how one of its state-dict keys maps to canonical
names (``classify``), and which keys, classes and tensors its own model's ``state_dict`` has for a
set of canonical tensors (``items``). Everything else is here, once:

- reading: the folder (:mod:`converters.containers.flow_save`, pickled_data parsed as data), its config
  (:mod:`converters.formats.oneflow_native.config`), its keys as :class:`~converters.reader.Entry`s classified
  into the one :class:`~converters.reader.Hit` (mapped; a fused QKV split into three; a tied copy
  or a buffer checked and dropped) and handed to the reader skeleton (``reader.sort``: the report,
  the unknown-tensor and duplicate errors; ``reader.finish``: the fit check, the producers, the
  ``Source``), as every other format;
- writing: flow.save's own files (pickled_data + ``tensor_N/``), a config the reader (and the
  source codebase's user) reads back, ``vocab.txt``.

Names of a bare ``BertModel`` carry no ``bert.`` prefix in every one of these codebases; they are
read with it restored and written without it when the source has no head.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from bert_of.checkpoint import copy_file
from bert_of.errors import CheckpointError
from bert_of.files.atomic import writes_to
from bert_of.converters.containers import flow_save
from bert_of.converters.source import Options, Source
from bert_of.converters.mapping import apply, inverse
from bert_of.converters.formats.oneflow_native.config import load_config
from bert_of.converters.reader import Entry, finish, pooler_zeros, sort, whole

VOCAB_FILE = "vocab.txt"
CONFIG_FILE = "config.json"
PARAM, BUFFER = "oneflow.nn.Parameter", "oneflow.Tensor"
POOLER = ("bert.pooler.dense.weight", "bert.pooler.dense.bias")
# what these formats' writer creates: flow.save's pickled_data and tensor_N/{out,meta}, our config and vocabulary
OWNS = (flow_save.PICKLE_FILE, flow_save.DATA_FILE, flow_save.META_FILE, CONFIG_FILE, VOCAB_FILE)
DTYPES = ("float32", "float16")  # flow.save's meta (the lazy record) has no bfloat16 code here


@dataclass
class Layout:
    name: str
    roots: tuple  # first name parts of a bare BertModel's keys
    classify: Callable  # (key with "bert." restored, config) -> Hit | None
    items: Callable  # (canonical names, config, bare) -> [(key, cls, ("canonical", name, transform) |
    #                   ("fused", names, join) | ("tied", key) | ("buffer", array fn))]
    write_config: Callable  # (config) -> dict written as config.json
    description: str
    no_pooler: Callable = lambda config: False  # the config builds the model without a pooler
    write_notes: Callable = lambda source: []  # (Source) -> what writing it in this layout changes
    table: object = None  # its name table, where it has one (the fit check's messages name its tensors)


def _bare(keys, roots) -> bool:
    return bool(keys) and not any(k.startswith("bert.") for k in keys) and \
        any(k.split(".", 1)[0] in roots for k in keys)


def read(path: str, opts: Options, layout: Layout) -> Source:
    path = os.fspath(path)  # a PathLike from a Python caller
    return whole(path, lambda pin: _read(pin, path, opts, layout))


def _read(pin, path: str, opts: Options, layout: Layout) -> Source:
    """The folder's files through ``pin`` (bert_of.files.pinned.PinnedDir): one checkpoint, whatever replaces
    ``path`` meanwhile; the entries' folders read that tree."""
    entries = flow_save.read_dir(path, pin.real(path))
    if not entries:
        raise CheckpointError(f"{path}: an empty flow.save state dict")
    config, cfg_path = load_config(path, opts.config, layout.name, pin.real)
    keys = [e.key for e in entries]
    bare = _bare(keys, layout.roots)
    full = {e.key: ("bert." + e.key if bare and e.key.split(".", 1)[0] in layout.roots else e.key) for e in entries}
    where = os.path.join(path, flow_save.PICKLE_FILE) \
        if os.path.isfile(pin.real(os.path.join(path, flow_save.PICKLE_FILE))) else path
    held = {}  # folder -> its data file held open: the kept tensors are read later, from this tree
    listed = [Entry(e.key, tuple(e.shape), e.dtype, (lambda e=e: flow_save.read_tensor(e, held.get(e.folder))),
                    origin=e.folder) for e in entries]
    found = sort(listed, lambda x: layout.classify(full[x.name], config), opts, where)
    for e in [e for e, _ in found.model] + [t for twins in found.ties.values() for t in twins]:
        if e.origin not in held:
            held[e.origin] = pin.hold(os.path.join(e.origin, flow_save.DATA_FILE), spare=True)
    fill = ()
    kept = {c for _, h in found.model for c in h.targets}
    if POOLER[0] not in kept and POOLER[1] not in kept and layout.no_pooler(config):
        # like HF's QA model: zeros the heads never read, left out again on write
        fill = pooler_zeros(config, found.model[0][0].dtype if found.model else np.dtype("<f4"))
        for r in found.report:
            if r.target == "bert.embeddings.word_embeddings.weight":
                r.note = "no pooler in the source (add_pooling_layer false): bert.pooler filled with zeros"
    vocab = opts.vocab or _beside(path, VOCAB_FILE, cfg_path, pin.real)
    if opts.vocab and not os.path.isfile(pin.real(opts.vocab)):
        raise CheckpointError(f"{opts.vocab}: vocab file not found")
    vocab = vocab and pin.hold(vocab)
    return finish(where, layout.name, config, vocab, found, opts, layout.table, fill)


def _beside(path, name, cfg_path, real):
    for d in (path, os.path.dirname(os.path.abspath(path)), os.path.dirname(cfg_path or "")):
        if d and os.path.isfile(real(os.path.join(d, name))):
            return os.path.join(d, name)
    return None


# --------------------------------------------------------------------------- write


def write_files(source: Source, d: str, opts: Options, layout: Layout) -> list:
    """pickled_data + tensor_N/ (flow.save's files), config.json, vocab.txt into ``d``."""
    by_name = {s.name: (s, p) for s, p in source.tensors}
    bare = not any(not n.startswith("bert.") for n in by_name)
    rows = layout.items(list(by_name), source.config, bare)
    covered = set()
    items = []
    for key, cls, what in rows:
        if what[0] == "canonical":
            _, name, transform = what
            covered.add(name)
            prod = by_name[name][1]
            items.append((key, cls, (lambda p=prod, t=transform: apply(inverse(t), p()))))
        elif what[0] == "fused":
            _, names, join = what
            covered.update(names)
            prods = [by_name[n][1] for n in names]
            items.append((key, cls, (lambda ps=prods, j=join: j([p() for p in ps]))))
        elif what[0] == "skip":  # a tensor the target model does not have (checked by the layout)
            covered.add(what[1])
            continue
        elif what[0] == "tied":
            items.append((key, cls, ("tied", what[1])))
        else:
            items.append((key, cls, what[1]))
    left = [n for n in by_name if n not in covered]
    if left:
        raise CheckpointError(f"{source.path}: tensor {left[0]} has no place in a {layout.description}")
    flow_save.write_state_dict(d, items)
    cfg = os.path.join(d, CONFIG_FILE)
    with writes_to(cfg), open(cfg, "w") as f:
        f.write(json.dumps(layout.write_config(source.config), indent=2, sort_keys=True) + "\n")
    if source.vocab_file:
        copy_file(source.vocab_file, os.path.join(d, VOCAB_FILE))
    return []


def arange_check(config):
    """The position_ids buffer: int64 [1, P] = 0..P-1."""
    def check(arr):
        P = config.max_position_embeddings
        if arr.dtype.kind not in "iu" or arr.shape != (1, P) or not np.array_equal(arr.reshape(-1), np.arange(P)):
            return f"is not 0..{P - 1} as int64 [1, {P}] (the models repo's position ids)"
        return None
    return check


def arange_buffer(config):
    return lambda: np.arange(config.max_position_embeddings, dtype=np.int64).reshape(1, -1)


# --------------------------------------------------------------------------- detection

_STATE_DICT_ROOTS = ("bert.", "embeddings.", "encoder.", "encoders.", "pooler.", "cls.", "cls_head.", "cls_squad.",
                     "qa_outputs.", "classifier.", "final_layernorm.", "output_bias")


def format_functions(layout: Layout) -> tuple:
    """``detect``, ``read`` and ``write_files`` of the format whose files hold ``layout``'s state dict
    (what a format module exposes: converters/source.py); ``write_files`` adds ``layout.write_notes``."""
    read_layout, write_layout = read, write_files

    def detect_format(path: str) -> bool:
        return kind(path) == layout.name

    def read_format(path: str, opts: Options) -> Source:
        return read_layout(path, opts, layout)

    def write_format(source: Source, d: str, opts: Options) -> list:
        return write_layout(source, d, opts, layout) + layout.write_notes(source)

    return detect_format, read_format, write_format


def kind(path: str) -> Optional[str]:
    """Which of the flow.save formats ``path`` is: "libai", "ofmodels", "ofsd" or None.

    By its keys: LiBai's (``encoders.``, ``vocab_embeddings``, ``cls_head.``), the models repo's
    (its ``position_ids`` buffer, ``output_bias``, ``cls_squad``, ``tokentype_embeddings``), else
    bert_of's own. A ``pickled_data`` that is not admitted is ofsd's to refuse (with the reason);
    the older layout (no pickled_data) must have state-dict names, so a lazy snapshot is not one.
    """
    if not flow_save.is_flow_save_dir(path):
        return None
    has_pickle = os.path.lexists(os.path.join(path, flow_save.PICKLE_FILE))
    keys = flow_save.keys_of(path)
    if keys is None:
        return "ofsd"
    if not has_pickle:
        keys = [k for k in keys if "." in k and k.startswith(_STATE_DICT_ROOTS) or k == "output_bias"]
        if not keys:
            return None
    if any(".encoders." in "." + k or "vocab_embeddings" in k or k.startswith("cls_head.") or
           k.startswith("final_layernorm.") or ".final_layernorm." in k for k in keys):
        return "libai"
    if any(k.endswith("position_ids") or k.endswith("output_bias") or k.startswith("cls_squad.") or
           "tokentype_embeddings" in k or k.endswith("decoder.weight") for k in keys):
        return "ofmodels"
    return "ofsd"
