"""Google's TF1 BERT checkpoints (google-research/bert) <-> canonical names.

Reads and writes the TensorBundle files directly (converters.tf1_bundle, tf1_bundle_writer), so
neither direction imports TensorFlow. Kernels are [in, out] in TF and
[out, in] canonically; ``output_weights`` of the NSP/SQuAD/classifier heads
are already [out, in] (Google multiplies with transpose_b).

Optimizer state: Google's AdamWeightDecayOptimizer keeps ``<var>/adam_m`` and
``<var>/adam_v`` (no bias correction, eps 1e-6, decoupled weight decay 0.01
except LayerNorm/bias) and an int64 ``global_step``.
"""

from __future__ import annotations

import math
import os

import numpy as np

from bert_of.config import BertConfig
from bert_of.errors import CheckpointError
from bert_of.converters.containers import tf1_bundle, tf1_bundle_writer
from bert_of.converters.source import Options, Source, write_google_sidecars
from bert_of.converters.mapping import Table, apply, inverse, spell
from bert_of.converters.reader import Entry, Hit, finish, hit, sort, whole
from bert_of.converters.descriptor import TF_CHECKPOINT, Format
from bert_of.converters.verify import reference_np

NAME = "tf"
CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
PREFIX_NAME = "bert_model.ckpt"


def _scope(canonical: str) -> str:
    return canonical.replace("layer.{i}", "layer_{i}").replace(".", "/")


# How TF1 spells each kind of scope; its output layers hold [out, in] "output_weights".
PARAMS = {
    "embedding": [("", ".weight")],
    "dense": [("/kernel", ".weight", "T"), ("/bias", ".bias")],
    "ln": [("/LayerNorm/gamma", ".LayerNorm.weight"), ("/LayerNorm/beta", ".LayerNorm.bias")],
    "bias": [("/output_bias", ".bias")],
    "out": [("/output_weights", ".weight"), ("/output_bias", ".bias")],
}
TABLE = Table(spell(_scope, PARAMS, {
    "cls.seq_relationship": ("cls/seq_relationship", "out"),
    "qa_outputs": ("cls/squad", "out"),  # run_squad.py
    "classifier": ("", "out"),  # run_classifier.py: output_weights, output_bias at the root
}))

# TF slot suffix -> bert_of optimizer-state prefix.
SLOTS = {"adam_m": "m", "adam_v": "v"}
STEP = "global_step"
OPTIMIZER_META = {"optimizer": "adamw", "bias_correction": "false", "eps": "1e-06",
                  "weight_decay": "0.01", "exclude_from_weight_decay": "LayerNorm,layer_norm,bias",
                  "source": "google-research/bert AdamWeightDecayOptimizer"}


def detect(path: str) -> bool:
    try:
        tf1_bundle.resolve_prefix(path)
        return True
    except CheckpointError:
        return False


def _side_file(prefix: str, override, name: str, what: str, pin) -> str:
    path = override or os.path.join(os.path.dirname(prefix) or ".", name)
    if not os.path.isfile(pin.real(path)):
        flag = "--config" if what == "config" else "--vocab"
        raise CheckpointError(f"{path}: {what} file not found (pass {flag})")
    return path


def _classify(name: str):
    """TF name -> Hit (a weight, Adam slot or the step) or None."""
    found = hit(TABLE, name)
    if found:
        return found
    base, _, slot = name.rpartition("/")
    if slot in SLOTS:
        found = hit(TABLE, base, optimizer=True)
        if found:
            found.target = f"{SLOTS[slot]}/{found.target}"
            return found
    if name == STEP:
        return Hit("step", optimizer=True)
    return None


def read(path: str, opts: Options, require_vocab: bool = True) -> Source:
    """The checkpoint as canonical tensors. ``require_vocab=False`` (verify: TF's side needs no
    vocabulary) reads a checkpoint without ``vocab.txt`` too."""
    path = os.fspath(path)  # a PathLike from a Python caller
    return whole(path, lambda pin: _read(pin, path, opts, require_vocab))


def _read(pin, path: str, opts: Options, require_vocab: bool) -> Source:
    """Index, data shards (held open for the producers), config and vocab from ``pin``'s tree."""
    real = tf1_bundle.resolve_prefix(pin.real(path))
    prefix = pin.shown(real)
    entries = tf1_bundle.read_index(real)
    if not any(TABLE.to_canonical(n) for n in entries):
        raise CheckpointError(f"{prefix}: not a BERT checkpoint (no bert/embeddings/word_embeddings or other BERT variable)")
    cfg_path = _side_file(prefix, opts.config, CONFIG_FILE, "config", pin)
    held_cfg = pin.hold(cfg_path)
    with open(held_cfg, "rb") as f:
        config = BertConfig.from_google_json_file(cfg_path, raw=f.read())
    vocab = None
    if require_vocab or opts.vocab or os.path.isfile(pin.real(os.path.join(os.path.dirname(prefix) or ".", VOCAB_FILE))):
        vocab = pin.hold(_side_file(prefix, opts.vocab, VOCAB_FILE, "vocab", pin))
    shards = {}  # shard -> the path that reads it (opened now: the data of this index)
    for e in entries.values():
        if not e.slices and e.shard not in shards:
            shards[e.shard] = pin.hold(tf1_bundle.data_path(real, e.shard, e.num_shards))
    found = sort([_entry(real, e, shards) for e in entries.values()], lambda e: _classify(e.name), opts, prefix,
                 "variable", TABLE)
    return finish(prefix, NAME, config, vocab, found, opts, TABLE, optimizer_meta=OPTIMIZER_META, config_file=held_cfg)


def _entry(prefix, e, shards) -> Entry:
    problem = ""
    if e.slices:  # strings, resources, unknown enums, partitions: not numbers we can read
        problem = f"is a partitioned variable ({e.slices} slices); slice assembly is not supported"
    elif not isinstance(e.dtype, np.dtype):
        problem = f"has dtype {e.dtype}, not a numeric type"
    return Entry(e.name, e.shape, e.dtype, lambda: tf1_bundle.read_tensor(prefix, e, data=shards.get(e.shard)), problem)


def write_files(source: Source, d: str, opts: Options) -> list:
    """Google's release files into the (staging) directory ``d``."""
    notes = []
    reason = source.config.google_mismatch()
    if reason:
        notes.append(f"note: Google's modeling.py would compute differently: {reason}; "
                     f"bert_config.json records the exact numerics (bert_of_hidden_act / layer_norm_eps)")

    items = []
    for spec, prod in source.tensors:
        hit = TABLE.from_canonical(spec.name)
        if hit is None:
            raise CheckpointError(f"{source.path}: tensor {spec.name} has no TF1 name")
        items.append((hit[0], _inverse_producer(prod, hit[1])))
    if opts.with_optimizer:
        for spec, prod in source.optimizer:
            if spec.name == "step":
                items.append((STEP, lambda p=prod: np.asarray(p(), dtype=np.int64).reshape(())))
                continue
            slot, _, canonical = spec.name.partition("/")
            hit = TABLE.from_canonical(canonical)
            suffix = {v: k for k, v in SLOTS.items()}.get(slot)
            if hit is None or suffix is None:
                raise CheckpointError(f"{source.path}: optimizer tensor {spec.name} has no TF1 name")
            items.append((f"{hit[0]}/{suffix}", _inverse_producer(prod, hit[1])))
        if source.optimizer_meta.get("bias_correction", "false") != "false":
            notes.append("note: the optimizer state was kept with bias correction; Google's optimizer has none")

    tf1_bundle_writer.write_bundle(os.path.join(d, PREFIX_NAME), ((n, p()) for n, p in items))
    write_google_sidecars(source, d)
    return notes


def _inverse_producer(prod, transform):
    inv = inverse(transform)
    return lambda: apply(inv, prod())


def _read_reference_side(path: str, opts: Options) -> Source:
    """verify's TF side: no vocabulary needed; variables that are not BERT's TF ignores too."""
    return read(path, Options(config=opts.config, vocab=opts.vocab, skip_unknown=True), require_vocab=False)


def inspect(path: str, config=None) -> dict:
    """``bert-of inspect``: the index's variables as stored (name, shape, dtype, kind) and the config
    when there is one; no vocabulary or config needed."""
    info = {"tensors": []}
    prefix = tf1_bundle.resolve_prefix(path)
    entries = tf1_bundle.read_index(prefix)
    for name, e in entries.items():
        found = _classify(name)
        kind = "unknown" if found is None else found.target if found.target == "step" else \
            "optimizer" if found.optimizer else "model"
        info["tensors"].append({"name": name, "shape": list(e.shape), "dtype": str(e.dtype), "kind": kind})
        if kind == "step" and math.prod(e.shape) == 1 and isinstance(e.dtype, np.dtype) and e.dtype.kind in "iu":
            info["step"] = int(tf1_bundle.read_tensor(prefix, e).reshape(()))  # its value, not its size
    cfg = config or os.path.join(os.path.dirname(prefix), CONFIG_FILE)
    if os.path.isfile(cfg):
        info["config"] = BertConfig.from_google_json_file(cfg).to_dict()
    info["path"] = prefix
    return info


FORMAT = Format(
    NAME, "Google TF1 checkpoint (bert_model.ckpt.* + bert_config.json + vocab.txt)", detect, read, write_files,
    reference_np.Google, owns=(CONFIG_FILE, VOCAB_FILE, "checkpoint"), owns_patterns=(r".+\.index", r".+\.data-\d+-of-\d+"),
    token_classifier=True,  # bert_config.json's bert_of key
    table=TABLE, ecosystem=TF_CHECKPOINT, read_reference_side=_read_reference_side, inspect=inspect,
    numerics_recorded="google-research/bert computes bert_config.json's \"gelu\" as the tanh GELU, LayerNorm "
                      "eps 1e-12 (and a bert_config.json bert_of wrote names its exact activation)")
