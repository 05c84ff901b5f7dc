"""bert_of's own checkpoint directory: the hub format (canonical names already)."""

from __future__ import annotations

import os

from bert_of.checkpoint import CONFIG_NAME, OPTIMIZER_NAME, VOCAB_NAME, WEIGHTS_NAME, SafetensorsFile, is_checkpoint_dir, load_checkpoint, write_checkpoint_files
from bert_of.tensors import expected_shapes
from bert_of.config import BertConfig
from bert_of.errors import MissingVocab
from bert_of.converters.source import Options, ReportLine, Source, cast_spec
from bert_of.converters.reader import whole
from bert_of.converters.descriptor import Format
from bert_of.converters.verify import reference_np

NAME = "of"


def detect(path: str) -> bool:
    """A directory with model.safetensors and a bert_of config.json (HF's has no "provenance")."""
    if not is_checkpoint_dir(path):
        return False
    import json

    try:
        with open(os.path.join(path, CONFIG_NAME)) as f:
            return "provenance" in json.load(f)
    except (OSError, ValueError, RecursionError):  # (an unparsable config.json: hf's detection takes it)
        return False


def _lazy(pin, path):
    """(specs with producers, metadata) of a safetensors file in ``pin``'s tree, read one tensor
    per call (from the file opened now)."""
    f = SafetensorsFile(path, open(pin.real(path), "rb"))
    items = [(f.spec(k), (lambda k=k: f.get(k))) for k in f.keys()]
    return items, dict(f.metadata)


def read(path: str, opts: Options) -> Source:
    if not is_checkpoint_dir(path):
        load_checkpoint(path)  # raises the precise reason
    path = os.fspath(path)  # a PathLike from a Python caller
    return whole(path, lambda pin: _read(pin, path, opts))


def _read(pin, path: str, opts: Options) -> Source:
    cfg = os.path.join(path, CONFIG_NAME)
    held_cfg = pin.hold(cfg)
    with open(held_cfg, "rb") as f:
        config = BertConfig.from_json_file(cfg, raw=f.read())
    vocab = opts.vocab or os.path.join(path, VOCAB_NAME)
    vocab = pin.hold(vocab) if os.path.isfile(pin.real(vocab)) else None
    model, _ = _lazy(pin, os.path.join(path, WEIGHTS_NAME))
    tensors = [cast_spec(s, p, opts.dtype) for s, p in model]
    report = [ReportLine(s.name, "mapped", s.name) for s, _ in model]
    optim, meta = [], {}
    if os.path.isfile(pin.real(os.path.join(path, OPTIMIZER_NAME))):
        items, meta = _lazy(pin, os.path.join(path, OPTIMIZER_NAME))
        for s, p in items:
            if opts.with_optimizer:
                optim.append((s, p))
                report.append(ReportLine(s.name, "optimizer", s.name))
            else:
                report.append(ReportLine(s.name, "dropped", note="optimizer state; convert it with --with-optimizer"))
    return Source(path, NAME, config, vocab, tensors, optim, meta, report,
                  {s.name: p for s, p in model}, held_cfg)


def write_files(source: Source, d: str, opts: Options) -> list:
    """config.json, model.safetensors (+ optimizer.safetensors), vocab.txt into the directory ``d``."""
    if source.vocab_file is None:
        raise MissingVocab(source.path)
    optimizer = None
    if opts.with_optimizer and source.optimizer:
        optimizer = (list(source.optimizer), source.optimizer_meta)
    # Model order (embeddings, layers, pooler, heads) whatever the source's order.
    order = {name: i for i, name in enumerate(expected_shapes(source.config))}
    tensors = sorted(source.tensors, key=lambda sp: (order.get(sp[0].name, len(order)), sp[0].name))
    write_checkpoint_files(d, tensors, source.config, source.vocab_file, optimizer=optimizer,
                           metadata={"format": "bert_of", "converted_from": source.format})
    return []


FORMAT = Format(
    NAME, "bert_of checkpoint directory (config.json + model.safetensors + vocab.txt)", detect, read, write_files,
    reference_np.BertOf, owns=(CONFIG_NAME, WEIGHTS_NAME, OPTIMIZER_NAME, VOCAB_NAME),
    pre_ln=True, records_numerics=True, token_classifier=True)  # the canonical format: its config is bert_of's
