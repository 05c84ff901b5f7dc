"""Google's TF1 BERT checkpoints (google-research/bert) <-> canonical names.

Reads and writes the TensorBundle files directly (converters.tf1_bundle), so
neither direction imports TensorFlow. Kernels are [in, out] in TF and
[out, in] canonically; ``output_weights`` of the NSP/SQuAD/classifier heads
are already [out, in] (Google multiplies with transpose_b).

Optimizer state: Google's AdamWeightDecayOptimizer keeps ``<var>/adam_m`` and
``<var>/adam_v`` (no bias correction, eps 1e-6, decoupled weight decay 0.01
except LayerNorm/bias) and an int64 ``global_step``.
"""

from __future__ import annotations

import os

import numpy as np

from bert_of.checkpoint import TensorSpec, check_against_config
from bert_of.config import BertConfig
from bert_of.errors import CheckpointError
from bert_of.converters import tf1_bundle
from bert_of.converters.common import Options, ReportLine, Source, cast_spec, write_google_sidecars, write_with
from bert_of.converters.mapping import Table, apply, apply_shape, inverse

NAME = "tf"
CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
PREFIX_NAME = "bert_model.ckpt"


def _dense(tf, can):
    return [(f"{tf}/kernel", f"{can}.weight", "T"), (f"{tf}/bias", f"{can}.bias")]


def _ln(tf, can):
    return [(f"{tf}/LayerNorm/gamma", f"{can}.LayerNorm.weight"), (f"{tf}/LayerNorm/beta", f"{can}.LayerNorm.bias")]


_L, _C = "bert/encoder/layer_{i}", "bert.encoder.layer.{i}"
TABLE = Table([
    ("bert/embeddings/word_embeddings", "bert.embeddings.word_embeddings.weight"),
    ("bert/embeddings/token_type_embeddings", "bert.embeddings.token_type_embeddings.weight"),
    ("bert/embeddings/position_embeddings", "bert.embeddings.position_embeddings.weight"),
    *_ln("bert/embeddings", "bert.embeddings"),
    *_dense(f"{_L}/attention/self/query", f"{_C}.attention.self.query"),
    *_dense(f"{_L}/attention/self/key", f"{_C}.attention.self.key"),
    *_dense(f"{_L}/attention/self/value", f"{_C}.attention.self.value"),
    *_dense(f"{_L}/attention/output/dense", f"{_C}.attention.output.dense"),
    *_ln(f"{_L}/attention/output", f"{_C}.attention.output"),
    *_dense(f"{_L}/intermediate/dense", f"{_C}.intermediate.dense"),
    *_dense(f"{_L}/output/dense", f"{_C}.output.dense"),
    *_ln(f"{_L}/output", f"{_C}.output"),
    *_dense("bert/pooler/dense", "bert.pooler.dense"),
    *_dense("cls/predictions/transform/dense", "cls.predictions.transform.dense"),
    *_ln("cls/predictions/transform", "cls.predictions.transform"),
    ("cls/predictions/output_bias", "cls.predictions.bias"),
    ("cls/seq_relationship/output_weights", "cls.seq_relationship.weight"),
    ("cls/seq_relationship/output_bias", "cls.seq_relationship.bias"),
    ("cls/squad/output_weights", "qa_outputs.weight"),
    ("cls/squad/output_bias", "qa_outputs.bias"),
    ("output_weights", "classifier.weight"),
    ("output_bias", "classifier.bias"),
])

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


def _side_file(prefix: str, override, name: str, what: str) -> str:
    path = override or os.path.join(os.path.dirname(prefix) or ".", name)
    if not os.path.isfile(path):
        flag = "--config" if what == "config" else "--vocab"
        raise CheckpointError(f"{path}: {what} file not found (pass {flag})")
    return path


def _classify(name: str):
    """TF name -> (kind, canonical, transform); kind in model/optimizer/step/None."""
    hit = TABLE.to_canonical(name)
    if hit:
        return ("model",) + hit
    base, _, slot = name.rpartition("/")
    if slot in SLOTS:
        hit = TABLE.to_canonical(base)
        if hit:
            return "optimizer", f"{SLOTS[slot]}/{hit[0]}", hit[1]
    if name == STEP:
        return "step", "step", None
    return None, None, None


def read(path: str, opts: Options, require_vocab: bool = True) -> Source:
    """The checkpoint as canonical tensors. ``require_vocab=False`` (verify: TF's side needs no
    vocabulary) reads a checkpoint without ``vocab.txt`` too."""
    prefix = tf1_bundle.resolve_prefix(path)
    entries = tf1_bundle.read_index(prefix)
    if not any(TABLE.to_canonical(n) for n in entries):
        raise CheckpointError(f"{prefix}: not a BERT checkpoint (no bert/embeddings/word_embeddings or other BERT variable)")
    config = BertConfig.from_google_json_file(_side_file(prefix, opts.config, CONFIG_FILE, "config"))
    vocab = None
    if require_vocab or opts.vocab or os.path.isfile(os.path.join(os.path.dirname(prefix) or ".", VOCAB_FILE)):
        vocab = _side_file(prefix, opts.vocab, VOCAB_FILE, "vocab")

    report, model, optim, unknown = [], [], [], []
    for name, e in entries.items():
        kind, target, transform = _classify(name)
        if kind is None:
            unknown.append(name)
            report.append(ReportLine(name, "dropped", note="not a BERT variable (--skip-unknown)"))
            continue
        if kind == "model":
            report.append(ReportLine(name, "mapped", target, "transposed" if transform else ""))
            model.append((e, target, transform))
        elif opts.with_optimizer:
            report.append(ReportLine(name, "optimizer", target))
            optim.append((e, target, transform))
        else:
            report.append(ReportLine(name, "dropped", note="optimizer state; convert it with --with-optimizer"))
    if unknown and not opts.skip_unknown:
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        raise CheckpointError(f"{prefix}: unknown variable {unknown[0]}{more} (not BERT; --skip-unknown drops them)")
    for e, _, _ in model + optim:  # strings, resources, unknown enums: not numbers at all
        if e.slices:
            raise CheckpointError(f"{prefix}.index: tensor {e.name} is a partitioned variable ({e.slices} slices); "
                                  f"slice assembly is not supported")
        if not isinstance(e.dtype, np.dtype):
            raise CheckpointError(f"{prefix}.index: tensor {e.name} has dtype {e.dtype}, not a numeric type")

    shapes = {t: apply_shape(tr, e.shape) for e, t, tr in model}
    back = {t: e.name for e, t, _ in model}
    if "classifier.weight" in shapes:  # Google's configs do not record the label count
        config.num_labels = shapes["classifier.weight"][0]
    _check(shapes, config, back, TABLE, prefix)

    def producer(e, transform):
        return lambda: apply(transform, tf1_bundle.read_tensor(prefix, e))

    def stream(items):
        out = []
        for e, target, transform in items:
            spec = TensorSpec(target, np.dtype(e.dtype), apply_shape(transform, e.shape))
            out.append(cast_spec(spec, producer(e, transform), opts.dtype if not target == "step" else None))
        return out

    return Source(prefix, NAME, config, vocab, stream(model), stream(optim),
                  dict(OPTIMIZER_META) if optim else {}, report)


def _check(shapes, config, back, table, where):
    """check_against_config with TF names and TF ([in, out]) shapes in messages."""
    def src(name):
        hit = back.get(name) or table.from_canonical(name)
        return hit if isinstance(hit, str) else (hit[0] if hit else name)

    def src_shape(name, shape):
        hit = table.from_canonical(name)
        return apply_shape(inverse(hit[1]), shape) if hit else shape

    check_against_config(shapes, config, src, where, src_shape)


def write(source: Source, dst: str, opts: Options) -> list:
    """Write ``dst/`` as Google's release layout: bert_model.ckpt.*, bert_config.json, vocab.txt."""
    return write_with(write_files, source, dst, opts)


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

    tf1_bundle.write_bundle(os.path.join(d, PREFIX_NAME), ((n, p()) for n, p in items))
    write_google_sidecars(source, d)
    return notes


def _inverse_producer(prod, transform):
    inv = inverse(transform)
    return lambda: apply(inv, prod())

