"""Google's BERT variables for the TF reference: names and shapes, values, TF1 checkpoints.

``variable_specs`` lists the variables in Google's creation order (modeling.py, run_pretraining.py,
run_squad.py, run_classifier.py); ``make_weights`` gives them numpy values (Google's init or
trained-BERT magnitudes, deterministic per variable); ``make_checkpoint`` writes them as a TF1
checkpoint in Google's layout. The session and variable-loading helpers here are shared with the
graph runners (``tf_reference.py``, ``tf_reference_train.py``). Nothing here imports the project's
own model code: the reference must stay independent of what it verifies.
"""

from __future__ import annotations

import math
import os
import zlib

import numpy as np
import tensorflow as tf

from bert_of.converters.verify.tf_reference_model import Config
from bert_of.initializers import truncated_normal

tf1 = tf.compat.v1

__all__ = ["make_checkpoint", "variable_specs", "make_weights", "HEADS",
           "session", "create_variables", "assign_from_numpy"]

HEADS = ("pretraining", "squad", "classifier")

_THREADS = 2


# ----------------------------------------------------------------------------- variable layout


def _normalize_heads(heads):
    if isinstance(heads, str):
        heads = (heads,)
    heads = tuple(heads or ())
    bad = [h for h in heads if h not in HEADS]
    if bad:
        raise ValueError(f"unknown head(s) {bad}; choose from {HEADS}")
    return heads


def variable_specs(config, heads=("pretraining",), num_labels=None):
    """[(name, shape, kind)] in Google's variable-creation order.

    ``kind`` drives initialisation: kernel, bias, embedding, gamma, beta,
    mlm_bias, head_weights, head_bias.
    """
    cfg = Config(config)
    heads = _normalize_heads(heads)
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    specs = []
    add = lambda n, s, k: specs.append((n, tuple(int(d) for d in s), k))

    def ln(scope):
        # contrib layer_norm creates beta first, then gamma.
        add(scope + "/LayerNorm/beta", [H], "beta")
        add(scope + "/LayerNorm/gamma", [H], "gamma")

    def dense(scope, n_in, n_out):
        add(scope + "/kernel", [n_in, n_out], "kernel")
        add(scope + "/bias", [n_out], "bias")

    add("bert/embeddings/word_embeddings", [V, H], "embedding")
    add("bert/embeddings/token_type_embeddings", [cfg.type_vocab_size, H], "embedding")
    add("bert/embeddings/position_embeddings", [cfg.max_position_embeddings, H], "embedding")
    ln("bert/embeddings")
    for i in range(cfg.num_hidden_layers):
        p = "bert/encoder/layer_%d" % i
        for n in ("query", "key", "value"):
            dense(p + "/attention/self/" + n, H, H)
        dense(p + "/attention/output/dense", H, H)
        ln(p + "/attention/output")
        dense(p + "/intermediate/dense", H, I)
        dense(p + "/output/dense", I, H)
        ln(p + "/output")
    dense("bert/pooler/dense", H, H)
    if "pretraining" in heads:
        dense("cls/predictions/transform/dense", H, H)
        ln("cls/predictions/transform")
        add("cls/predictions/output_bias", [V], "mlm_bias")
        add("cls/seq_relationship/output_weights", [2, H], "head_weights")
        add("cls/seq_relationship/output_bias", [2], "head_bias")
    if "squad" in heads:
        add("cls/squad/output_weights", [2, H], "head_weights")
        add("cls/squad/output_bias", [2], "head_bias")
    if "classifier" in heads:
        nl = cfg.num_labels if num_labels is None else int(num_labels)
        add("output_weights", [nl, H], "head_weights")
        add("output_bias", [nl], "head_bias")
    return specs


# Realistic-weight recipe (realistic=True). Kernel std is scaled by fan-in,
# std = 1.5 / sqrt(fan_in) clipped to [0.02, 0.35], so that pre-activations
# have a trained BERT's magnitude (std ~1.3-1.5, where tanh-GELU and erf-GELU
# differ by 1e-4..5e-4) whatever the width: 0.054 for hidden 768 (trained
# BERT-base range), 0.27 for a 32-wide test model, where a fixed 0.05-0.08
# would leave pre-activations at ~0.4 and hide the GELU variant (~1e-5).
# Measured on the tiny test config (3 layers, hidden 32, intermediate 37):
# tanh-vs-erf max |diff| on sequence_output 5.9e-4 (Google init: 4.8e-7);
# attention max-prob median 0.24, 8% of pooled |tanh| > 0.99.
_REAL_KERNEL_GAIN = 1.5
_REAL_KERNEL_STD_RANGE = (0.02, 0.35)
_REAL = {
    "embedding": 0.05,
    "bias": 0.08,
    "gamma_mean": 0.9,
    "gamma_std": 0.2,
    "beta_std": 0.1,
    "mlm_bias_mean": -1.0,
    "mlm_bias_std": 1.0,
    "head_bias_std": 0.1,
}


def _var_rng(seed, name):
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(name.encode("utf-8"))])


def _init_value(name, shape, kind, cfg, seed, realistic):
    rng = _var_rng(seed, name)
    if not realistic:
        # Google: create_initializer(initializer_range) for every weight matrix
        # (the SQuAD/classifier heads hard-code stddev 0.02), zeros for biases,
        # contrib layer_norm ones/zeros.
        if kind in ("kernel", "embedding", "head_weights"):
            std = cfg.initializer_range
            if kind == "head_weights" and not name.startswith("cls/seq_relationship"):
                std = 0.02
            return truncated_normal(rng, shape, std)
        if kind == "gamma":
            return np.ones(shape, np.float32)
        return np.zeros(shape, np.float32)
    if kind in ("kernel", "head_weights"):
        fan_in = shape[0] if kind == "kernel" else shape[1]
        lo, hi = _REAL_KERNEL_STD_RANGE
        std = float(np.clip(_REAL_KERNEL_GAIN / math.sqrt(fan_in), lo, hi))
        return (rng.standard_normal(shape) * std).astype(np.float32)
    if kind == "embedding":
        return (rng.standard_normal(shape) * _REAL["embedding"]).astype(np.float32)
    if kind == "bias":
        return (rng.standard_normal(shape) * _REAL["bias"]).astype(np.float32)
    if kind == "gamma":
        return (_REAL["gamma_mean"] + rng.standard_normal(shape) * _REAL["gamma_std"]).astype(np.float32)
    if kind == "beta":
        return (rng.standard_normal(shape) * _REAL["beta_std"]).astype(np.float32)
    if kind == "mlm_bias":
        return (_REAL["mlm_bias_mean"] + rng.standard_normal(shape) * _REAL["mlm_bias_std"]).astype(np.float32)
    if kind == "head_bias":
        return (rng.standard_normal(shape) * _REAL["head_bias_std"]).astype(np.float32)
    raise AssertionError(kind)


def make_weights(config, seed=0, heads=("pretraining",), realistic=True, num_labels=None):
    """Google-named numpy weights, exactly what make_checkpoint would save."""
    cfg = Config(config)
    return {name: _init_value(name, shape, kind, cfg, seed, realistic)
            for name, shape, kind in variable_specs(config, heads, num_labels)}


# ----------------------------------------------------------------------------- graph pieces


def session(graph):
    cp = tf1.ConfigProto(intra_op_parallelism_threads=_THREADS,
                         inter_op_parallelism_threads=_THREADS,
                         allow_soft_placement=True,
                         device_count={"GPU": 0})
    return tf1.Session(graph=graph, config=cp)


def create_variables(specs):
    """Create fp32 variables named exactly as in specs (root variable scope)."""
    out = {}
    for name, shape, _ in specs:
        out[name] = tf1.get_variable(name, shape=list(shape), dtype=tf.float32,
                                     initializer=tf1.zeros_initializer())
    return out


class _Loader:
    """Set variables by feeding their initial values into their initializers
    (what Variable.load does, without its deprecation notice): adds no graph
    ops, so values stay out of the GraphDef / .meta. Batched into few
    session runs, flushed every ~256 MB to bound memory on large models."""

    _FLUSH_BYTES = 256 << 20

    def __init__(self, sess):
        self.sess, self.ops, self.feed, self.bytes = sess, [], {}, 0

    def add(self, var, value):
        value = np.asarray(value, dtype=var.dtype.base_dtype.as_numpy_dtype)
        want = tuple(var.shape.as_list())
        if tuple(value.shape) != want:
            raise ValueError(f"{var.op.name}: shape {tuple(value.shape)} != expected {want}")
        self.ops.append(var.initializer)
        self.feed[var.initial_value] = value
        self.bytes += value.nbytes
        if self.bytes >= self._FLUSH_BYTES:
            self.flush()

    def flush(self):
        if self.ops:
            self.sess.run(self.ops, feed_dict=self.feed)
        self.ops, self.feed, self.bytes = [], {}, 0


def assign_from_numpy(sess, variables, values):
    loader = _Loader(sess)
    for name, var in variables.items():
        loader.add(var, values[name])
    loader.flush()


# ----------------------------------------------------------------------------- public entry points


def make_checkpoint(prefix, config, seed=0, heads=("pretraining",), realistic=True,
                    with_optimizer=False, global_step=0):
    """Write a TF1 checkpoint in Google's original layout to ``prefix``.

    Creates <prefix>.index, <prefix>.data-00000-of-00001, <prefix>.meta and
    the ``checkpoint`` state file in its directory. Values come from numpy
    (deterministic in ``seed``; each variable has its own stream, so the
    encoder weights do not depend on which heads are added).

    realistic=False: Google's init (truncated normal initializer_range,
    zero biases, LayerNorm gamma 1 / beta 0). realistic=True: trained-BERT
    magnitudes (see _REAL / _REAL_KERNEL_GAIN).
    with_optimizer=True: adds ``<var>/adam_m``, ``<var>/adam_v`` for every
    variable (AdamWeightDecayOptimizer's slots) and int64 ``global_step``.
    Returns the prefix.
    """
    cfg = Config(config)
    heads = _normalize_heads(heads)
    specs = variable_specs(config, heads)
    prefix = os.fspath(prefix)
    d = os.path.dirname(os.path.abspath(prefix))
    os.makedirs(d, exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        model_vars = create_variables(specs)
        slot_vars = {}
        gs = None
        if with_optimizer:
            for name, shape, _ in specs:
                for slot in ("adam_m", "adam_v"):
                    slot_vars[name + "/" + slot] = tf1.get_variable(
                        name + "/" + slot, shape=list(shape), dtype=tf.float32,
                        initializer=tf1.zeros_initializer(), trainable=False)
            gs = tf1.train.get_or_create_global_step()  # int64 scalar "global_step"
        saver = tf1.train.Saver(var_list=None, save_relative_paths=True, max_to_keep=None)
        init = tf1.global_variables_initializer()
        with session(graph) as sess:
            sess.run(init)
            loader = _Loader(sess)
            for name, shape, kind in specs:
                loader.add(model_vars[name], _init_value(name, shape, kind, cfg, seed, realistic))
            if with_optimizer:
                for name, shape, _ in specs:
                    rng = _var_rng(seed, name + "/adam")
                    m = (rng.standard_normal(shape) * 1e-3).astype(np.float32)
                    v = (rng.standard_normal(shape) * 1e-3).astype(np.float32) ** 2
                    loader.add(slot_vars[name + "/adam_m"], m)
                    loader.add(slot_vars[name + "/adam_v"], v)
                loader.add(gs, np.int64(global_step))
            loader.flush()
            saver.save(sess, prefix, write_meta_graph=True)
    return prefix
