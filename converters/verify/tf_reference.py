"""Running the independent TensorFlow reference of Google's BERT (TF1 graph code).

``run_reference`` restores a Google checkpoint and runs Google's forward on it (``is_training=False``);
``forward_numpy_weights`` runs the same graph on Google-named numpy arrays; ``make_batch`` makes
the padded two-segment batch they are fed. The heads run are detected from the variable names.
The graph itself is ``tf_reference_model.py`` (its docstring: the op order it follows); the
variables and checkpoints ``tf_reference_checkpoint.py``. Nothing here imports the project's own
model code: the reference must stay independent of what it verifies.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from bert_of.converters.verify.tf_reference_checkpoint import assign_from_numpy, create_variables, session, variable_specs
from bert_of.converters.verify.tf_reference_model import Config, forward

tf1 = tf.compat.v1

__all__ = ["make_batch", "run_reference", "forward_numpy_weights", "detect_heads", "specs_for", "OUTPUT_KEYS"]

OUTPUT_KEYS = (
    "sequence_output",
    "pooled_output",
    "prediction_logits",
    "seq_relationship_logits",
    "start_logits",
    "end_logits",
    "logits",
)


# ----------------------------------------------------------------------------- head detection


def detect_heads(names):
    """Output heads present, from a collection of variable names.

    Returns a subset of {"mlm", "nsp", "squad", "classifier"}."""
    names = set(names)
    found = set()
    if any(n.startswith("cls/predictions/") for n in names):
        found.add("mlm")
    if any(n.startswith("cls/seq_relationship/") for n in names):
        found.add("nsp")
    if any(n.startswith("cls/squad/") for n in names):
        found.add("squad")
    if "output_weights" in names:
        found.add("classifier")
    return found


def _graph_heads(found):
    """detect_heads result -> the make_checkpoint heads whose variables to build."""
    heads = []
    if "mlm" in found or "nsp" in found:
        heads.append("pretraining")
    if "squad" in found:
        heads.append("squad")
    if "classifier" in found:
        heads.append("classifier")
    return tuple(heads)


def specs_for(config, found, shapes):
    """Variable specs for the model + the detected heads (mlm/nsp may appear alone)."""
    num_labels = None
    if "classifier" in found:
        num_labels = int(shapes["output_weights"][0])
    specs = variable_specs(config, _graph_heads(found), num_labels)
    keep = []
    for s in specs:
        n = s[0]
        if n.startswith("cls/predictions/") and "mlm" not in found:
            continue
        if n.startswith("cls/seq_relationship/") and "nsp" not in found:
            continue
        keep.append(s)
    return keep


# ----------------------------------------------------------------------------- batch


def _batch_arrays(batch):
    def pick(*keys):
        for k in keys:
            if k in batch and batch[k] is not None:
                return np.asarray(batch[k])
        return None

    ids = pick("input_ids")
    if ids is None:
        raise ValueError("batch needs input_ids")
    tt = pick("token_type_ids", "segment_ids")
    mask = pick("attention_mask", "input_mask")
    if tt is None:
        tt = np.zeros_like(ids)
    if mask is None:
        mask = np.ones_like(ids)
    if ids.ndim != 2 or tt.shape != ids.shape or mask.shape != ids.shape:
        raise ValueError(f"batch arrays must share one [B, S] shape: {ids.shape}, {tt.shape}, {mask.shape}")
    # run_pretraining._decode_record casts int64 features to int32.
    return ids.astype(np.int32), tt.astype(np.int32), mask.astype(np.int32)


def _check_ids(cfg, ids, tt):
    if ids.min() < 0 or ids.max() >= cfg.vocab_size:
        raise ValueError(f"input_ids out of range [0, {cfg.vocab_size})")
    if tt.min() < 0 or tt.max() >= cfg.type_vocab_size:
        raise ValueError(f"token_type_ids out of range [0, {cfg.type_vocab_size})")


def make_batch(config, batch_size=3, seq_len=None, seed=0):
    """A padded two-segment batch: [CLS] a.. [SEP] b.. [SEP] pad.., int64 [B, S].

    Row 0 fills the whole length; later rows are shorter (padding: id 0,
    type 0, mask 0). Segment a has type 0, segment b type 1; with
    type_vocab_size > 2 the last row's segment b cycles through types
    1..type_vocab_size-1."""
    cfg = Config(config)
    S = int(seq_len) if seq_len is not None else min(16, cfg.max_position_embeddings)
    B = int(batch_size)
    if S < 1 or B < 1:
        raise ValueError("batch_size and seq_len must be >= 1")
    if S > cfg.max_position_embeddings:
        raise ValueError(f"seq_len {S} > max_position_embeddings {cfg.max_position_embeddings}")
    V = cfg.vocab_size
    cls_id, sep_id = (101, 102) if V > 103 else (min(1, V - 1), min(2, V - 1))
    lo = min(5, V - 1) if V > 5 else 0
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0xB47C4])
    ids = np.zeros((B, S), np.int64)
    tt = np.zeros((B, S), np.int64)
    mask = np.zeros((B, S), np.int64)
    min_len = min(S, 5)
    for r in range(B):
        L = S if B == 1 else S - int(round(r * (S - min_len) / (B - 1)))
        L = max(min_len, min(S, L))
        body = L - 3
        if body >= 2:
            la = max(1, body // 2 + (r % 2))  # vary the split between rows
            la = min(la, body - 1)
            lb = body - la
            row = [cls_id] + list(rng.integers(lo, V, la)) + [sep_id] + list(rng.integers(lo, V, lb)) + [sep_id]
            types = [0] * (la + 2) + [1] * (lb + 1)
            if cfg.type_vocab_size > 2 and r == B - 1:
                types = [0] * (la + 2) + [1 + (j % (cfg.type_vocab_size - 1)) for j in range(lb + 1)]
        else:  # very short sequences: [CLS] x.. [SEP]
            row = [cls_id] + list(rng.integers(lo, V, max(0, L - 2))) + ([sep_id] if L >= 2 else [])
            row = row[:L]
            types = [0] * L
        if cfg.type_vocab_size < 2:
            types = [0] * len(types)
        ids[r, :L] = row
        tt[r, :L] = types
        mask[r, :L] = 1
    return {"input_ids": ids, "token_type_ids": tt, "attention_mask": mask}


# ----------------------------------------------------------------------------- public entry points


def _run(config, batch, values_fn, names_and_shapes, return_all_layers=False, dtype="float32"):
    cfg = Config(config)
    ids, tt, mask = _batch_arrays(batch)
    _check_ids(cfg, ids, tt)
    found = detect_heads(names_and_shapes)
    specs = specs_for(config, found, names_and_shapes)
    graph = tf.Graph()
    with graph.as_default():
        variables = create_variables(specs)
        t_ids = tf.constant(ids, dtype=tf.int32, name="input_ids")
        t_tt = tf.constant(tt, dtype=tf.int32, name="token_type_ids")
        t_mask = tf.constant(mask, dtype=tf.int32, name="input_mask")
        outs = forward(variables, cfg, t_ids, t_tt, t_mask, found, return_all_layers, tf.as_dtype(dtype))
        with session(graph) as sess:
            values_fn(sess, variables)
            res = sess.run(outs)
    return {k: np.asarray(v) for k, v in res.items()}


def run_reference(prefix, config, batch, return_all_layers=False, dtype="float32"):
    """Google's forward (is_training=False, fp32) on the checkpoint at ``prefix``.

    Heads are detected from the checkpoint's variable names; optimizer slots
    and global_step in the checkpoint are ignored. Returns numpy arrays among
    OUTPUT_KEYS (plus embedding_output / encoder_layer_i if
    return_all_layers)."""
    prefix = os.fspath(prefix)
    if os.path.isdir(prefix):  # a model directory: its latest checkpoint
        latest = tf.train.latest_checkpoint(prefix)
        if latest is None:
            raise ValueError(f"no checkpoint in directory {prefix}")
        prefix = latest
    shapes = dict(tf.train.list_variables(prefix))

    def restore(sess, variables):
        missing = [n for n in variables if n not in shapes]
        if missing:
            raise ValueError(f"checkpoint {prefix} lacks {missing[:5]}")
        saver = tf1.train.Saver(var_list=dict(variables))
        saver.restore(sess, prefix)

    return _run(config, batch, restore, shapes, return_all_layers, dtype)


def forward_numpy_weights(weights, config, batch, return_all_layers=False, dtype="float32"):
    """Same graph as run_reference, variables loaded from Google-named numpy arrays."""
    shapes = {k: tuple(np.shape(v)) for k, v in weights.items()}

    def load(sess, variables):
        missing = [n for n in variables if n not in weights]
        if missing:
            raise ValueError(f"weights lack {missing[:5]}")
        assign_from_numpy(sess, variables, weights)

    return _run(config, batch, load, shapes, return_all_layers, dtype)
