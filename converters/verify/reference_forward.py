"""verify's float64 NumPy BERT: the forward maths, on a layout's weights.

Written from the math of the BERT paper, sharing no code with ``bert_of.modeling``: embeddings
(word + type + position, LayerNorm), the encoder, the pooler and the heads, in float64 with libm's
erf. The weights come from a ``reference_np.Layout`` (``converters/verify/reference_np.py``: each
codebase's names, orientation and numerics).

Post-LN encoder as in the paper: ``x = LN(x + Attn(x)); x = LN(x + FFN(x))``. A layout may set
``pre_ln`` (``x = x + Attn(LN(x))``, a final LN) and override :meth:`Layout.qkv` (a fused
per-head QKV weight, as LiBai stores it): the forward asks the layout, never a name. LiBai's own
placement (``placement = "libai"``: input and post-attention LayerNorms, a final one) is
``_forward_libai``.
"""

from __future__ import annotations

import math

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)  # libm's erf, element by element: exact, no approximation


def gelu_erf(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


ACTIVATIONS = {"gelu_erf": gelu_erf, "gelu_tanh": gelu_tanh, "relu": lambda x: np.maximum(x, 0.0),
               "tanh": np.tanh, "silu": lambda x: x / (1.0 + np.exp(-x)), "linear": lambda x: x}


def layer_norm(x, gamma, beta, eps):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (biased variance)."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def forward(layout, batch: dict, num_heads: int) -> dict:
    """BERT on int [B, S] input_ids / token_type_ids / attention_mask, in float64.

    Returns the outputs the checkpoint has heads for: sequence_output [B, S, H], pooled_output
    [B, H], prediction_logits [B, S, V] (MLM on every position), seq_relationship_logits [B, 2],
    start_logits / end_logits [B, S], logits [B, L] (a token classifier: [B, S, L])."""
    ids, types, mask = (np.asarray(batch[k]) for k in ("input_ids", "token_type_ids", "attention_mask"))
    if layout.placement == "libai":  # a codebase whose placement is its own
        return _forward_libai(layout, batch, num_heads)
    B, S = ids.shape
    act, eps = ACTIVATIONS[layout.act], layout.eps
    word = layout.vector("word")
    x = word[ids] + layout.vector("type")[types] + layout.positions()[:S][None]
    x = layer_norm(x, *layout.ln("emb_ln"), eps)
    adder = (1.0 - mask[:, None, None, :].astype(np.float64)) * layout.mask_value  # [B, 1, 1, S]
    i = 0
    while layout.stored("q.w", i) is not None or layout.stored("qkv.w", i) is not None:
        x = _layer(layout, i, x, adder, num_heads, act, eps)
        i += 1
    if layout.pre_ln:
        x = layer_norm(x, *layout.ln("final_ln"), eps)
    head_eps = getattr(layout, "head_eps", None)  # the MLM head's own epsilon, where the layout has one
    return heads_of(layout, x, word, act, eps if head_eps is None else head_eps)


def heads_of(layout, x, word, act, head_eps: float) -> dict:
    """The outputs the checkpoint has heads for, from the encoder's output ``x`` [B, S, H]."""
    out = {"sequence_output": x}
    pooled = None
    if layout.has("pool.w"):
        w, b = layout.dense("pool")
        pooled = out["pooled_output"] = np.tanh(x[:, 0] @ w + b)
    if layout.has("mlm.w"):
        w, b = layout.dense("mlm")
        h = layer_norm(act(x @ w + b), *layout.ln("mlm_ln"), head_eps)
        out["prediction_logits"] = h @ word.T + layout.vector("mlm_bias")  # decoder tied to the embeddings
    if layout.has("nsp.w") and pooled is not None:
        w, b = layout.dense("nsp")
        out["seq_relationship_logits"] = pooled @ w + b
    if layout.has("qa.w"):
        w, b = layout.dense("qa")
        logits = x @ w + b
        out["start_logits"], out["end_logits"] = logits[..., 0], logits[..., 1]
    if layout.has("clf.w") and layout.token_classifier():  # every position (no pooler read)
        w, b = layout.dense("clf")
        out["logits"] = x @ w + b
    elif layout.has("clf.w") and pooled is not None:
        w, b = layout.dense("clf")
        out["logits"] = pooled @ w + b
    return out


def _layer(layout, i, x, adder, num_heads, act, eps):
    """One encoder layer: attention (softmax(q k^T / sqrt(d) + mask) v), then the FFN."""
    B, S, H = x.shape
    d = H // num_heads

    def heads(t):  # [B, S, H] -> [B, N, S, d]
        return t.reshape(B, S, num_heads, d).transpose(0, 2, 1, 3)

    h = layer_norm(x, *layout.ln("ao_ln", i), eps) if layout.pre_ln else x
    (wq, bq), (wk, bk), (wv, bv) = layout.qkv(i)
    q, k, v = heads(h @ wq + bq), heads(h @ wk + bk), heads(h @ wv + bv)
    probs = softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + adder)
    ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(B, S, H)
    w, b = layout.dense("ao", i)
    a = ctx @ w + b
    if layout.pre_ln:
        x = x + a
        h = layer_norm(x, *layout.ln("out_ln", i), eps)
    else:
        x = h = layer_norm(a + x, *layout.ln("ao_ln", i), eps)
    w, b = layout.dense("in", i)
    inter = act(h @ w + b)
    w, b = layout.dense("out", i)
    f = inter @ w + b
    return x + f if layout.pre_ln else layer_norm(f + x, *layout.ln("out_ln", i), eps)


def _forward_libai(layout, batch: dict, num_heads: int) -> dict:
    """LiBai's BertModel (``reference_np.LiBai``'s docstring: its LayerNorm placement) on the batch."""
    ids, types, mask = (np.asarray(batch[k]) for k in ("input_ids", "token_type_ids", "attention_mask"))
    B, S = ids.shape
    act, eps = ACTIVATIONS[layout.act], layout.eps
    word = layout.vector("word")
    x = word[ids] + layout.vector("type")[types] + layout.positions()[:S][None]
    adder = (1.0 - mask[:, None, None, :].astype(np.float64)) * -10000.0
    i = 0
    while layout.stored("qkv.w", i) is not None:
        H = x.shape[-1]
        d = H // num_heads
        ln_in = layer_norm(x, *layout.ln("in_ln", i), eps)
        (wq, bq), (wk, bk), (wv, bv) = layout.qkv(i, num_heads)

        def heads(t):
            return t.reshape(B, S, num_heads, d).transpose(0, 2, 1, 3)

        q, k, v = heads(ln_in @ wq + bq), heads(ln_in @ wk + bk), heads(ln_in @ wv + bv)
        probs = softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + adder)
        w, b = layout.dense("ao", i)
        attn = (probs @ v).transpose(0, 2, 1, 3).reshape(B, S, H) @ w + b
        x = (ln_in if layout.residual_post_ln else x) + attn
        ln_pa = layer_norm(x, *layout.ln("pa_ln", i), eps)
        w1, b1 = layout.dense("in", i)
        w2, b2 = layout.dense("out", i)
        x = (ln_pa if layout.residual_post_ln else x) + act(ln_pa @ w1 + b1) @ w2 + b2
        i += 1
    return heads_of(layout, layer_norm(x, *layout.ln("final_ln"), eps), word, act, layout.head_eps)
