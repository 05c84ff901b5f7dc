"""LiBai's BERT (``libai/models/bert_model.py``: BertModel, BertForPreTraining, BertForClassification).

LiBai saves ``output_dir/model_final/model/`` (and ``model_XXXXXXX/model/``) with
``flow.save(state_dict, dir, global_dst_rank=0)`` (``global_tensor_N/`` folders) and dumps the run's
config as ``output_dir/config.yaml``; its ``model.cfg`` holds the model's settings
(:mod:`converters.formats.oneflow_native.config`).

Names (Linear weights [out, in] as everywhere in OneFlow):

| LiBai | canonical |
|---|---|
| ``bert.embeddings.vocab_embeddings.weight`` | ``bert.embeddings.word_embeddings.weight`` |
| ``bert.embeddings.{position,tokentype}_embeddings.weight`` | ``...position_embeddings`` / ``token_type_embeddings`` |
| ``bert.encoders.{i}.self_attention.query_key_value`` [3H, H] / [3H] | ``...layer.{i}.attention.self.{query,key,value}`` |
| ``bert.encoders.{i}.self_attention.dense`` | ``...attention.output.dense`` |
| ``bert.encoders.{i}.post_attention_layernorm`` | ``...attention.output.LayerNorm`` |
| ``bert.encoders.{i}.mlp.dense_h_to_4h`` / ``dense_4h_to_h`` | ``...intermediate.dense`` / ``...output.dense`` |
| ``bert.encoders.0.input_layernorm`` | ``bert.embeddings.LayerNorm`` |
| ``bert.encoders.{i}.input_layernorm``, i >= 1 | ``bert.encoder.layer.{i-1}.output.LayerNorm`` |
| ``bert.final_layernorm`` | ``bert.encoder.layer.{L-1}.output.LayerNorm`` |
| ``cls_head.predictions.dense`` / ``.layernorm`` | ``cls.predictions.transform.dense`` / ``.LayerNorm`` |
| ``cls_head.lm_logits.bias`` (decoder = vocab embeddings) | ``cls.predictions.bias`` |
| ``cls_head.seq_relationship``, ``classifier`` | ``cls.seq_relationship``, ``classifier`` |

The fused QKV interleaves per head: its forward views the [B, S, 3H] output as [B, S, heads,
3*head_size] and chunks the last axis into q, k, v, so the weight's rows are [heads, 3, head_size]
(bias likewise); split and joined exactly so (``_split``, ``_join``).

The LayerNorm shift (LiBai's own HF loader shifts the same way): each LiBai layer normalises its
input (``input_layernorm``) and its attention output (``post_attention_layernorm``);
``final_layernorm`` closes the stack. With ``apply_residual_post_layernorm=True`` the residual is
taken after each norm, which is original BERT with the norms one place later; with ``False`` (LiBai's
BertModel default and its pretraining config) the residual skips the norms: a pre-LN network, kept
as such (``layernorm_placement: "pre"`` in bert_of's config, computed by bert_of's BertModel) and
refused by every original-BERT format.

Numerics: erf GELU (``nn.GELU`` / ``fused_bias_add_gelu``), ``layernorm_eps`` from the cfg in the
encoder and the final norm, but the MLM head's LayerNorm always at LiBai's default 1e-5
(``head_layer_norm_eps``); ``apply_query_key_layer_scaling`` (scores / (sqrt(D) (i+1)), then * (i+1))
computed in that order. LiBai's mask is ``mask_i * mask_j`` ([B, 1, S, S]): padded *query* rows are
masked too, so its outputs at padding positions (which nothing reads) differ from bert_of's;
every real token's output is the same function.
"""

from __future__ import annotations

import re

import numpy as np

from bert_of.tensors import expected_shapes
from bert_of.converters.formats.oneflow_native import steps as native
from bert_of.converters.source import Source
from bert_of.converters.mapping import Table
from bert_of.converters.formats.oneflow_native.steps import PARAM, Layout
from bert_of.converters.reader import Hit
from bert_of.converters.descriptor import Format
from bert_of.converters.verify import reference_np
from bert_of.converters.formats.oneflow_native.config import libai_cfg_of

NAME = "libai"

_E, _C = "bert.encoders.{i}", "bert.encoder.layer.{i}"


def _wb(a, b):
    return [(f"{a}.weight", f"{b}.weight"), (f"{a}.bias", f"{b}.bias")]


TABLE = Table([
    ("bert.embeddings.vocab_embeddings.weight", "bert.embeddings.word_embeddings.weight"),
    ("bert.embeddings.position_embeddings.weight", "bert.embeddings.position_embeddings.weight"),
    ("bert.embeddings.tokentype_embeddings.weight", "bert.embeddings.token_type_embeddings.weight"),
    *_wb(f"{_E}.self_attention.dense", f"{_C}.attention.output.dense"),
    *_wb(f"{_E}.post_attention_layernorm", f"{_C}.attention.output.LayerNorm"),
    *_wb(f"{_E}.mlp.dense_h_to_4h", f"{_C}.intermediate.dense"),
    *_wb(f"{_E}.mlp.dense_4h_to_h", f"{_C}.output.dense"),
    *_wb("bert.pooler.dense", "bert.pooler.dense"),
    *_wb("cls_head.predictions.dense", "cls.predictions.transform.dense"),
    *_wb("cls_head.predictions.layernorm", "cls.predictions.transform.LayerNorm"),
    *_wb("cls_head.seq_relationship", "cls.seq_relationship"),
    ("cls_head.lm_logits.bias", "cls.predictions.bias"),
    *_wb("classifier", "classifier"),
])
_INPUT_LN = re.compile(r"^bert\.encoders\.(\d+)\.input_layernorm\.(weight|bias)$")
_FINAL_LN = re.compile(r"^bert\.final_layernorm\.(weight|bias)$")
_QKV = re.compile(r"^bert\.encoders\.(\d+)\.self_attention\.query_key_value\.(weight|bias)$")
_OUT_LN = re.compile(r"^bert\.encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)$")
_NOTE_SHIFT = "LayerNorm shifted one place (LiBai normalises each layer's input)"


def _split(config):
    N, D = config.num_attention_heads, config.head_dim

    def split(arr, j):  # fused rows are [heads, 3, head_size]
        rest = arr.shape[1:]
        return np.ascontiguousarray(arr.reshape((N, 3, D) + rest)[:, j]).reshape((N * D,) + rest)

    return split


def _join(config):
    N, D = config.num_attention_heads, config.head_dim

    def join(parts):
        rest = parts[0].shape[1:]
        return np.ascontiguousarray(np.stack([p.reshape((N, D) + rest) for p in parts], axis=1)).reshape(
            (3 * N * D,) + rest)

    return join


def _classify(name, config):
    L = config.num_hidden_layers
    hit = TABLE.to_canonical(name)
    if hit is not None:
        return Hit(hit[0], hit[1])
    m = _QKV.match(name)
    if m:
        i, p = m.groups()
        return Hit(kind="fused", parts=tuple(f"bert.encoder.layer.{i}.attention.self.{x}.{p}" for x in ("query", "key", "value")),
                   split=_split(config), note="fused q,k,v interleaved per head: split")
    m = _INPUT_LN.match(name)
    if m:
        i, p = int(m.group(1)), m.group(2)
        target = "bert.embeddings.LayerNorm" if i == 0 else f"bert.encoder.layer.{i - 1}.output.LayerNorm"
        return Hit(f"{target}.{p}", note=_NOTE_SHIFT)
    m = _FINAL_LN.match(name)
    if m:
        return Hit(f"bert.encoder.layer.{L - 1}.output.LayerNorm.{m.group(1)}", note=_NOTE_SHIFT)
    return None


def _libai_name(n, config):
    """canonical -> LiBai name (None for q/k/v, written fused)."""
    L = config.num_hidden_layers
    if n.startswith("bert.embeddings.LayerNorm."):
        return "bert.encoders.0.input_layernorm." + n.rsplit(".", 1)[1]
    m = _OUT_LN.match(n)
    if m:
        i, p = int(m.group(1)), m.group(2)
        return f"bert.final_layernorm.{p}" if i == L - 1 else f"bert.encoders.{i + 1}.input_layernorm.{p}"
    hit = TABLE.from_canonical(n)
    return hit[0] if hit else None


def _items(names, config, bare):
    order = {n: i for i, n in enumerate(expected_shapes(config))}
    names = set(names)
    rows = []  # (LiBai name, row)
    done = set()
    join = _join(config)
    for n in sorted(names, key=lambda n: order.get(n, len(order))):
        m = re.match(r"^bert\.encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)$", n)
        if m:
            i, _, p = m.groups()
            if (i, p) in done:
                continue
            done.add((i, p))
            parts = tuple(f"bert.encoder.layer.{i}.attention.self.{x}.{p}" for x in ("query", "key", "value"))
            rows.append((f"bert.encoders.{i}.self_attention.query_key_value.{p}", ("fused", parts, join)))
            continue
        if n.startswith("bert.pooler.") and _no_pooler(config):
            rows.append((None, ("skip", n)))
            continue
        key = _libai_name(n, config)
        if key is None:
            continue  # left uncovered: native.write_files names it
        rows.append((key, ("canonical", n, None)))
    rows.sort(key=lambda r: _libai_order(r[0] or ""))
    return [(k[len("bert."):] if bare and k else k, PARAM, row) for k, row in rows]


def _no_pooler(config):
    """``add_pooling_layer: false``: LiBai's BertModel then has no ``pooler``."""
    libai = config.extra.get("libai")
    return isinstance(libai, dict) and libai.get("add_pooling_layer") is False


_SUB = ["input_layernorm", "self_attention.query_key_value", "self_attention.dense", "post_attention_layernorm",
        "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"]


def _libai_order(key):
    """The order LiBai's modules list their parameters in (what its own state_dict() gives)."""
    m = re.match(r"^bert\.encoders\.(\d+)\.(.+)\.(weight|bias)$", key)
    if m:
        return (1, int(m.group(1)), _SUB.index(m.group(2)) if m.group(2) in _SUB else 99, m.group(3) == "bias")
    for rank, prefix in enumerate(("bert.embeddings.vocab", "bert.embeddings.position", "bert.embeddings.tokentype")):
        if key.startswith(prefix):
            return (0, rank, 0, False)
    rest = ["bert.final_layernorm", "bert.pooler", "cls_head.predictions.dense", "cls_head.predictions.layernorm",
            "cls_head.seq_relationship", "cls_head.lm_logits", "classifier"]
    for rank, prefix in enumerate(rest):
        if key.startswith(prefix):
            return (2, rank, 0, key.endswith("bias"))
    return (3, 0, 0, False)


def _write_notes(source: Source) -> list:
    """Where LiBai's own BERT computes otherwise than this checkpoint."""
    notes = []
    c = source.config
    if c.hidden_act != "gelu_erf":
        notes.append(f"note: LiBai's BERT computes gelu_erf (this checkpoint: {c.hidden_act})")
    if "cls.predictions.bias" in source.names() and c.head_eps != 1e-5:
        notes.append(f"note: LiBai's MLM head LayerNorm uses eps 1e-05 (this checkpoint: {c.head_eps:g})")
    return notes


LAYOUT = Layout(NAME, ("embeddings", "encoders", "final_layernorm", "pooler"), _classify, _items, libai_cfg_of,
                "LiBai BERT (BertModel / BertForPreTraining / BertForClassification)", _no_pooler, _write_notes, TABLE)
detect, read, write_files = native.format_functions(LAYOUT)


FORMAT = Format(NAME, "LiBai BERT saved by flow.save (model_final/model/ + the run's config.yaml)",
                detect, read, write_files, reference_np.LiBai, owns=native.OWNS, pre_ln=True, records_numerics=True,
                table=TABLE, dtypes=native.DTYPES)
