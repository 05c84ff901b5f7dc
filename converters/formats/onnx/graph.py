"""BERT's forward as an ONNX graph: the nodes, inputs and outputs of2onnx writes for a
config and a set of heads, and what onnx2of checks a file's graph against.

The graph (opset 14; every op in the default domain; docs/formats-onnx.md):

- inputs ``input_ids``, ``attention_mask``, ``token_type_ids``: int64 [batch, sequence] (both axes
  named, so any batch and any length up to max_position_embeddings run);
- embeddings: Gather of the word and token-type tables plus the first ``sequence`` rows of the
  position table (Slice by the input's Shape), then LayerNorm;
- the mask adder ``(1 - mask) * -10000`` [batch, 1, 1, sequence], bert_of's (Google's) constant;
- per layer: q, k, v as MatMul + Add, heads by Reshape [0, 0, N, d] + Transpose, scores
  ``q k^T / sqrt(d) + adder``, Softmax over the last axis, context back to [batch, sequence, H],
  the output dense, ``LN(x + attention)``, the FFN with the config's activation, ``LN(x + ffn)``;
- LayerNorm decomposed (ReduceMean, Sub, Mul, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add
  beta; LayerNormalization is opset 17), with the config's epsilon (the MLM head's own epsilon
  when the config has one); GELU decomposed exactly as the config names it (``gelu_erf``:
  ``0.5 x (1 + erf(x / sqrt 2))``; ``gelu_tanh``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``),
  ``relu``, ``tanh``, ``silu`` (``x sigmoid(x)``), ``linear``;
- outputs named as transformers names them: ``last_hidden_state`` [batch, sequence, H],
  ``pooler_output`` [batch, H] (when the checkpoint has a pooler: not the zeros a reader filled
  in for transformers' QA, token-classifier and MLM classes, which have none), ``prediction_logits``
  [batch, sequence, V] and ``seq_relationship_logits`` [batch, 2] (MLM / NSP heads; the decoder is
  the word embeddings, transposed in the graph, one initializer; an MLM head alone, transformers'
  BertForMaskedLM, names its output ``logits``), ``start_logits`` /
  ``end_logits`` [batch, sequence] (QA), ``logits`` [batch, L] (sequence classifier, on the
  pooled output) or [batch, sequence, L] (token classifier).

The weights are the graph's initializers, named as converters/formats/onnx/'s TABLE spells them.
Float16 initializers (``of2onnx --dtype float16``: half the file) are read through one Cast to
float32 each, placed before the first node using it (output ``<name>:float32``): the graph computes
in float32 either way, and its inputs and outputs are the same.
"""

from __future__ import annotations

import math

import numpy as np

from bert_of.config import BertConfig
from bert_of.errors import ConfigError
from bert_of.tensors import SCOPES
from bert_of.converters.containers.onnx_proto import FLOAT, INT64, attribute, len_field, value_info

OPSET = 14
# The engine's fused graph (``fused=True``, never written to a file): LayerNormalization is opset 17's,
# Attention / SkipLayerNormalization / BiasGelu / FastGelu onnxruntime's contrib domain (version 1)
FUSED_OPSET = 17
CONTRIB = "com.microsoft"
INT32 = 6  # TensorProto.DataType: the contrib Attention's mask is int32
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MASK_VALUE = -10000.0


class Graph:
    """Nodes of a graph under construction: ``op`` appends one and returns its output's name."""

    def __init__(self, weights: int = FLOAT):
        self.nodes, self._count = [], 0
        self.weights = weights  # the initializers' data type: FLOAT, or FLOAT16 read through Casts
        self._cast: dict = {}  # float16 initializer -> its float32 Cast's output

    def w(self, name: str) -> str:
        """The float32 value of the initializer ``name``: itself, or (float16) its Cast's output."""
        if self.weights == FLOAT:
            return name
        if name not in self._cast:
            self._cast[name] = self.op("Cast", name, out=name + ":float32", to=FLOAT)
        return self._cast[name]

    def op(self, op_type: str, *inputs: str, out: str | None = None, domain: str = "", **attrs) -> str:
        """NodeProto: input (1), output (2), name (3), op_type (4), attribute (5), domain (7: onnxruntime's
        contrib ops only; the default domain otherwise, as of2onnx writes)."""
        self._count += 1
        name = f"{op_type}_{self._count}"
        out = out or name
        self.nodes.append(b"".join(len_field(1, i) for i in inputs) + len_field(2, out) + len_field(3, name) + len_field(4, op_type)
                          + b"".join(len_field(5, attribute(k, v)) for k, v in attrs.items())
                          + (len_field(7, domain) if domain else b""))
        return out

    def const(self, value, dtype=np.float32) -> str:
        return self.op("Constant", value=np.asarray(value, dtype))

    def dense(self, x: str, scope: str, out: str | None = None) -> str:
        return self.op("Add", self.op("MatMul", x, self.w(scope + ".kernel")), self.w(scope + ".bias"), out=out)

    def layer_norm(self, x: str, scope: str, eps: float, out: str | None = None) -> str:
        """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (biased variance)."""
        centred = self.op("Sub", x, self.op("ReduceMean", x, axes=[-1], keepdims=1))
        var = self.op("ReduceMean", self.op("Mul", centred, centred), axes=[-1], keepdims=1)
        normed = self.op("Div", centred, self.op("Sqrt", self.op("Add", var, self.const(eps))))
        return self.op("Add", self.op("Mul", normed, self.w(scope + ".LayerNorm.weight")),
                       self.w(scope + ".LayerNorm.bias"), out=out)

    def fused_layer_norm(self, x: str, scope: str, eps: float, out: str | None = None) -> str:
        """The same LayerNorm as one LayerNormalization node (opset 17; the fused graph's)."""
        return self.op("LayerNormalization", x, self.w(scope + ".LayerNorm.weight"), self.w(scope + ".LayerNorm.bias"),
                       out=out, axis=-1, epsilon=eps)

    def skip_layer_norm(self, x: str, dense: str, skip: str, scope: str, eps: float, out: str | None = None) -> str:
        """LN(x @ kernel + bias + skip) with the add, the bias and the LayerNorm in one contrib
        SkipLayerNormalization (the fused graph's residual + LayerNorm)."""
        return self.op("SkipLayerNormalization", self.op("MatMul", x, self.w(dense + ".kernel")), skip,
                       self.w(scope + ".LayerNorm.weight"), self.w(scope + ".LayerNorm.bias"), self.w(dense + ".bias"),
                       out=out, domain=CONTRIB, epsilon=eps)

    def dense_activation(self, x: str, scope: str, act: str, fused: bool) -> str:
        """act(x @ kernel + bias); fused: the bias and the GELU in one contrib node, the same GELU
        (BiasGelu is erf GELU, FastGelu tanh GELU: each the formula the config names)."""
        if fused and act in ("gelu_erf", "gelu_tanh"):
            return self.op("BiasGelu" if act == "gelu_erf" else "FastGelu", self.op("MatMul", x, self.w(scope + ".kernel")),
                           self.w(scope + ".bias"), domain=CONTRIB)
        return self.activation(self.dense(x, scope), act)

    def activation(self, x: str, act: str) -> str:
        if act == "gelu_erf":
            erf = self.op("Erf", self.op("Div", x, self.const(math.sqrt(2.0))))
            return self.op("Mul", self.op("Mul", x, self.op("Add", erf, self.const(1.0))), self.const(0.5))
        if act == "gelu_tanh":
            cube = self.op("Mul", self.op("Mul", x, x), x)
            inner = self.op("Mul", self.op("Add", x, self.op("Mul", cube, self.const(0.044715))),
                            self.const(math.sqrt(2.0 / math.pi)))
            return self.op("Mul", self.op("Mul", x, self.op("Add", self.op("Tanh", inner), self.const(1.0))),
                           self.const(0.5))
        if act == "relu":
            return self.op("Relu", x)
        if act == "tanh":
            return self.op("Tanh", x)
        if act == "silu":
            return self.op("Mul", x, self.op("Sigmoid", x))
        if act == "linear":
            return x
        raise ConfigError(f"config: hidden_act {act!r} has no ONNX graph")


def heads_of(names) -> dict:
    """{group: True} of the head groups (pooler, mlm, nsp, qa, classifier) a checkpoint's
    canonical names have."""
    names = set(names)
    return {group: any(n.startswith(scope + ".") for n in names for scope, _, _, g in SCOPES if g == group)
            for group in ("pooler", "mlm", "nsp", "qa", "classifier")}


MLM_ONLY_OUTPUT = "logits"


def mlm_only(heads: dict) -> bool:
    """An MLM head and no other (transformers' BertForMaskedLM, whose output is ``logits``)."""
    return heads["mlm"] and not (heads["nsp"] or heads["qa"] or heads["classifier"])


def build_graph(config: BertConfig, heads: dict, weights: int = FLOAT, fused: bool = False) -> tuple:
    """(Graph, [(output name, dims)]): BERT's forward on the weights' initializer names
    (``weights``: their data type, FLOAT or FLOAT16). ``fused``: the same function in onnxruntime's
    fused ops (``--engine onnxruntime``'s graph, never written to a file: :func:`fused_io`):
    LayerNormalization; per layer one contrib Attention (q, k, v in one [H, 3H] GEMM: the kernels
    joined by a Concat onnxruntime folds at load; the mask as int32 [B, S], masked scores
    ``-10000``, as the adder here), SkipLayerNormalization for each residual + bias + LayerNorm,
    BiasGelu / FastGelu for an erf / tanh GELU."""
    g = Graph(weights)
    H, act, eps = config.hidden_size, config.hidden_act, float(config.layer_norm_eps)
    ids, mask, types = INPUTS
    length = g.op("Slice", g.op("Shape", ids), g.const([1], np.int64), g.const([2], np.int64))  # [S]
    positions = g.op("Slice", g.w("bert.embeddings.position_embeddings.weight"), g.const([0], np.int64), length,
                     g.const([0], np.int64))  # the first S rows [S, H]
    x = g.op("Add", g.op("Add", g.op("Gather", g.w("bert.embeddings.word_embeddings.weight"), ids),
                         g.op("Gather", g.w("bert.embeddings.token_type_embeddings.weight"), types)), positions)
    layer_norm = g.fused_layer_norm if fused else g.layer_norm
    x = layer_norm(x, "bert.embeddings", eps)
    outputs = [("last_hidden_state", ("batch", "sequence", H))]
    if fused:
        x = _fused_layers(g, config, x, mask)
    else:
        x = _layers(g, config, x, mask)
    if config.num_hidden_layers == 0:  # no layer produced it
        x = g.op("Identity", x, out="last_hidden_state")
    pooled = None
    if heads["pooler"]:
        first = g.op("Gather", x, g.const(0, np.int64), axis=1)  # [B, H]
        pooled = g.op("Tanh", g.dense(first, "bert.pooler.dense"), out="pooler_output")
        outputs.append(("pooler_output", ("batch", H)))
    if heads["mlm"]:
        h = g.dense_activation(x, "cls.predictions.transform.dense", act, fused)
        h = layer_norm(h, "cls.predictions.transform", float(config.head_eps))
        decoder = g.op("Transpose", g.w("bert.embeddings.word_embeddings.weight"), perm=[1, 0])  # tied: [H, V]
        name = MLM_ONLY_OUTPUT if mlm_only(heads) else "prediction_logits"  # transformers' BertForMaskedLM: logits
        g.op("Add", g.op("MatMul", h, decoder), g.w("cls.predictions.bias"), out=name)
        outputs.append((name, ("batch", "sequence", config.vocab_size)))
    if heads["nsp"] and pooled:
        g.dense(pooled, "cls.seq_relationship", out="seq_relationship_logits")
        outputs.append(("seq_relationship_logits", ("batch", 2)))
    if heads["qa"]:
        logits = g.dense(x, "qa_outputs")  # [B, S, 2]
        for j, name in enumerate(("start_logits", "end_logits")):
            g.op("Gather", logits, g.const(j, np.int64), axis=2, out=name)
            outputs.append((name, ("batch", "sequence")))
    if heads["classifier"] and config.classifier_kind == "token":
        g.dense(x, "classifier", out="logits")
        outputs.append(("logits", ("batch", "sequence", config.num_labels)))
    elif heads["classifier"] and pooled:
        g.dense(pooled, "classifier", out="logits")
        outputs.append(("logits", ("batch", config.num_labels)))
    return g, outputs


def _fused_layers(g: Graph, config: BertConfig, x: str, mask: str) -> str:
    """The encoder layers of :func:`_layers` in onnxruntime's fused ops (:func:`build_graph`)."""
    N, act, eps = config.num_attention_heads, config.hidden_act, float(config.layer_norm_eps)
    mask32 = g.op("Cast", mask, to=INT32)  # [B, S]: 1 attends, 0 masked (-10000 added to its scores)
    for i in range(config.num_hidden_layers):
        s = f"bert.encoder.layer.{i}."
        qkv = [s + "attention.self." + n for n in ("query", "key", "value")]
        kernel = g.op("Concat", *(g.w(p + ".kernel") for p in qkv), axis=1)  # [H, 3H]
        bias = g.op("Concat", *(g.w(p + ".bias") for p in qkv), axis=0)  # [3H]
        context = g.op("Attention", x, kernel, bias, mask32, domain=CONTRIB, num_heads=N,
                       mask_filter_value=MASK_VALUE)  # [B, S, H]
        x = g.skip_layer_norm(context, s + "attention.output.dense", x, s + "attention.output", eps)
        inter = g.dense_activation(x, s + "intermediate.dense", act, True)
        last = i == config.num_hidden_layers - 1
        x = g.skip_layer_norm(inter, s + "output.dense", x, s + "output", eps, out="last_hidden_state" if last else None)
    return x


def _layers(g: Graph, config: BertConfig, x: str, mask: str) -> str:
    """The encoder layers as of2onnx writes them (:func:`build_graph`'s docstring): [B, S, H] -> [B, S, H]."""
    H, N = config.hidden_size, config.num_attention_heads
    d = H // N
    act, eps = config.hidden_act, float(config.layer_norm_eps)
    keep = g.op("Cast", mask, to=FLOAT)
    adder = g.op("Mul", g.op("Sub", g.const(1.0), keep), g.const(MASK_VALUE))
    adder = g.op("Unsqueeze", adder, g.const([1, 2], np.int64))  # [B, 1, 1, S]
    split, merge, scale = g.const([0, 0, N, d], np.int64), g.const([0, 0, H], np.int64), g.const(math.sqrt(d))
    for i in range(config.num_hidden_layers):
        s = f"bert.encoder.layer.{i}."
        q, k, v = (g.op("Reshape", g.dense(x, s + "attention.self." + n), split) for n in ("query", "key", "value"))
        q, k, v = g.op("Transpose", q, perm=[0, 2, 1, 3]), g.op("Transpose", k, perm=[0, 2, 3, 1]), \
            g.op("Transpose", v, perm=[0, 2, 1, 3])  # [B, N, S, d], k as [B, N, d, S]
        scores = g.op("Add", g.op("Div", g.op("MatMul", q, k), scale), adder)
        context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), merge)  # [B, S, H]
        x = g.layer_norm(g.op("Add", g.dense(context, s + "attention.output.dense"), x), s + "attention.output", eps)
        inter = g.activation(g.dense(x, s + "intermediate.dense"), act)
        last = i == config.num_hidden_layers - 1
        x = g.layer_norm(g.op("Add", g.dense(inter, s + "output.dense"), x), s + "output", eps,
                         out="last_hidden_state" if last else None)
    return x


def graph_io(config: BertConfig, heads: dict, weights: int = FLOAT, fused: bool = False) -> tuple:
    """(nodes, inputs, outputs) as of2onnx writes them (``fused``: the engine's fused graph, the same
    inputs and outputs), each a list of serialized messages; the inputs and outputs are the same
    whatever the initializers' data type ``weights``."""
    graph, outputs = build_graph(config, heads, weights, fused)
    return (graph.nodes, [value_info(n, INT64, ("batch", "sequence")) for n in INPUTS],
            [value_info(n, FLOAT, dims) for n, dims in outputs])
