"""ONNX (``model.onnx``): BERT as a self-contained inference graph, written by bert_of and read back.

``of2onnx`` writes a folder: ``model.onnx`` (the graph, every weight as an initializer, the
bert_of config in the model's metadata) and ``vocab.txt``. The protobuf is written with
``bert_of.protobuf``'s field writer (no ``onnx`` package); ``onnx2of`` walks it as data and reads
back only what ``of2onnx`` wrote (producer ``bert_of``, its graph exactly the one of2onnx writes
for the config and weights it holds): any other ONNX file is refused in one line.

The graph (opset 14, IR version 7; every op in the default domain; docs/formats-onnx.md):

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

Initializers are the canonical tensors under their canonical names, except dense weights, which
MatMul wants [in, out]: ``<scope>.kernel`` holds the transpose of ``<scope>.weight`` (TABLE).
Every initializer is float32, ``raw_data`` little-endian; constants the graph needs are
Constant nodes, so the initializers are exactly the weights.

Size: a protobuf message is at most 2 GB (what onnxruntime and ``onnx`` parse); a model whose
file would be larger is refused before anything is written (BERT-large is 1.3 GB).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct

import numpy as np

from bert_of.config import BertConfig
from bert_of.errors import BertOfError, CheckpointError, ConfigError
from bert_of.files.atomic import writes_to
from bert_of.tensors import SCOPES
from bert_of.checkpoint import copy_file
import bert_of.protobuf as protobuf
from bert_of.protobuf import LEN, VARINT, ProtobufError, key as _key, varint
from bert_of.vocab import read_vocab_lines, vocab_looks_cased
from bert_of.version import __version__
from bert_of.converters import reference_np
from bert_of.converters.descriptor import Format
from bert_of.converters.source import Options, Source, lower_case_of
from bert_of.converters.mapping import Table, apply, inverse, spell
from bert_of.converters.reader import POOLER, Entry, finish, hit, pooler_zeros, sort, whole

NAME = "onnx"
MODEL_FILE = "model.onnx"
VOCAB_FILE = "vocab.txt"
OPSET = 14
IR_VERSION = 7  # ONNX 1.9, the first with opset 14
PRODUCER = "bert_of"
CONFIG_KEY = "bert_of.config"  # metadata_props: the bert_of config (config.json's text)
LOWER_CASE_KEY = "do_lower_case"  # metadata_props: how text is tokenized for this model
MASK_VALUE = -10000.0
PROTOBUF_LIMIT = 2 ** 31 - 1  # protobuf's largest message: what onnxruntime and onnx parse
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# graph output -> the name verify's NumPy reference (and bert_of's model) gives it
REFERENCE_NAMES = {"last_hidden_state": "sequence_output", "pooler_output": "pooled_output"}

# How the initializers spell a scope's parameters: canonical names, dense weights [in, out].
PARAMS = {
    "embedding": [(".weight", ".weight")],
    "dense": [(".kernel", ".weight", "T"), (".bias", ".bias")],
    "ln": [(".LayerNorm.weight", ".LayerNorm.weight"), (".LayerNorm.bias", ".LayerNorm.bias")],
    "bias": [(".bias", ".bias")],
}
TABLE = Table(spell(lambda scope: scope, PARAMS))

# ONNX's enums (onnx.proto): TensorProto.DataType, AttributeProto.AttributeType
FLOAT, INT64 = 1, 7
ATTR_FLOAT, ATTR_INT, ATTR_TENSOR, ATTR_INTS = 1, 2, 4, 7


def _int(field: int, n: int) -> bytes:
    """A varint field written even when zero (ONNX's messages are proto2: a 0 in ``perm`` is data)."""
    return protobuf.field_varint(field, n, always=True)


def _float(field: int, x: float) -> bytes:
    """A float field, written even when zero."""
    return protobuf.field_fixed32(field, struct.unpack("<I", struct.pack("<f", x))[0], always=True)


def _len(field: int, payload) -> bytes:
    """A length-delimited field: a string (UTF-8), bytes or a sub-message."""
    return protobuf.field_bytes(field, payload.encode("utf-8") if isinstance(payload, str) else payload)


# --------------------------------------------------------------------------- ONNX messages


def tensor_proto(name: str, dims, data_type: int, raw: bytes) -> bytes:
    """TensorProto: dims (1), data_type (2), name (8), raw_data (9)."""
    return b"".join(_int(1, d) for d in dims) + _int(2, data_type) + (_len(8, name) if name else b"") + _len(9, raw)


def _attribute(name: str, value) -> bytes:
    """AttributeProto: name (1), f (2) | i (3) | t (5) | ints (8), type (20)."""
    if isinstance(value, np.ndarray):
        return _len(1, name) + _len(5, _constant_tensor(value)) + _int(20, ATTR_TENSOR)
    if isinstance(value, float):
        return _len(1, name) + _float(2, value) + _int(20, ATTR_FLOAT)
    if isinstance(value, int):
        return _len(1, name) + _int(3, value) + _int(20, ATTR_INT)
    return _len(1, name) + b"".join(_int(8, v) for v in value) + _int(20, ATTR_INTS)


def _constant_tensor(value: np.ndarray) -> bytes:
    data_type = {np.dtype(np.float32): FLOAT, np.dtype(np.int64): INT64}[value.dtype]
    return tensor_proto("", value.shape, data_type, value.astype(value.dtype.newbyteorder("<")).tobytes())


def _value_info(name: str, elem_type: int, dims) -> bytes:
    """ValueInfoProto: name (1), type (2) = TypeProto.tensor_type (1) {elem_type (1), shape (2)};
    a dimension is dim_value (1) or dim_param (2)."""
    shape = b"".join(_len(1, _len(2, d) if isinstance(d, str) else _int(1, d)) for d in dims)
    return _len(1, name) + _len(2, _len(1, _int(1, elem_type) + _len(2, shape)))


class Graph:
    """Nodes of a graph under construction: ``op`` appends one and returns its output's name."""

    def __init__(self):
        self.nodes, self._count = [], 0

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """NodeProto: input (1), output (2), name (3), op_type (4), attribute (5)."""
        self._count += 1
        name = f"{op_type}_{self._count}"
        out = out or name
        self.nodes.append(b"".join(_len(1, i) for i in inputs) + _len(2, out) + _len(3, name) + _len(4, op_type)
                          + b"".join(_len(5, _attribute(k, v)) for k, v in attrs.items()))
        return out

    def const(self, value, dtype=np.float32) -> str:
        return self.op("Constant", value=np.asarray(value, dtype))

    def dense(self, x: str, scope: str, out: str | None = None) -> str:
        return self.op("Add", self.op("MatMul", x, scope + ".kernel"), scope + ".bias", out=out)

    def layer_norm(self, x: str, scope: str, eps: float, out: str | None = None) -> str:
        """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (biased variance)."""
        centred = self.op("Sub", x, self.op("ReduceMean", x, axes=[-1], keepdims=1))
        var = self.op("ReduceMean", self.op("Mul", centred, centred), axes=[-1], keepdims=1)
        normed = self.op("Div", centred, self.op("Sqrt", self.op("Add", var, self.const(eps))))
        return self.op("Add", self.op("Mul", normed, scope + ".LayerNorm.weight"), scope + ".LayerNorm.bias", out=out)

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


def build_graph(config: BertConfig, heads: dict) -> tuple:
    """(Graph, [(output name, dims)]): BERT's forward on the weights' initializer names."""
    g = Graph()
    H, N = config.hidden_size, config.num_attention_heads
    d = H // N
    act, eps = config.hidden_act, float(config.layer_norm_eps)
    ids, mask, types = INPUTS
    length = g.op("Slice", g.op("Shape", ids), g.const([1], np.int64), g.const([2], np.int64))  # [S]
    positions = g.op("Slice", "bert.embeddings.position_embeddings.weight", g.const([0], np.int64), length,
                     g.const([0], np.int64))  # the first S rows [S, H]
    x = g.op("Add", g.op("Add", g.op("Gather", "bert.embeddings.word_embeddings.weight", ids),
                         g.op("Gather", "bert.embeddings.token_type_embeddings.weight", types)), positions)
    x = g.layer_norm(x, "bert.embeddings", eps)
    keep = g.op("Cast", mask, to=FLOAT)
    adder = g.op("Mul", g.op("Sub", g.const(1.0), keep), g.const(MASK_VALUE))
    adder = g.op("Unsqueeze", adder, g.const([1, 2], np.int64))  # [B, 1, 1, S]
    split, merge, scale = g.const([0, 0, N, d], np.int64), g.const([0, 0, H], np.int64), g.const(math.sqrt(d))
    outputs = [("last_hidden_state", ("batch", "sequence", H))]
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
    if config.num_hidden_layers == 0:  # no layer produced it
        x = g.op("Identity", x, out="last_hidden_state")
    pooled = None
    if heads["pooler"]:
        first = g.op("Gather", x, g.const(0, np.int64), axis=1)  # [B, H]
        pooled = g.op("Tanh", g.dense(first, "bert.pooler.dense"), out="pooler_output")
        outputs.append(("pooler_output", ("batch", H)))
    if heads["mlm"]:
        h = g.activation(g.dense(x, "cls.predictions.transform.dense"), act)
        h = g.layer_norm(h, "cls.predictions.transform", float(config.head_eps))
        decoder = g.op("Transpose", "bert.embeddings.word_embeddings.weight", perm=[1, 0])  # tied: [H, V]
        name = MLM_ONLY_OUTPUT if mlm_only(heads) else "prediction_logits"  # transformers' BertForMaskedLM: logits
        g.op("Add", g.op("MatMul", h, decoder), "cls.predictions.bias", out=name)
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


def _graph_io(config: BertConfig, heads: dict) -> tuple:
    """(nodes, inputs, outputs) as of2onnx writes them, each a list of serialized messages."""
    graph, outputs = build_graph(config, heads)
    return (graph.nodes, [_value_info(n, INT64, ("batch", "sequence")) for n in INPUTS],
            [_value_info(n, FLOAT, dims) for n, dims in outputs])


# --------------------------------------------------------------------------- writing


def _zero_pooler_unread(source: Source) -> bool:
    """Whether the pooler is the zeros a reader filled in for a model without one (HF's QA, token
    classifier and MLM classes) and no head reads it: then the graph has no pooler_output, as
    transformers' class has none, and onnx2of fills the zeros in again (bit for bit: +0.0 only)."""
    heads = heads_of(source.names())
    reads_pooler = heads["nsp"] or (heads["classifier"] and source.config.classifier_kind != "token")
    if not heads["pooler"] or reads_pooler or not (heads["qa"] or heads["classifier"] or heads["mlm"]):
        return False
    return all(not np.ascontiguousarray(p()).view(np.uint8).any() for s, p in source.tensors if s.name in POOLER)


def _initializers(source: Source, tensors: list) -> list:
    """[(initializer name, dims, header bytes, producer of its raw bytes)] in the Source's order."""
    out = []
    for spec, produce in tensors:
        found = TABLE.from_canonical(spec.name)
        if found is None:
            raise CheckpointError(f"{source.path}: tensor {spec.name} has no place in the ONNX graph")
        name, transform = found
        back = inverse(transform)
        dims = tuple(reversed(spec.shape)) if back == "T" else tuple(spec.shape)
        header = b"".join(_int(1, d) for d in dims) + _int(2, FLOAT) + _len(8, name)
        n = int(np.prod(dims, dtype=np.int64)) * 4

        def raw(produce=produce, back=back, dims=dims, n=n, name=name):
            arr = np.ascontiguousarray(apply(back, np.asarray(produce())), np.dtype("<f4"))
            if arr.shape != dims or arr.nbytes != n:  # the Source's producers are checked; this is ours
                raise AssertionError(f"{name}: {arr.shape} is not {dims}")
            return arr.tobytes()
        out.append((name, dims, header, n, raw))
    return out


def write_files(source: Source, d: str, opts: Options) -> list:
    """``model.onnx`` (+ ``vocab.txt``) into the directory ``d``, one tensor in memory at a time."""
    config = source.config
    notes = []
    if config.query_key_layer_scaling:
        notes.append("note: query-key layer scaling not recorded in the graph (the same function; LiBai's fp32 "
                     "rounding differs by ~1e-7)")
    if any(np.dtype(s.dtype) != np.float32 for s, _ in source.tensors):
        notes.append("note: the ONNX graph computes in float32: the weights are written as float32 (widened exactly)")
    tensors = source.tensors
    if _zero_pooler_unread(source):
        tensors = [(s, p) for s, p in tensors if s.name not in POOLER]
    nodes, inputs, outputs = _graph_io(config, heads_of(s.name for s, _ in tensors))
    inits = _initializers(source, tensors)
    metadata = {CONFIG_KEY: config.to_json_string(), LOWER_CASE_KEY: json.dumps(lower_case_of(source))}
    head = (_int(1, IR_VERSION) + _len(2, PRODUCER) + _len(3, __version__))
    tail = _len(8, _len(1, "") + _int(2, OPSET)) + b"".join(
        _len(14, _len(1, k) + _len(2, v)) for k, v in metadata.items())
    nodes = b"".join(_len(1, n) for n in nodes) + _len(2, "bert_of")
    io = b"".join(_len(11, i) for i in inputs) + b"".join(_len(12, o) for o in outputs)
    entries = []  # per initializer: (GraphProto field 5 key + length + TensorProto header + raw_data key + length)
    for name, dims, header, n, raw in inits:
        tensor_len = len(header) + len(_key(9, 2)) + len(varint(n)) + n
        entries.append((_key(5, 2) + varint(tensor_len) + header + _key(9, 2) + varint(n), n, raw))
    graph_len = len(nodes) + sum(len(p) + n for p, n, _ in entries) + len(io)
    total = len(head) + len(_key(7, 2)) + len(varint(graph_len)) + graph_len + len(tail)
    if total > PROTOBUF_LIMIT:
        raise CheckpointError(f"{source.path}: cannot convert to onnx: the model would be {total / 1e9:.2f} GB, "
                              f"beyond protobuf's 2 GB limit on one ONNX file (ONNX's external-data files are "
                              f"not written)")
    path = os.path.join(d, MODEL_FILE)
    with writes_to(path), open(path, "wb") as f:
        f.write(head + _key(7, 2) + varint(graph_len) + nodes)
        for prefix, n, raw in entries:
            f.write(prefix)
            f.write(raw())
        f.write(io + tail)
        if f.tell() != total:  # the lengths announced before the weights were streamed
            raise AssertionError(f"{path}: wrote {f.tell()} bytes, not {total}")
    if source.vocab_file:
        copy_file(source.vocab_file, os.path.join(d, VOCAB_FILE))
    return notes


# --------------------------------------------------------------------------- reading


def model_path(path: str) -> str:
    """The ``.onnx`` file of a path: the file itself, or ``model.onnx`` in a folder."""
    return os.path.join(path, MODEL_FILE) if os.path.isdir(path) else path


def detect(path: str) -> bool:
    """A ``.onnx`` file, or a folder holding ``model.onnx`` (whether bert_of wrote it: ``read`` says)."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, MODEL_FILE))
    return os.path.isfile(path) and path.endswith(".onnx")


class _Message:
    """The fields of one protobuf message in ``buf[start:end]`` (bert_of.protobuf's walk), parsed as
    data: ``fields[number] = [value]``, a varint as an int, a length-delimited field as
    (start, end), a fixed-width one as its bytes."""

    def __init__(self, buf, start: int, end: int, where: str, what: str):
        self.buf, self.fields = buf, {}
        try:
            for number, wire, a, b in protobuf.fields(buf, start, end):
                value = protobuf.read_varint(buf, a, b)[0] if wire == VARINT else (a, b) if wire == LEN \
                    else bytes(buf[a:b])
                self.fields.setdefault(number, []).append(value)
        except ProtobufError as e:
            raise CheckpointError(f"{where}: not a readable ONNX model ({what}: {e})") from None

    def text(self, number: int, default: str = "") -> str:
        span = self.fields.get(number, [None])[-1]
        if span is None:
            return default
        try:
            return bytes(self.buf[span[0]:span[1]]).decode("utf-8")
        except (UnicodeDecodeError, TypeError):
            return "\ufffd"

    def ints(self, number: int) -> list:
        """A repeated int64 field, packed or not."""
        out = []
        for v in self.fields.get(number, []):
            if isinstance(v, int):
                out.append(v)
            elif isinstance(v, tuple):
                pos, end = v
                while pos < end:
                    n, pos = protobuf.read_varint(self.buf, pos, end)
                    out.append(n)
        return out


def _entry(buf, span, where: str, index: int) -> Entry:
    """One initializer (TensorProto) as an Entry reading its raw_data from ``buf``."""
    t = _Message(buf, span[0], span[1], where, f"initializer {index}")
    name = t.text(8)
    if not name:
        raise CheckpointError(f"{where}: initializer {index} has no name")
    try:
        dims = tuple(t.ints(1))
    except ValueError as e:
        raise CheckpointError(f"{where}: initializer {name}: dims are not readable ({e})") from None
    problem = ""
    data_type = (t.fields.get(2) or [0])[-1]
    raw = (t.fields.get(9) or [None])[-1]
    if len(dims) > 2 or any(d >= 2 ** 31 for d in dims):
        problem = f"has dims {list(dims)}, beyond any BERT"
    elif data_type != FLOAT or not isinstance(raw, tuple):
        problem = "is not float32 raw_data (of2onnx writes only those)"
    elif raw[1] - raw[0] != 4 * int(np.prod(dims, dtype=np.int64)):
        want = 4 * int(np.prod(dims, dtype=np.int64))
        problem = f"holds {raw[1] - raw[0]} bytes, not the {want} of float32 {list(dims)}"

    def read():
        return np.frombuffer(buf, np.dtype("<f4"), int(np.prod(dims, dtype=np.int64)), raw[0]).reshape(dims) \
            .astype(np.float32)
    return Entry(name, dims, np.dtype(np.float32), read, problem)


def _check_graph(buf, g: "_Message", config: BertConfig, names, where: str) -> None:
    """The graph is the one of2onnx writes for this config and these weights: what the weights
    mean (and what verify's NumPy reference computes for the file) is then known."""
    want = _graph_io(config, heads_of(names))
    for number, expected, what in zip((1, 11, 12), want, ("nodes", "inputs", "outputs")):
        got = [bytes(buf[v[0]:v[1]]) if isinstance(v, tuple) else v for v in g.fields.get(number, [])]
        if got != expected:
            raise CheckpointError(f"{where}: its graph's {what} are not the ones of2onnx writes for its config and "
                                  f"weights (edited after it was written?); onnx2of reads back only what of2onnx "
                                  f"wrote")


def read(path: str, opts: Options) -> Source:
    path = os.fspath(path)
    return whole(path, lambda pin: _read(pin, path, opts))


def _read(pin, path: str, opts: Options) -> Source:
    where = model_path(path)
    with open(pin.real(where), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise CheckpointError(f"{where}: not a readable ONNX model (the file is empty)")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    model = _Message(buf, 0, len(buf), where, "ModelProto")
    producer = model.text(2)
    metadata = {}
    for span in model.fields.get(14, []):
        if isinstance(span, tuple):
            entry = _Message(buf, span[0], span[1], where, "metadata_props")
            metadata[entry.text(1)] = entry.text(2)
    if producer != PRODUCER or CONFIG_KEY not in metadata:
        said = f"producer {producer!r}" if producer else "no producer"
        raise CheckpointError(f"{where}: an ONNX model bert_of did not write ({said}); onnx2of reads back only "
                              f"the models of2onnx writes")
    graph = (model.fields.get(7) or [None])[-1]
    if not isinstance(graph, tuple):
        raise CheckpointError(f"{where}: not a readable ONNX model (no graph)")
    try:
        config = BertConfig.from_dict(json.loads(metadata[CONFIG_KEY]), f"{where}: {CONFIG_KEY}")
    except ValueError as e:
        if isinstance(e, BertOfError):
            raise
        raise ConfigError(f"{where}: {CONFIG_KEY} is not JSON ({e})") from None
    if config.original_bert_mismatch():  # the graph is post-LN BERT's: such a config is not of2onnx's
        raise CheckpointError(f"{where}: {CONFIG_KEY} describes a pre-LN BERT, which of2onnx never writes")
    g = _Message(buf, graph[0], graph[1], where, "GraphProto")
    entries = [_entry(buf, span, where, i) for i, span in enumerate(g.fields.get(5, []))
               if isinstance(span, tuple)]
    found = sort(entries, lambda e: hit(TABLE, e.name), opts, where, "initializer", TABLE)
    _check_graph(buf, g, config, [h.target for _, h in found.model], where)
    folder = os.path.dirname(where) if not os.path.isdir(path) else path
    vocab = opts.vocab or os.path.join(folder, VOCAB_FILE)
    vocab = pin.hold(vocab) if os.path.isfile(pin.real(vocab)) else None
    lower = metadata.get(LOWER_CASE_KEY)
    if lower in ("true", "false") and "do_lower_case" not in config.extra and \
            (lower == "true") != (not vocab or not vocab_looks_cased(read_vocab_lines(vocab))):
        config.extra["do_lower_case"] = lower == "true"  # what the vocabulary alone would not say
    kept = {h.target for _, h in found.model}
    fill = [] if any(p in kept for p in POOLER) else pooler_zeros(config, np.float32)  # see _zero_pooler_unread
    return finish(where, NAME, config, vocab, found, opts, TABLE, fill=fill, noun="initializer")


# --------------------------------------------------------------------------- onnxruntime


ONNX_EXTRA = "pip install 'bert_of[onnx]'"


class NeedsOnnxRuntime(BertOfError):
    """onnxruntime (the optional ``onnx`` extra) is not installed."""


def run_onnxruntime(path: str, batch: dict) -> dict:
    """{output: np.ndarray} of onnxruntime (CPU) on the model at ``path`` for an int [B, S] batch, the
    outputs under verify's reference names (``sequence_output``, ``pooled_output``, ...)."""
    try:
        import onnxruntime
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "onnxruntime":
            raise
        raise NeedsOnnxRuntime(f"onnxruntime is not installed (the onnx extra: {ONNX_EXTRA})") from None
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: its warnings are not ours to show
    session = onnxruntime.InferenceSession(model_path(path), options, providers=["CPUExecutionProvider"])
    feed = {k: np.ascontiguousarray(batch[k], np.int64) for k in INPUTS}
    names = [o.name for o in session.get_outputs()]
    renamed = dict(REFERENCE_NAMES)
    if MLM_ONLY_OUTPUT in names and mlm_only(heads_of(read(path, Options()).names())):
        renamed[MLM_ONLY_OUTPUT] = "prediction_logits"  # transformers' name for what verify calls prediction_logits
    return {renamed.get(n, n): v for n, v in zip(names, session.run(names, feed))}


FORMAT = Format(NAME, "ONNX inference graph of2onnx writes (model.onnx: opset 14, the config in its metadata; "
                "+ vocab.txt)", detect, read, write_files, reference_np.Onnx, owns=(MODEL_FILE, VOCAB_FILE),
                records_numerics=True,  # the graph computes the config's activation and epsilons, recorded beside
                token_classifier=True,  # classifier_kind in the config, and in the graph
                table=TABLE, ecosystem="onnxruntime", dtypes=("float32",))
