"""ONNX (``model.onnx``): BERT as a self-contained inference graph, written by bert_of and read back.

``of2onnx`` writes a folder: ``model.onnx`` (the graph, every weight as an initializer, the
bert_of config in the model's metadata) and ``vocab.txt``. The protobuf is written with
``bert_of.protobuf``'s field writer (no ``onnx`` package); ``onnx2of`` walks it as data and reads
back only what ``of2onnx`` wrote (producer ``bert_of``, its graph exactly the one of2onnx writes
for the config and weights it holds): any other ONNX file is refused in one line.

The graph (BERT's forward, opset 14) is converters/formats/onnx/graph.py's; ONNX's messages are
converters/containers/onnx_proto.py's.

Initializers are the canonical tensors under their canonical names, except dense weights, which
MatMul wants [in, out]: ``<scope>.kernel`` holds the transpose of ``<scope>.weight`` (TABLE).
Every initializer is float32, ``raw_data`` little-endian; constants the graph needs are
Constant nodes, so the initializers are exactly the weights. A source whose weights are all
float16 (``--dtype float16``) is written with float16 initializers (half the file), each read
through a Cast to float32 (graph.py): the same inputs and outputs, computed in float32.

Size: a protobuf message is at most 2 GB (what onnxruntime and ``onnx`` parse); a model whose
file would be larger is refused before anything is written (BERT-large is 1.3 GB).
"""

from __future__ import annotations

import json
import mmap
import os

import numpy as np

from bert_of.config import BertConfig
from bert_of.errors import BertOfError, CheckpointError, ConfigError
from bert_of.files.atomic import writes_to
from bert_of.checkpoint import copy_file
from bert_of.protobuf import key as _key, varint
from bert_of.vocab import read_vocab_lines, vocab_looks_cased
from bert_of.version import __version__
from bert_of.converters.verify import reference_np
from bert_of.converters.descriptor import ONNXRUNTIME, Format
from bert_of.converters.source import Options, Source, lower_case_of
from bert_of.converters.mapping import Table, apply, inverse, spell
from bert_of.converters.reader import POOLER, Entry, finish, hit, pooler_zeros, sort, whole
from bert_of.converters.formats.onnx.graph import (CONTRIB, FUSED_OPSET, INPUTS, MLM_ONLY_OUTPUT, OPSET, graph_io,
                                                  heads_of, mlm_only)
from bert_of.converters.containers.onnx_proto import FLOAT, FLOAT16, Message, int_field, len_field

NAME = "onnx"
MODEL_FILE = "model.onnx"
VOCAB_FILE = "vocab.txt"
IR_VERSION = 7  # ONNX 1.9, the first with opset 14
PRODUCER = "bert_of"
CONFIG_KEY = "bert_of.config"  # metadata_props: the bert_of config (config.json's text)
LOWER_CASE_KEY = "do_lower_case"  # metadata_props: how text is tokenized for this model
PROTOBUF_LIMIT = 2 ** 31 - 1  # protobuf's largest message: what onnxruntime and onnx parse
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


STORED = {FLOAT: np.dtype("<f4"), FLOAT16: np.dtype("<f2")}  # the initializers' data types, as stored


def _initializers(source: Source, tensors: list, data_type: int = FLOAT) -> list:
    """[(initializer name, dims, header bytes, producer of its raw bytes)] in the Source's order,
    every one of ``data_type`` (FLOAT, or FLOAT16 when every weight is float16)."""
    stored = STORED[data_type]
    out = []
    for spec, produce in tensors:
        found = TABLE.from_canonical(spec.name)
        if found is None:
            raise CheckpointError(f"{source.path}: tensor {spec.name} has no place in the ONNX graph")
        name, transform = found
        back = inverse(transform)
        dims = tuple(reversed(spec.shape)) if back == "T" else tuple(spec.shape)
        header = b"".join(int_field(1, d) for d in dims) + int_field(2, data_type) + len_field(8, name)
        n = int(np.prod(dims, dtype=np.int64)) * stored.itemsize

        def raw(produce=produce, back=back, dims=dims, n=n, name=name):
            arr = np.ascontiguousarray(apply(back, np.asarray(produce())), stored)
            if arr.shape != dims or arr.nbytes != n:  # the Source's producers are checked; this is ours
                raise AssertionError(f"{name}: {arr.shape} is not {dims}")
            return arr.tobytes()
        out.append((name, dims, header, n, raw))
    return out


def _serialized(source: Source, fused: bool = False) -> tuple:
    """The ModelProto of ``source`` as (total bytes, [bytes, or a producer of a weight's bytes, in
    file order], notes): the lengths are known before any weight is read, so a writer streams one
    tensor in memory at a time. ``fused``: the graph in onnxruntime's fused ops (graph.py's
    ``build_graph``; opset 17 + onnxruntime's contrib domain), for ``--engine onnxruntime`` only."""
    config = source.config
    why = config.original_bert_mismatch()
    if why:  # the graph is post-LN BERT's (convert refuses first; a graph built in memory here)
        raise CheckpointError(f"{source.path}: no ONNX graph: {why}")
    notes = []
    if config.query_key_layer_scaling:
        notes.append("note: query-key layer scaling not recorded in the graph (the same function; LiBai's fp32 "
                     "rounding differs by ~1e-7)")
    dtypes = {np.dtype(s.dtype) for s, _ in source.tensors}
    data_type = FLOAT16 if dtypes == {np.dtype(np.float16)} else FLOAT
    if data_type == FLOAT and dtypes != {np.dtype(np.float32)}:  # bfloat16, or float16 mixed with float32
        notes.append(f"note: the weights are {', '.join(sorted(map(str, dtypes)))}: ONNX initializers are written "
                     "float32 (widened exactly), or float16 when every weight is float16")
    tensors = source.tensors
    if _zero_pooler_unread(source):
        tensors = [(s, p) for s, p in tensors if s.name not in POOLER]
    nodes, inputs, outputs = graph_io(config, heads_of(s.name for s, _ in tensors), data_type, fused)
    inits = _initializers(source, tensors, data_type)
    metadata = {CONFIG_KEY: config.to_json_string(), LOWER_CASE_KEY: json.dumps(lower_case_of(source))}
    head = (int_field(1, IR_VERSION) + len_field(2, PRODUCER) + len_field(3, __version__))
    opsets = [("", FUSED_OPSET), (CONTRIB, 1)] if fused else [("", OPSET)]  # OperatorSetIdProto: domain, version
    tail = b"".join(len_field(8, len_field(1, d) + int_field(2, v)) for d, v in opsets) + b"".join(
        len_field(14, len_field(1, k) + len_field(2, v)) for k, v in metadata.items())
    nodes = b"".join(len_field(1, n) for n in nodes) + len_field(2, "bert_of")
    io = b"".join(len_field(11, i) for i in inputs) + b"".join(len_field(12, o) for o in outputs)
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
    parts = [head + _key(7, 2) + varint(graph_len) + nodes]
    for prefix, _, raw in entries:
        parts += [prefix, raw]
    return total, parts + [io + tail], notes


def _pieces(parts):
    """The bytes of :func:`_serialized`'s parts in order, each weight read when its turn comes."""
    for part in parts:
        yield part if isinstance(part, bytes) else part()


def write_files(source: Source, d: str, opts: Options) -> list:
    """``model.onnx`` (+ ``vocab.txt``) into the directory ``d``, one tensor in memory at a time."""
    total, parts, notes = _serialized(source)  # refused (beyond 2 GB, ...) before the file is opened
    path = os.path.join(d, MODEL_FILE)
    with writes_to(path), open(path, "wb") as f:
        _write(f, total, parts, path)
    if source.vocab_file:
        copy_file(source.vocab_file, os.path.join(d, VOCAB_FILE))
    return notes


def stream(source: Source, f, fused: bool = False) -> list:
    """Write the ``model.onnx`` of2onnx would write for ``source`` (``fused``: the engine's graph,
    graph.py) into the binary file ``f`` from its start, one tensor in memory at a time; its notes."""
    total, parts, notes = _serialized(source, fused)
    _write(f, total, parts, source.path)
    return notes


def _write(f, total: int, parts: list, where: str) -> None:
    """:func:`_serialized`'s parts into ``f``, each weight read when its turn comes."""
    start = f.tell()
    for piece in _pieces(parts):
        f.write(piece)
    if f.tell() - start != total:  # the lengths announced before the weights were streamed
        raise AssertionError(f"{where}: wrote {f.tell() - start} bytes of ONNX, not {total}")


def model_bytes(source: Source, fused: bool = False) -> tuple:
    """(the ``model.onnx`` of2onnx would write for ``source``, as bytes; its notes): the same graph
    and initializers, built in memory (``--engine onnxruntime`` hands it to an InferenceSession;
    nothing is written); ``fused``: the same function in onnxruntime's fused ops (graph.py), a graph
    only onnxruntime runs and never written. onnxruntime takes ``bytes`` only: the pieces, then the
    file's bytes joined (twice the model while they are joined)."""
    total, parts, notes = _serialized(source, fused)
    data = b"".join(_pieces(parts))
    if len(data) != total:
        raise AssertionError(f"{source.path}: built {len(data)} bytes of ONNX, not {total}")
    return data, notes


# --------------------------------------------------------------------------- reading


def model_path(path: str) -> str:
    """The ``.onnx`` file of a path: the file itself, or ``model.onnx`` in a folder."""
    return os.path.join(path, MODEL_FILE) if os.path.isdir(path) else path


def detect(path: str) -> bool:
    """A ``.onnx`` file, or a folder holding ``model.onnx`` (whether bert_of wrote it: ``read`` says)."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, MODEL_FILE))
    return os.path.isfile(path) and path.endswith(".onnx")


def _entry(buf, span, where: str, index: int) -> Entry:
    """One initializer (TensorProto) as an Entry reading its raw_data from ``buf``."""
    t = Message(buf, span[0], span[1], where, f"initializer {index}")
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
    stored = STORED.get(data_type, STORED[FLOAT])
    if len(dims) > 2 or any(d >= 2 ** 31 for d in dims):
        problem = f"has dims {list(dims)}, beyond any BERT"
    elif data_type not in STORED or not isinstance(raw, tuple):
        problem = "is not float32 or float16 raw_data (of2onnx writes only those)"
    elif raw[1] - raw[0] != stored.itemsize * int(np.prod(dims, dtype=np.int64)):
        want = stored.itemsize * int(np.prod(dims, dtype=np.int64))
        problem = f"holds {raw[1] - raw[0]} bytes, not the {want} of {stored.name} {list(dims)}"

    def read():
        return np.frombuffer(buf, stored, int(np.prod(dims, dtype=np.int64)), raw[0]).reshape(dims) \
            .astype(stored.newbyteorder("="))
    return Entry(name, dims, stored.newbyteorder("="), read, problem)


def _check_graph(buf, g: "Message", config: BertConfig, names, where: str, data_type: int = FLOAT) -> None:
    """The graph is the one of2onnx writes for this config and these weights (of ``data_type``):
    what the weights mean (and what verify's NumPy reference computes for the file) is then known."""
    want = graph_io(config, heads_of(names), data_type)
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
    with open(pin.hold(where), "rb") as f:  # a regular file (a FIFO is refused, not waited on)
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise CheckpointError(f"{where}: not a readable ONNX model (the file is empty)")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    model = Message(buf, 0, len(buf), where, "ModelProto")
    producer = model.text(2)
    metadata = {}
    for span in model.fields.get(14, []):
        if isinstance(span, tuple):
            entry = Message(buf, span[0], span[1], where, "metadata_props")
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
    g = Message(buf, graph[0], graph[1], where, "GraphProto")
    entries = [_entry(buf, span, where, i) for i, span in enumerate(g.fields.get(5, []))
               if isinstance(span, tuple)]
    kinds = {FLOAT16 if e.dtype == np.float16 else FLOAT for e in entries}
    if len(kinds) > 1:
        raise CheckpointError(f"{where}: its initializers mix float32 and float16; of2onnx writes one or the other")
    found = sort(entries, lambda e: hit(TABLE, e.name), opts, where, "initializer", TABLE)
    _check_graph(buf, g, config, [h.target for _, h in found.model], where, kinds.pop() if kinds else FLOAT)
    folder = os.path.dirname(where) if not os.path.isdir(path) else path
    vocab = opts.vocab or os.path.join(folder, VOCAB_FILE)
    vocab = pin.hold(vocab) if os.path.isfile(pin.real(vocab)) else None
    lower = metadata.get(LOWER_CASE_KEY)
    if lower in ("true", "false") and "do_lower_case" not in config.extra and \
            (lower == "true") != (not vocab or not vocab_looks_cased(read_vocab_lines(vocab))):
        config.extra["do_lower_case"] = lower == "true"  # what the vocabulary alone would not say
    kept = {h.target for _, h in found.model}
    dtype = np.dtype(np.float16) if any(e.dtype == np.float16 for e in entries) else np.dtype(np.float32)
    fill = [] if any(p in kept for p in POOLER) else pooler_zeros(config, dtype)  # see _zero_pooler_unread
    return finish(where, NAME, config, vocab, found, opts, TABLE, fill=fill, noun="initializer")


# --------------------------------------------------------------------------- onnxruntime


ONNX_EXTRA = "pip install 'bert_of[onnx]'"


class NeedsOnnxRuntime(BertOfError):
    """onnxruntime (the optional ``onnx`` extra) is not installed."""


def import_onnxruntime():
    """The ``onnxruntime`` module; :class:`NeedsOnnxRuntime` when it is not installed (an import
    failing inside it is its own error, not "missing")."""
    try:
        import onnxruntime
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "onnxruntime":
            raise
        raise NeedsOnnxRuntime(f"onnxruntime is not installed (the onnx extra: {ONNX_EXTRA})") from None
    return onnxruntime


def run_onnxruntime(path: str, batch: dict) -> dict:
    """{output: np.ndarray} of onnxruntime (CPU) on the model at ``path`` for an int [B, S] batch, the
    outputs under verify's reference names (``sequence_output``, ``pooled_output``, ...)."""
    onnxruntime = import_onnxruntime()
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
                table=TABLE, ecosystem=ONNXRUNTIME, dtypes=("float32", "float16"))
