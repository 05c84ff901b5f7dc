"""Independent TensorFlow reference of Google's original BERT (TF1 graph code).

This module recomputes, op for op, what google-research/bert computes:
``modeling.py`` (BertModel), the pre-training heads of ``run_pretraining.py``
(masked LM + next sentence), the SQuAD head of ``run_squad.py`` and the
classifier head of ``run_classifier.py``, in TF 2.x ``tf.compat.v1`` graph
mode. It is the yardstick the project's BERT is checked against, so it follows
Google's op order rather than any "equivalent" formulation:

* embeddings: word ids -> ``tf.gather`` (Google's default
  ``use_one_hot_embeddings=False``); token types -> ``tf.one_hot`` then
  ``tf.matmul`` with the table (Google always does one-hot here); positions ->
  ``tf.slice`` of the table to ``seq_len``; summed word + type, then + position;
  then layer norm; dropout is off (``is_training=False``).
* layer norm = ``tf.contrib.layers.layer_norm(begin_norm_axis=-1,
  begin_params_axis=-1)``: ``tf.nn.moments`` over the last axis (keepdims),
  then ``tf.nn.batch_normalization(x, mean, var, offset=beta, scale=gamma,
  variance_epsilon=1e-12)``, i.e. ``inv = rsqrt(var + eps) * gamma;
  y = x * inv + (beta - mean * inv)``. ``eps`` is the config key
  ``layer_norm_eps`` (default 1e-12, the constant contrib hard-codes).
* dense = ``tf.layers.dense`` on 2-D input: ``bias_add(matmul(x, kernel), bias)``
  then the activation; the encoder keeps activations 2-D ``[B*S, H]``.
* attention: ``scores = matmul(q, k, transpose_b=True) * (1/sqrt(d))``,
  ``scores += (1 - mask) * -10000.0``, softmax, ``matmul(probs, v)``.
* ``"gelu"`` is Google's tanh approximation written as Google writes it:
  ``x * (0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3)))))``.

Nothing here imports the project's own model code: the reference must stay
independent of what it verifies.
"""

from __future__ import annotations

import math
import os
import zlib

import numpy as np
import tensorflow as tf

from bert_of.initializers import truncated_normal

tf1 = tf.compat.v1

__all__ = [
    "make_checkpoint",
    "make_batch",
    "run_reference",
    "forward_numpy_weights",
    "variable_specs",
    "make_weights",
    "detect_heads",
    "HEADS",
    "OUTPUT_KEYS",
]

HEADS = ("pretraining", "squad", "classifier")
OUTPUT_KEYS = (
    "sequence_output",
    "pooled_output",
    "prediction_logits",
    "seq_relationship_logits",
    "start_logits",
    "end_logits",
    "logits",
)

_THREADS = 2


# ----------------------------------------------------------------------------- config


def _config_dict(config) -> dict:
    """Accept a Google bert_config dict (or anything with ``to_google_dict``)."""
    if isinstance(config, dict):
        return config
    if hasattr(config, "to_google_dict"):
        return config.to_google_dict()
    raise TypeError(f"config must be a Google bert_config dict, got {type(config).__name__}")


class _Cfg:
    """The few numbers the graph needs, read from a Google bert_config dict."""

    def __init__(self, config):
        c = _config_dict(config)
        try:
            self.vocab_size = int(c["vocab_size"])
            self.hidden_size = int(c.get("hidden_size", 768))
            self.num_hidden_layers = int(c.get("num_hidden_layers", 12))
            self.num_attention_heads = int(c.get("num_attention_heads", 12))
            self.intermediate_size = int(c.get("intermediate_size", 3072))
        except KeyError as e:  # pragma: no cover - message only
            raise ValueError(f"bert config is missing {e}") from None
        self.max_position_embeddings = int(c.get("max_position_embeddings", 512))
        self.type_vocab_size = int(c.get("type_vocab_size", 2))
        self.initializer_range = float(c.get("initializer_range", 0.02))
        # bert_of's token classifier (bert_config.json written by bert_of): output_weights on every position
        self.token_classifier = c.get("bert_of_classifier_kind") == "token"
        # bert_of stores its exact activation beside Google's label.
        act = c.get("bert_of_hidden_act")
        if act is None:
            act = c.get("hidden_act", "gelu")
        self.hidden_act = act
        self.layer_norm_eps = float(c.get("layer_norm_eps", 1e-12))
        self.num_labels = int(c.get("num_labels", 2))
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                "The hidden size (%d) is not a multiple of the number of attention heads (%d)"
                % (self.hidden_size, self.num_attention_heads))
        self.head_size = self.hidden_size // self.num_attention_heads
        _activation(self.hidden_act)  # validate early


# ----------------------------------------------------------------------------- activations


def _gelu_google(x):
    # modeling.gelu: cdf = 0.5 * (1.0 + tf.tanh((np.sqrt(2 / np.pi) * (x + 0.044715 * tf.pow(x, 3)))))
    #                return x * cdf
    c = np.sqrt(2 / np.pi)
    cdf = 0.5 * (1.0 + tf.tanh(c * (x + 0.044715 * tf.pow(x, 3))))
    return x * cdf


def _gelu_erf(x):
    return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


def _silu(x):
    return x * tf.sigmoid(x)


def _activation(name):
    """None means linear (Google's get_activation returns None for 'linear')."""
    if callable(name):
        return name
    if not name:
        return None
    act = str(name).lower()
    if act == "linear":
        return None
    if act in ("gelu", "gelu_tanh"):
        return _gelu_google
    if act == "gelu_erf":
        return _gelu_erf
    if act == "relu":
        return tf.nn.relu
    if act == "tanh":
        return tf.tanh
    if act in ("silu", "swish"):
        return _silu
    raise ValueError("Unsupported activation: %s" % act)


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
    cfg = _Cfg(config)
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
    cfg = _Cfg(config)
    return {name: _init_value(name, shape, kind, cfg, seed, realistic)
            for name, shape, kind in variable_specs(config, heads, num_labels)}


# ----------------------------------------------------------------------------- graph pieces


def _session(graph):
    cp = tf1.ConfigProto(intra_op_parallelism_threads=_THREADS,
                         inter_op_parallelism_threads=_THREADS,
                         allow_soft_placement=True,
                         device_count={"GPU": 0})
    return tf1.Session(graph=graph, config=cp)


def _create_variables(specs):
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


def _assign_from_numpy(sess, variables, values):
    loader = _Loader(sess)
    for name, var in variables.items():
        loader.add(var, values[name])
    loader.flush()


def _layer_norm(x, gamma, beta, eps):
    """tf.contrib.layers.layer_norm(begin_norm_axis=-1, begin_params_axis=-1)."""
    rank = x.shape.ndims
    norm_axes = [rank - 1]
    mean, variance = tf.nn.moments(x, norm_axes, keepdims=True)
    return tf.nn.batch_normalization(x, mean, variance, offset=beta, scale=gamma,
                                     variance_epsilon=eps)


def _dense(x, w, prefix, act=None):
    """tf.layers.dense on a 2-D input: matmul, bias_add, activation."""
    y = tf.matmul(x, w[prefix + "/kernel"])
    y = tf.nn.bias_add(y, w[prefix + "/bias"])
    if act is not None:
        y = act(y)
    return y


def _forward(w, cfg, input_ids, token_type_ids, input_mask, heads, return_all_layers=False, dtype=None):
    """Google's BertModel(is_training=False) + heads on int32 [B, S] tensors.

    dtype float64 runs the same graph on float64 casts of the (fp32) weights:
    Google's function without fp32 rounding, the yardstick for one fp32
    implementation's own error.
    """
    dt = dtype or tf.float32
    if dt != tf.float32:
        w = {k: tf.cast(v, dt) for k, v in w.items()}
    B, S = input_ids.shape.as_list()
    H, N, D = cfg.hidden_size, cfg.num_attention_heads, cfg.head_size
    eps = cfg.layer_norm_eps
    act = _activation(cfg.hidden_act)
    if S > cfg.max_position_embeddings:
        raise ValueError(f"seq_len {S} > max_position_embeddings {cfg.max_position_embeddings}")
    outs = {}

    # ---- embeddings (modeling.embedding_lookup + embedding_postprocessor)
    ids = tf.expand_dims(input_ids, axis=[-1])                     # [B, S, 1]
    flat_ids = tf.reshape(ids, [-1])
    x = tf.gather(w["bert/embeddings/word_embeddings"], flat_ids)
    x = tf.reshape(x, [B, S, 1 * H])
    flat_tt = tf.reshape(token_type_ids, [-1])
    one_hot = tf.one_hot(flat_tt, depth=cfg.type_vocab_size, dtype=dt)
    tt = tf.matmul(one_hot, w["bert/embeddings/token_type_embeddings"])
    tt = tf.reshape(tt, [B, S, H])
    x += tt
    pos = tf.slice(w["bert/embeddings/position_embeddings"], [0, 0], [S, -1])
    pos = tf.reshape(pos, [1, S, H])
    x += pos
    x = _layer_norm(x, w["bert/embeddings/LayerNorm/gamma"], w["bert/embeddings/LayerNorm/beta"], eps)
    if return_all_layers:
        outs["embedding_output"] = x

    # ---- attention mask (create_attention_mask_from_input_mask)
    to_mask = tf.cast(tf.reshape(input_mask, [B, 1, S]), dt)
    mask = tf.ones([B, S, 1], dtype=dt) * to_mask           # [B, F, T]
    mask = tf.expand_dims(mask, axis=[1])                           # [B, 1, F, T]
    adder = (1.0 - tf.cast(mask, dt)) * -10000.0

    def heads_view(t):
        t = tf.reshape(t, [B, S, N, D])
        return tf.transpose(t, [0, 2, 1, 3])

    # ---- transformer_model
    prev = tf.reshape(x, [-1, H])
    for i in range(cfg.num_hidden_layers):
        p = "bert/encoder/layer_%d" % i
        layer_input = prev
        q = _dense(layer_input, w, p + "/attention/self/query")
        k = _dense(layer_input, w, p + "/attention/self/key")
        v = _dense(layer_input, w, p + "/attention/self/value")
        q, k = heads_view(q), heads_view(k)
        scores = tf.matmul(q, k, transpose_b=True)
        scores = tf.multiply(scores, 1.0 / math.sqrt(float(D)))
        scores += adder
        probs = tf.nn.softmax(scores)
        v = tf.transpose(tf.reshape(v, [B, S, N, D]), [0, 2, 1, 3])
        ctx = tf.matmul(probs, v)
        ctx = tf.transpose(ctx, [0, 2, 1, 3])
        ctx = tf.reshape(ctx, [B * S, N * D])
        att = _dense(ctx, w, p + "/attention/output/dense")
        att = _layer_norm(att + layer_input, w[p + "/attention/output/LayerNorm/gamma"],
                          w[p + "/attention/output/LayerNorm/beta"], eps)
        inter = _dense(att, w, p + "/intermediate/dense", act)
        out = _dense(inter, w, p + "/output/dense")
        out = _layer_norm(out + att, w[p + "/output/LayerNorm/gamma"],
                          w[p + "/output/LayerNorm/beta"], eps)
        prev = out
        if return_all_layers:
            outs["encoder_layer_%d" % i] = tf.reshape(out, [B, S, H])

    seq = tf.reshape(prev, [B, S, H])
    outs["sequence_output"] = seq
    first = tf.squeeze(seq[:, 0:1, :], axis=1)
    pooled = _dense(first, w, "bert/pooler/dense", tf.tanh)
    outs["pooled_output"] = pooled

    # ---- heads
    if "mlm" in heads:
        # run_pretraining.get_masked_lm_output, on every position instead of
        # gather_indexes(masked_lm_positions): rows are independent, so the
        # values at masked positions agree up to float32 rounding (matmul blocking).
        h = tf.reshape(seq, [B * S, H])
        h = _dense(h, w, "cls/predictions/transform/dense", act)
        h = _layer_norm(h, w["cls/predictions/transform/LayerNorm/gamma"],
                        w["cls/predictions/transform/LayerNorm/beta"], eps)
        logits = tf.matmul(h, w["bert/embeddings/word_embeddings"], transpose_b=True)
        logits = tf.nn.bias_add(logits, w["cls/predictions/output_bias"])
        outs["prediction_logits"] = tf.reshape(logits, [B, S, cfg.vocab_size])
    if "nsp" in heads:
        logits = tf.matmul(pooled, w["cls/seq_relationship/output_weights"], transpose_b=True)
        outs["seq_relationship_logits"] = tf.nn.bias_add(logits, w["cls/seq_relationship/output_bias"])
    if "squad" in heads:
        h = tf.reshape(seq, [B * S, H])
        logits = tf.matmul(h, w["cls/squad/output_weights"], transpose_b=True)
        logits = tf.nn.bias_add(logits, w["cls/squad/output_bias"])
        logits = tf.reshape(logits, [B, S, 2])
        logits = tf.transpose(logits, [2, 0, 1])
        start, end = tf.unstack(logits, axis=0)
        outs["start_logits"], outs["end_logits"] = start, end
    if "classifier" in heads and cfg.token_classifier:
        logits = tf.matmul(tf.reshape(seq, [B * S, H]), w["output_weights"], transpose_b=True)
        outs["logits"] = tf.reshape(tf.nn.bias_add(logits, w["output_bias"]), [B, S, -1])
    elif "classifier" in heads:
        logits = tf.matmul(pooled, w["output_weights"], transpose_b=True)
        outs["logits"] = tf.nn.bias_add(logits, w["output_bias"])
    return outs


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


def _specs_for(config, found, shapes):
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
    cfg = _Cfg(config)
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
    cfg = _Cfg(config)
    heads = _normalize_heads(heads)
    specs = variable_specs(config, heads)
    prefix = os.fspath(prefix)
    d = os.path.dirname(os.path.abspath(prefix))
    os.makedirs(d, exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        model_vars = _create_variables(specs)
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
        with _session(graph) as sess:
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


def _run(config, batch, values_fn, names_and_shapes, return_all_layers=False, dtype="float32"):
    cfg = _Cfg(config)
    ids, tt, mask = _batch_arrays(batch)
    _check_ids(cfg, ids, tt)
    found = detect_heads(names_and_shapes)
    specs = _specs_for(config, found, names_and_shapes)
    graph = tf.Graph()
    with graph.as_default():
        variables = _create_variables(specs)
        t_ids = tf.constant(ids, dtype=tf.int32, name="input_ids")
        t_tt = tf.constant(tt, dtype=tf.int32, name="token_type_ids")
        t_mask = tf.constant(mask, dtype=tf.int32, name="input_mask")
        outs = _forward(variables, cfg, t_ids, t_tt, t_mask, found, return_all_layers, tf.as_dtype(dtype))
        with _session(graph) as sess:
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
        _assign_from_numpy(sess, variables, weights)

    return _run(config, batch, load, shapes, return_all_layers, dtype)
