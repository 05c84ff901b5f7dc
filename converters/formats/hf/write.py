"""Writing a HuggingFace directory (``of2hf``): config.json, model.safetensors or its shards and
index (transformers' save_pretrained naming and split), vocab.txt and the tokenizer files."""

from __future__ import annotations

import json
import os

import numpy as np

from bert_of.checkpoint import copy_file, write_safetensors
from bert_of.tensors import TensorSpec
from bert_of.files.atomic import write_json, writes_to
from bert_of.errors import CheckpointError
from bert_of.tokenizer import hf_tokenizer_files
from bert_of.converters.source import Options, Source, lower_case_of
from bert_of.converters.reader import POOLER
from bert_of.converters.formats.hf.config import config_to_hf
from bert_of.converters.formats.hf.names import (ARCH, CLASSIFIER_KIND, CONFIG_FILE, SAFETENSORS, SAFETENSORS_INDEX, TABLE,
                                         VOCAB_FILE, head_kind)

ST_METADATA = {"format": "pt"}
# HF classes built without a pooler (add_pooling_layer=False).
_NO_POOLER = ("BertForQuestionAnswering", "BertForMaskedLM", "BertForTokenClassification", "BertLMHeadModel")


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
    kind = head_kind(by_name, source.config)
    cls_name = ARCH[kind][0]
    arch = source.config.extra.get("architectures")
    label = arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else cls_name
    if label in CLASSIFIER_KIND and cls_name in CLASSIFIER_KIND:  # the config's classifier_kind decides
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
