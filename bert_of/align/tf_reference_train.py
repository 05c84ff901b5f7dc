"""Independent TensorFlow reference for *training* Google's BERT (TF1 graph mode).

``bert-of align tf-checkpoint`` continues training a Google checkpoint in TF and,
after ``tf2of --with-optimizer``, in bert_of, on the same batches, and compares
the losses step by step. This module is the TF side. It follows what
google-research/bert's ``run_pretraining.py`` + ``optimization.py`` compute:

* forward: ``converters.verify.tf_reference_model.forward`` (Google's ``BertModel``, op for op;
  dropout off), then ``get_masked_lm_output``: gather the sequence output at
  ``masked_lm_positions`` (flat offsets ``b * seq_len``), transform dense with the
  model's activation, layer norm, logits against the word embeddings + output
  bias, ``log_softmax``; loss ``sum(w * nll) / (sum(w) + 1e-5)``; and
  ``get_next_sentence_output``: ``log_softmax`` of pooled x output_weights^T +
  bias, mean NLL. The loss is MLM + NSP.
* gradients: ``tf.gradients`` over the trainable variables, then
  ``tf.clip_by_global_norm(grads, clip_norm)`` (one norm over all of them).
* learning rate at ``global_step`` (the value *before* the step's increment):
  polynomial decay ``(init - end) * (1 - min(step, T) / T) ** power + end``, and
  while ``step < warmup`` the warmup rate ``init * step / warmup`` instead.
* ``AdamWeightDecayOptimizer``: ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
  ``update = m / (sqrt(v) + eps)`` (**no bias correction**, eps 1e-6), plus
  ``weight_decay * param`` unless the variable name contains one of
  ``LayerNorm``, ``layer_norm``, ``bias``; ``param -= lr * update``. Then
  ``global_step += 1``.

Variables, the ``adam_m`` / ``adam_v`` slots and ``global_step`` are restored from
the checkpoint (slots missing from it start at zero, as a fresh optimizer's do).
Nothing here imports bert_of's model or training code.
"""

from __future__ import annotations

import os
import re

import numpy as np
import tensorflow as tf

from bert_of.converters.verify import tf_reference as ref
from bert_of.converters.verify import tf_reference_checkpoint as ref_ckpt
from bert_of.converters.verify import tf_reference_model as ref_model

tf1 = tf.compat.v1

__all__ = ["train_reference", "google_learning_rate"]

EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


def google_learning_rate(step: int, init_lr: float, num_train_steps: int, num_warmup_steps: int,
                         end_lr: float = 0.0, power: float = 1.0) -> float:
    """The rate Google's ``create_optimizer`` uses at ``global_step == step`` (float64 math)."""
    s = min(step, num_train_steps)
    lr = (init_lr - end_lr) * (1.0 - s / num_train_steps) ** power + end_lr
    if num_warmup_steps and step < num_warmup_steps:
        lr = init_lr * step / num_warmup_steps
    return lr


def _gather_indexes(seq, positions, batch, seq_len, width):
    """[B, S, H], int32 [B, P] -> [B*P, H]: rows at ``positions`` (Google's gather_indexes)."""
    flat_offsets = tf.reshape(tf.range(0, batch, dtype=tf.int32) * seq_len, [-1, 1])
    flat_positions = tf.reshape(positions + flat_offsets, [-1])
    flat_seq = tf.reshape(seq, [batch * seq_len, width])
    return tf.gather(flat_seq, flat_positions)


def _losses(w, cfg, outs, positions, label_ids, label_weights, nsp_labels, B, S):
    act = ref_model.activation(cfg.hidden_act)
    x = _gather_indexes(outs["sequence_output"], positions, B, S, cfg.hidden_size)
    x = ref_model.dense(x, w, "cls/predictions/transform/dense", act)
    x = ref_model.layer_norm(x, w["cls/predictions/transform/LayerNorm/gamma"],
                             w["cls/predictions/transform/LayerNorm/beta"], cfg.layer_norm_eps)
    logits = tf.matmul(x, w["bert/embeddings/word_embeddings"], transpose_b=True)
    logits = tf.nn.bias_add(logits, w["cls/predictions/output_bias"])
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    ids = tf.reshape(label_ids, [-1])
    weights = tf.reshape(label_weights, [-1])
    one_hot = tf.one_hot(ids, depth=cfg.vocab_size, dtype=tf.float32)
    per_example = -tf.reduce_sum(log_probs * one_hot, axis=[-1])
    mlm = tf.reduce_sum(weights * per_example) / (tf.reduce_sum(weights) + 1e-5)

    nsp_logits = tf.matmul(outs["pooled_output"], w["cls/seq_relationship/output_weights"], transpose_b=True)
    nsp_logits = tf.nn.bias_add(nsp_logits, w["cls/seq_relationship/output_bias"])
    nsp_log_probs = tf.nn.log_softmax(nsp_logits, axis=-1)
    labels = tf.reshape(nsp_labels, [-1])
    nsp = tf.reduce_mean(-tf.reduce_sum(tf.one_hot(labels, depth=2, dtype=tf.float32) * nsp_log_probs, axis=-1))
    return mlm, nsp


def _learning_rate(global_step, init_lr, num_train_steps, num_warmup_steps, end_lr, power):
    step_f = tf.cast(global_step, tf.float32)
    decay_steps = float(num_train_steps)
    lr = (init_lr - end_lr) * tf.pow(1.0 - tf.minimum(step_f, decay_steps) / decay_steps, power) + end_lr
    if num_warmup_steps:
        step_i = tf.cast(global_step, tf.int32)
        warm_i = tf.constant(num_warmup_steps, dtype=tf.int32)
        warm_lr = init_lr * (tf.cast(step_i, tf.float32) / tf.cast(warm_i, tf.float32))
        is_warm = tf.cast(step_i < warm_i, tf.float32)
        lr = (1.0 - is_warm) * lr + is_warm * warm_lr
    return lr


def _batch_feed(batch):
    def pick(*keys):
        for k in keys:
            if k in batch and batch[k] is not None:
                return np.asarray(batch[k])
        raise KeyError(f"batch lacks {keys[0]}")

    return {
        "input_ids": pick("input_ids").astype(np.int32),
        "segment_ids": pick("token_type_ids", "segment_ids").astype(np.int32),
        "input_mask": pick("attention_mask", "input_mask").astype(np.int32),
        "masked_lm_positions": pick("masked_lm_positions").astype(np.int32),
        "masked_lm_ids": pick("masked_lm_ids").astype(np.int32),
        "masked_lm_weights": pick("masked_lm_weights").astype(np.float32),
        "next_sentence_labels": pick("next_sentence_labels").astype(np.int32).reshape(-1, 1),
    }


def train_reference(prefix, config, batches, *, init_lr: float, num_train_steps: int, num_warmup_steps: int = 0,
                    end_lr: float = 0.0, power: float = 1.0, weight_decay_rate: float = 0.01,
                    clip_norm: float = 1.0, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6,
                    exclude_from_weight_decay=EXCLUDE_FROM_WEIGHT_DECAY, return_weights: bool = False) -> dict:
    """Train the checkpoint at ``prefix`` one step per batch; return per-step numbers.

    ``config`` is a Google bert_config dict; ``batches`` a list of dicts of NumPy
    arrays (bert_of's keys or Google's feature names). Returns lists ``loss``,
    ``mlm_loss``, ``nsp_loss`` (of each step's forward, before its update), ``lr``,
    ``global_step`` (the step each used) and ``grad_norm`` (before clipping); with
    ``return_weights`` also ``weights`` {TF name: array} after the last step.
    """
    prefix = os.fspath(prefix)
    if os.path.isdir(prefix):
        prefix = tf.train.latest_checkpoint(prefix) or prefix
    stored = dict(tf.train.list_variables(prefix))
    cfg = ref_model.Config(config)
    found = ref.detect_heads(stored)
    if not {"mlm", "nsp"} <= found:
        raise ValueError(f"{prefix}: a pretraining checkpoint (cls/predictions, cls/seq_relationship) is needed")
    specs = ref.specs_for(config, found, stored)
    first = _batch_feed(batches[0])
    B, S = first["input_ids"].shape
    P = first["masked_lm_positions"].shape[1]

    graph = tf.Graph()
    with graph.as_default():
        w = ref_ckpt.create_variables(specs)
        slots = {}
        for name, shape, _ in specs:
            for slot in ("adam_m", "adam_v"):
                slots[(name, slot)] = tf1.get_variable(f"{name}/{slot}", shape=list(shape), dtype=tf.float32,
                                                       initializer=tf1.zeros_initializer(), trainable=False)
        global_step = tf1.get_variable("global_step", shape=[], dtype=tf.int64,
                                       initializer=tf1.zeros_initializer(), trainable=False)
        ph = {
            "input_ids": tf1.placeholder(tf.int32, [B, S]),
            "segment_ids": tf1.placeholder(tf.int32, [B, S]),
            "input_mask": tf1.placeholder(tf.int32, [B, S]),
            "masked_lm_positions": tf1.placeholder(tf.int32, [B, P]),
            "masked_lm_ids": tf1.placeholder(tf.int32, [B, P]),
            "masked_lm_weights": tf1.placeholder(tf.float32, [B, P]),
            "next_sentence_labels": tf1.placeholder(tf.int32, [B, 1]),
        }
        outs = ref_model.forward(w, cfg, ph["input_ids"], ph["segment_ids"], ph["input_mask"], set())
        mlm, nsp = _losses(w, cfg, outs, ph["masked_lm_positions"], ph["masked_lm_ids"], ph["masked_lm_weights"],
                           ph["next_sentence_labels"], B, S)
        loss = mlm + nsp
        names = [n for n, _, _ in specs]
        tvars = [w[n] for n in names]
        grads = [tf.convert_to_tensor(g) for g in tf.gradients(loss, tvars)]  # IndexedSlices -> dense
        clipped, grad_norm = tf.clip_by_global_norm(grads, clip_norm=clip_norm)
        lr = _learning_rate(global_step, init_lr, num_train_steps, num_warmup_steps, end_lr, power)
        updates = []
        for name, g, p in zip(names, clipped, tvars):
            m, v = slots[(name, "adam_m")], slots[(name, "adam_v")]
            next_m = tf.multiply(beta_1, m) + tf.multiply(1.0 - beta_1, g)
            next_v = tf.multiply(beta_2, v) + tf.multiply(1.0 - beta_2, tf.square(g))
            update = next_m / (tf.sqrt(next_v) + epsilon)
            if weight_decay_rate and not any(re.search(r, name) for r in exclude_from_weight_decay):
                update += weight_decay_rate * p
            next_p = p - lr * update
            updates.extend([p.assign(next_p), m.assign(next_m), v.assign(next_v)])
        with tf.control_dependencies(updates):
            train_op = global_step.assign(global_step + 1)

        restore = {n: w[n] for n in names}
        zero_init = []
        for (name, slot), var in slots.items():
            if f"{name}/{slot}" in stored:
                restore[f"{name}/{slot}"] = var
            else:
                zero_init.append(var)
        if "global_step" in stored:
            restore["global_step"] = global_step
        else:
            zero_init.append(global_step)
        saver = tf1.train.Saver(var_list=restore)
        out = {k: [] for k in ("loss", "mlm_loss", "nsp_loss", "lr", "global_step", "grad_norm")}
        with ref_ckpt.session(graph) as sess:
            saver.restore(sess, prefix)
            if zero_init:
                sess.run(tf1.variables_initializer(zero_init))
            for batch in batches:
                feed = {ph[k]: v for k, v in _batch_feed(batch).items()}
                step_before = int(sess.run(global_step))
                vals = sess.run({"loss": loss, "mlm_loss": mlm, "nsp_loss": nsp, "lr": lr, "grad_norm": grad_norm,
                                 "_": train_op}, feed_dict=feed)
                for k in ("loss", "mlm_loss", "nsp_loss", "lr", "grad_norm"):
                    out[k].append(float(vals[k]))
                out["global_step"].append(step_before)
            if return_weights:
                out["weights"] = {n: np.asarray(v) for n, v in zip(names, sess.run(tvars))}
    return out
