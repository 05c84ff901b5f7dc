"""Google's BertModel and its heads as a TF1 graph: the independent TensorFlow reference's maths.

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

This module holds the graph only (the config numbers it reads, the activations, layer norm,
dense and ``forward``); Google's variables and checkpoints are in ``tf_reference_checkpoint.py``,
running the graph on a checkpoint or on numpy weights in ``tf_reference.py``.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

__all__ = ["Config", "activation", "layer_norm", "dense", "forward"]


# ----------------------------------------------------------------------------- config


def _config_dict(config) -> dict:
    """Accept a Google bert_config dict (or anything with ``to_google_dict``)."""
    if isinstance(config, dict):
        return config
    if hasattr(config, "to_google_dict"):
        return config.to_google_dict()
    raise TypeError(f"config must be a Google bert_config dict, got {type(config).__name__}")


class Config:
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
        activation(self.hidden_act)  # validate early


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


def activation(name):
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


# ----------------------------------------------------------------------------- graph


def layer_norm(x, gamma, beta, eps):
    """tf.contrib.layers.layer_norm(begin_norm_axis=-1, begin_params_axis=-1)."""
    rank = x.shape.ndims
    norm_axes = [rank - 1]
    mean, variance = tf.nn.moments(x, norm_axes, keepdims=True)
    return tf.nn.batch_normalization(x, mean, variance, offset=beta, scale=gamma,
                                     variance_epsilon=eps)


def dense(x, w, prefix, act=None):
    """tf.layers.dense on a 2-D input: matmul, bias_add, activation."""
    y = tf.matmul(x, w[prefix + "/kernel"])
    y = tf.nn.bias_add(y, w[prefix + "/bias"])
    if act is not None:
        y = act(y)
    return y


def forward(w, cfg, input_ids, token_type_ids, input_mask, heads, return_all_layers=False, dtype=None):
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
    act = activation(cfg.hidden_act)
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
    x = layer_norm(x, w["bert/embeddings/LayerNorm/gamma"], w["bert/embeddings/LayerNorm/beta"], eps)
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
        q = dense(layer_input, w, p + "/attention/self/query")
        k = dense(layer_input, w, p + "/attention/self/key")
        v = dense(layer_input, w, p + "/attention/self/value")
        q, k = heads_view(q), heads_view(k)
        scores = tf.matmul(q, k, transpose_b=True)
        scores = tf.multiply(scores, 1.0 / math.sqrt(float(D)))
        scores += adder
        probs = tf.nn.softmax(scores)
        v = tf.transpose(tf.reshape(v, [B, S, N, D]), [0, 2, 1, 3])
        ctx = tf.matmul(probs, v)
        ctx = tf.transpose(ctx, [0, 2, 1, 3])
        ctx = tf.reshape(ctx, [B * S, N * D])
        att = dense(ctx, w, p + "/attention/output/dense")
        att = layer_norm(att + layer_input, w[p + "/attention/output/LayerNorm/gamma"],
                         w[p + "/attention/output/LayerNorm/beta"], eps)
        inter = dense(att, w, p + "/intermediate/dense", act)
        out = dense(inter, w, p + "/output/dense")
        out = layer_norm(out + att, w[p + "/output/LayerNorm/gamma"],
                         w[p + "/output/LayerNorm/beta"], eps)
        prev = out
        if return_all_layers:
            outs["encoder_layer_%d" % i] = tf.reshape(out, [B, S, H])

    seq = tf.reshape(prev, [B, S, H])
    outs["sequence_output"] = seq
    first = tf.squeeze(seq[:, 0:1, :], axis=1)
    pooled = dense(first, w, "bert/pooler/dense", tf.tanh)
    outs["pooled_output"] = pooled

    # ---- heads
    if "mlm" in heads:
        # run_pretraining.get_masked_lm_output, on every position instead of
        # gather_indexes(masked_lm_positions): rows are independent, so the
        # values at masked positions agree up to float32 rounding (matmul blocking).
        h = tf.reshape(seq, [B * S, H])
        h = dense(h, w, "cls/predictions/transform/dense", act)
        h = layer_norm(h, w["cls/predictions/transform/LayerNorm/gamma"],
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
