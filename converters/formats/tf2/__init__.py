"""TensorFlow 2 BERT (the Model Garden, ``tf-models-official``'s ``official.nlp``) <-> canonical names.

Three kinds of files, one reader, no TensorFlow:

- object-based ``tf.train.Checkpoint``s: the TF1 bundle container (converters/containers/tf1_bundle.py) whose
  keys are paths through the saved objects (``encoder/layer_with_weights-4/_attention_layer/
  _query_dense/kernel/.ATTRIBUTES/VARIABLE_VALUE``) plus ``_CHECKPOINTABLE_OBJECT_GRAPH``, a
  ``TrackableObjectGraph`` protobuf. A key is only the first path TF found to a variable; which
  layer ``layer_with_weights-N`` is follows object creation order, so the reader never trusts it:
  it parses the object graph (converters/formats/tf2/object_graph.py) and reads each variable's other
  names there (``_transformer_layers/<i>/...``, ``_embedding_layer/embeddings``,
  ``masked_lm/embedding_table``). That covers
  ``tf2_bert_encoder_checkpoint_converter``'s encoder and pretrainer output, TF-NLP's
  ``encoder/`` + ``masked_lm/`` pretrainer checkpoints and official.legacy.bert's training
  checkpoints (``model/...``, NSP ``classification/``, SQuAD ``span_labeling/``, Adam slots listed
  in the graph's ``slot_variables`` or, for a Keras 2.11+ optimizer, named after their variable,
  ``global_step``).
- TF Hub SavedModels (``saved_model.pb`` + ``variables/variables.*``): the bundle's keys are
  ``variables/N/...``; ``saved_model.pb``'s ``SavedObjectGraph`` (MetaGraphDef field 7) names
  every variable (``transformer/layer_0/self_attention/query/kernel``), node for node the bundle's
  object graph.

Layout: attention kernels are einsum tensors, query/key/value ``[H, heads, head_size]`` (bias
``[heads, head_size]``) and the attention output ``[heads, head_size, H]``; every other kernel is
``[in, out]``. Numerics: Model Garden's "gelu" is the tanh form, LayerNorm epsilon 1e-12, masked
scores get -1e9.

The writer (``of2tf2``) writes the encoder under ``encoder/`` as BertEncoder tracks it and, with an
MLM head, ``masked_lm/`` as BertPretrainerV2's ``checkpoint_items`` do, with the object graph, so
``tf.train.Checkpoint(encoder=BertEncoder(...)).read(prefix)`` restores it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

import bert_of.protobuf as pb
from bert_of.config import BertConfig
from bert_of.errors import CheckpointError
from bert_of.converters.containers import tf1_bundle, tf1_bundle_writer
from bert_of.converters.formats.tf2.object_graph import (GraphBuilder, aliases, encode_object_graph, keys_of,
                                                 parse_object_graph, saved_variable_names)
from bert_of.converters.mapping import Table, apply_shape, spell
from bert_of.converters.reader import Entry, Hit, finish, sort, whole
from bert_of.converters.source import Options, ReportLine, Source, write_google_sidecars
from bert_of.converters.descriptor import TF_WEIGHTS, Format
from bert_of.converters.verify import reference_np

NAME = "tf2"
CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
PREFIX_NAME = "bert_model.ckpt"
SAVED_MODEL = "saved_model.pb"
OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"

# How Model Garden's objects name each scope (the path below the encoder / the model object).
L = "_transformer_layers/{i}/"
PARAMS = {
    "embedding": [("/embeddings", ".weight")],
    "dense": [("/kernel", ".weight", "T"), ("/bias", ".bias")],
    "heads_in": [("/kernel", ".weight", "heads_in"), ("/bias", ".bias", "heads_bias")],  # [H, n, d]
    "heads_out": [("/kernel", ".weight", "heads_out"), ("/bias", ".bias")],  # [n, d, H]
    "ln": [("/gamma", ".LayerNorm.weight"), ("/beta", ".LayerNorm.bias")],
    "bias": [("/bias", ".bias")],
}
TABLE = Table(spell(lambda scope: None, PARAMS, {
    "bert.embeddings.word_embeddings": "_embedding_layer",
    "bert.embeddings.position_embeddings": "_position_embedding_layer",
    "bert.embeddings.token_type_embeddings": "_type_embedding_layer",
    "bert.embeddings": "_embedding_norm_layer",
    "bert.encoder.layer.{i}.attention.self.query": (L + "_attention_layer/_query_dense", "heads_in"),
    "bert.encoder.layer.{i}.attention.self.key": (L + "_attention_layer/_key_dense", "heads_in"),
    "bert.encoder.layer.{i}.attention.self.value": (L + "_attention_layer/_value_dense", "heads_in"),
    "bert.encoder.layer.{i}.attention.output.dense": (L + "_attention_layer/_output_dense", "heads_out"),
    "bert.encoder.layer.{i}.attention.output": L + "_attention_layer_norm",
    "bert.encoder.layer.{i}.intermediate.dense": L + "_intermediate_dense",
    "bert.encoder.layer.{i}.output.dense": L + "_output_dense",
    "bert.encoder.layer.{i}.output": L + "_output_layer_norm",
    "bert.pooler.dense": "_pooler_layer",
    "cls.predictions.transform.dense": "masked_lm/dense",
    "cls.predictions.transform": "masked_lm/layer_norm",
    "cls.predictions": "masked_lm",  # its output bias, "bias" (also "output_bias/bias")
    "cls.seq_relationship": "classification/layer_with_weights-0",  # legacy BertPretrainer: on the pooled output
    "qa_outputs": "span_labeling/layer_with_weights-0",  # BertSpanLabeler (run_squad)
}) + [("masked_lm/embedding_table", "bert.embeddings.word_embeddings.weight")])  # the MLM's tied table

# The same scopes as a SavedModel's variables are named (tf.Variable names, SavedVariable.name).
_SL = "transformer/layer_{i}/"
SAVED_TABLE = Table(spell(lambda scope: None, {**PARAMS, "ln": [("/gamma", ".LayerNorm.weight"),
                                                                ("/beta", ".LayerNorm.bias")]}, {
    "bert.embeddings.word_embeddings": "word_embeddings",
    "bert.embeddings.position_embeddings": "position_embedding",
    "bert.embeddings.token_type_embeddings": "type_embeddings",
    "bert.embeddings": "embeddings/layer_norm",
    "bert.encoder.layer.{i}.attention.self.query": (_SL + "self_attention/query", "heads_in"),
    "bert.encoder.layer.{i}.attention.self.key": (_SL + "self_attention/key", "heads_in"),
    "bert.encoder.layer.{i}.attention.self.value": (_SL + "self_attention/value", "heads_in"),
    "bert.encoder.layer.{i}.attention.output.dense": (_SL + "self_attention/attention_output", "heads_out"),
    "bert.encoder.layer.{i}.attention.output": _SL + "self_attention_layer_norm",
    "bert.encoder.layer.{i}.intermediate.dense": _SL + "intermediate",
    "bert.encoder.layer.{i}.output.dense": _SL + "output",
    "bert.encoder.layer.{i}.output": _SL + "output_layer_norm",
    "bert.pooler.dense": "pooler_transform",
    "cls.predictions.transform.dense": "cls/predictions/transform/dense",
    "cls.predictions.transform": "cls/predictions/transform/LayerNorm",
    "cls.predictions": "cls/predictions/output_bias",
}))

# BertPretrainerV2's cls_heads (the pretraining task's "next_sentence" head): a ClassificationHead
# on the [CLS] token with its own dense + tanh layer, so not bert_of's NSP (one layer on the pooler).
# checkpoint_items export it as "<name>.pooler_dense" (escaped ".." in a key).
_CLS_HEAD = re.compile(r"(?:^|/)(classification_heads/\d+|[^/]+?\.\.?pooler_dense)/")
SLOTS = {"m": "m", "v": "v"}  # Keras Adam's slot names -> bert_of optimizer-state prefixes
HYPER = ("beta_1", "beta_2", "decay", "learning_rate", "_learning_rate", "epsilon", "weight_decay_rate")
OPTIMIZER_META = {"optimizer": "adamw", "bias_correction": "true", "eps": "1e-06", "weight_decay": "0.01",
                  "exclude_from_weight_decay": "LayerNorm,layer_norm,bias",
                  "source": "Model Garden official.nlp.optimization.AdamWeightDecay (Keras Adam)"}


# ----------------------------------------------------------------------------- reading


def _tails(table: Table, path: str):
    """(canonical, transform) for ``path`` or any of its tails that the table names."""
    parts = path.split("/")
    for j in range(len(parts)):
        found = table.to_canonical("/".join(parts[j:]))
        if found:
            return found
    return None


def _saved_model_dir(path: str):
    d = os.path.dirname(path) if os.path.basename(path) == SAVED_MODEL else path
    if os.path.isfile(os.path.join(d, SAVED_MODEL)) and os.path.isfile(os.path.join(d, "variables", "variables.index")):
        return d
    return None


def detect(path: str) -> bool:
    if _saved_model_dir(path):
        return True
    try:
        return OBJECT_GRAPH in tf1_bundle.read_index(tf1_bundle.resolve_prefix(path))
    except CheckpointError:
        return False


def read(path: str, opts: Options) -> Source:
    path = os.fspath(path)
    return whole(path, lambda pin: _read(pin, path, opts))


@dataclass
class _Var:
    key: str  # the bundle's name
    names: list  # what the graph calls it: paths (checkpoint) or its variable name (SavedModel)
    slot: tuple = ()  # (slot name, node of the variable it belongs to)
    full: str = ""  # the tf.Variable's name (a Keras optimizer's slot: "<Optimizer>/m/<its variable's name>")


def _variables(nodes, where, saved):
    """checkpoint key -> _Var, from the object graph: every path to the variable (a checkpoint), or
    the variable's name in saved_model.pb (a SavedModel, whose graph also reaches each variable
    through every Keras list that holds it: ~10^5 paths for a 3-layer model, not walked)."""
    paths = aliases(nodes, where) if saved is None else {}
    slot_of = {s[2]: (s[1], s[0]) for node in nodes for s in node.slots}
    out = {}
    for i, node in enumerate(nodes):
        for _, full, key in node.attributes:
            if saved is not None and saved.get(i) and full and full != saved[i]:  # one graph, two files
                raise CheckpointError(f"{where}: {SAVED_MODEL} names node {i} {saved[i]!r} but variables/ holds "
                                      f"{full!r} there (files of two different SavedModels?)")
            names = ([saved[i]] if saved is not None and saved.get(i) else []) + paths.get(i, [])
            stem = key[:-len(VALUE)] if key.endswith(VALUE) else key
            out[key] = _Var(key, names + ([stem] if stem not in names else []), slot_of.get(i, ()), full)
    return out


def _classify_var(var, table, by_node_key, by_full_name, global_step_elsewhere=False):
    """Hit or ReportLine for one variable of the graph. Optimizer slots: a Keras "legacy" optimizer
    lists them in the graph (``slot_variables``); a Keras 2.11+ optimizer keeps them in its own
    list (``optimizer/_variables/N``), named ``<Optimizer>/m/<the variable's name>``. Model Garden's
    trainer (official.core's ``Checkpoint(global_step=, model=, optimizer=)``) saves its own
    ``global_step`` beside the optimizer's iteration counter: the step is ``global_step``; a
    ``BertPretrainerV2`` classification head (``classification_heads/N``) has no bert_of place."""
    hits = {found for found in (_tails(table, n) for n in var.names) if found}
    if len(hits) > 1:
        raise CheckpointError(f"variable {var.key} is named as {' and '.join(sorted(h[0] for h in hits))}")
    if hits:
        target, transform = hits.pop()
        return Hit(target, transform)
    head = next((m for m in map(_CLS_HEAD.search, var.names) if m), None)
    if head:
        return ReportLine(var.key, "dropped", note=f"BertPretrainerV2's classification head ({head.group(1)}: "
                          "[CLS] -> dense + tanh -> out_proj; bert_of's NSP head is one layer on the pooler)")
    if var.slot:
        slot, owner = var.slot
        base = by_node_key(owner)
        if isinstance(base, Hit) and not base.optimizer and slot in SLOTS:
            return Hit(f"{SLOTS[slot]}/{base.target}", base.transform, optimizer=True)
        if isinstance(base, ReportLine) and base.action == "dropped":  # the slot of a dropped variable
            return ReportLine(var.key, "dropped", note=f"optimizer slot {slot} of a dropped variable: {base.note}")
        return None
    slot = re.fullmatch(r"[^/]+/(m|v)/(.+)", var.full) if any(n.startswith("optimizer/") for n in var.names) else None
    if slot and slot.group(1) in SLOTS:
        base = by_full_name(slot.group(2))
        if isinstance(base, Hit) and not base.optimizer:
            return Hit(f"{SLOTS[slot.group(1)]}/{base.target}", base.transform, optimizer=True)
    ends = {n.rsplit("/", 1)[-1] for n in var.names}
    if "global_step" in var.names:
        return Hit("step", "scalar", optimizer=True)
    if any(n in ("optimizer/iter", "optimizer/_iterations") for n in var.names):
        if global_step_elsewhere:  # Model Garden's trainer: Checkpoint(global_step=, model=, optimizer=)
            return ReportLine(var.key, "dropped", note="the optimizer's own step counter (the trainer's "
                                                       "global_step is kept as the step)")
        return Hit("step", "scalar", optimizer=True)
    if "save_counter" in ends:
        return ReportLine(var.key, "dropped", note="tf.train.Checkpoint's save counter")
    if any(n.startswith("optimizer/") for n in var.names) and ends & set(HYPER):
        return ReportLine(var.key, "dropped", note="optimizer hyper-parameter (not state)")
    if "do_lower_case" in ends:
        return ReportLine(var.key, "dropped", note="the SavedModel's do_lower_case (kept in the config)")
    return None


def _infer_config(shapes: dict, where: str) -> BertConfig:
    """A Google-style config from the tensors' shapes, with Model Garden's numerics (its "gelu" is
    tanh, LayerNorm epsilon 1e-12): what a Hub SavedModel or a bare converter output implies."""
    def shape(name):
        if name not in shapes:
            raise CheckpointError(f"{where}: no {CONFIG_FILE} beside it (pass --config) and no {name} to infer one")
        return shapes[name]
    word, pos = shape("bert.embeddings.word_embeddings.weight"), shape("bert.embeddings.position_embeddings.weight")
    q = shape("q-heads")
    layers = sum(1 for n in shapes if n.endswith(".attention.self.query.weight"))
    return BertConfig.from_google_dict({
        "vocab_size": word[0], "hidden_size": word[1], "num_hidden_layers": layers,
        "num_attention_heads": q[1], "intermediate_size": shape("bert.encoder.layer.0.intermediate.dense.weight")[0],
        "hidden_act": "gelu", "max_position_embeddings": pos[0],
        "type_vocab_size": shape("bert.embeddings.token_type_embeddings.weight")[0],
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}, where=where)


def _read(pin, path: str, opts: Options) -> Source:
    sm_dir = _saved_model_dir(pin.real(path))
    if sm_dir:
        shown_dir = os.path.dirname(path) if os.path.basename(path) == SAVED_MODEL else path
        real = os.path.join(sm_dir, "variables", "variables")
        where = shown_dir
        saved = saved_variable_names(pin.hold(os.path.join(shown_dir, SAVED_MODEL)))
        table, side_dirs = SAVED_TABLE, (shown_dir, os.path.join(shown_dir, "assets"))
    else:
        real = tf1_bundle.resolve_prefix(pin.real(path))
        where = pin.shown(real)
        saved, table, side_dirs = None, TABLE, (os.path.dirname(where) or ".",)
    entries = tf1_bundle.read_index(real)
    if OBJECT_GRAPH not in entries:
        raise CheckpointError(f"{where}: no {OBJECT_GRAPH} (a TF1 checkpoint: read it as tf)")
    shards = {}
    for e in entries.values():
        if not e.slices and e.shard not in shards:
            shards[e.shard] = pin.hold(tf1_bundle.data_path(real, e.shard, e.num_shards))
    graph_entry = entries[OBJECT_GRAPH]
    try:
        nodes = parse_object_graph(tf1_bundle.read_bytes(real, graph_entry, data=shards.get(graph_entry.shard)))
    except pb.ProtobufError as e:
        raise CheckpointError(f"{where}: corrupt {OBJECT_GRAPH} ({e})") from None
    variables = _variables(nodes, where, saved)
    node_key = {i: key for i, node in enumerate(nodes) for _, _, key in node.attributes}
    named_once = {}  # a variable's name -> its key, where one variable has that name
    for v in variables.values():
        named_once[v.full] = None if v.full in named_once else v.key
    global_step = {v.key for v in variables.values() if "global_step" in v.names}
    memo = {}

    def classify_key(key):
        if key not in memo:
            memo[key] = None  # a slot of a slot of ... itself: unknown, not an endless loop
            memo[key] = _classify_var(variables[key], table,
                                      lambda i: classify_key(node_key[i]) if i in node_key else None,
                                      lambda full: classify_key(named_once[full]) if named_once.get(full) else None,
                                      global_step_elsewhere=bool(global_step - {key}))
        return memo[key]

    def classify(e):
        if e.name == OBJECT_GRAPH:
            return ReportLine(e.name, "dropped", note="the object graph (read: it names every variable)")
        if e.name not in variables or not (variables[e.name].names or variables[e.name].slot):
            return None
        try:
            return classify_key(e.name)
        except CheckpointError as err:
            raise CheckpointError(f"{where}: {err}") from None

    listed = [_entry(real, e, shards) for e in entries.values()]
    found = sort(listed, classify, opts, where, "variable", table)
    # The reference reads the tensors by the names the graph gives them (not by key).
    named = {e.name: _semantic(variables[e.name], table) for e, _ in found.model}
    config_path = next((os.path.join(d, CONFIG_FILE) for d in side_dirs
                        if os.path.isfile(pin.real(os.path.join(d, CONFIG_FILE)))), None)
    config_path = opts.config or config_path
    if config_path:
        if not os.path.isfile(pin.real(config_path)):
            raise CheckpointError(f"{config_path}: config file not found (pass --config)")
        held = pin.hold(config_path)
        with open(held, "rb") as f:
            config = BertConfig.from_google_json_file(config_path, raw=f.read())
    else:
        held = None
        shapes = {h.target: apply_shape(h.transform, e.shape) for e, h in found.model}
        q = next((e.shape for e, h in found.model if h.target.endswith("0.attention.self.query.weight")), None)
        if q is not None:
            shapes["q-heads"] = tuple(q)
        config = _infer_config(shapes, where)
    _check_heads(found.model, config, where)
    flag = next((e for e in listed if e.name in variables and e.shape == () and str(e.dtype) == "bool"
                 and any(n.endswith("do_lower_case") for n in variables[e.name].names)), None)
    if flag is not None:  # a Hub SavedModel says how its text is cased
        config.extra.setdefault("do_lower_case", bool(flag.read()))
    vocab = opts.vocab or next((os.path.join(d, VOCAB_FILE) for d in side_dirs
                                if os.path.isfile(pin.real(os.path.join(d, VOCAB_FILE)))), None)
    vocab = pin.hold(vocab) if vocab else None
    source = finish(where, NAME, config, vocab, found, opts, table, optimizer_meta=OPTIMIZER_META,
                    noun="variable", config_file=held)
    source.stored = {named[k]: p for k, p in source.stored.items()}
    return source


def _semantic(var, table) -> str:
    """The name the graph gives a variable, as the table spells it (its tail): what the reference reads."""
    for n in var.names:
        parts = n.split("/")
        for j in range(len(parts)):
            if table.to_canonical("/".join(parts[j:])):
                return "/".join(parts[j:])
    return var.key


def _check_heads(model, config, where):
    """The einsum tensors' head split must be the config's (the rest of the fit: reader.check)."""
    n, H = config.num_attention_heads, config.hidden_size
    for e, h in model:
        if h.transform in ("heads_in", "heads_out", "heads_bias"):
            want = {"heads_in": (H, n, H // n), "heads_out": (n, H // n, H), "heads_bias": (n, H // n)}[h.transform]
            if tuple(e.shape) != want:
                raise CheckpointError(f"{where}: variable {e.name} has shape {list(e.shape)} but the config implies "
                                      f"{list(want)} ({n} heads of {H // n}; config does not fit the tensors)")


def _entry(prefix, e, shards) -> Entry:
    problem = ""
    if e.slices:
        problem = f"is a partitioned variable ({e.slices} slices); slice assembly is not supported"
    elif not isinstance(e.dtype, np.dtype):
        problem = f"has dtype {e.dtype}, not a numeric type"
    return Entry(e.name, e.shape, e.dtype, lambda: tf1_bundle.read_tensor(prefix, e, data=shards.get(e.shard)), problem)


# ----------------------------------------------------------------------------- writing



def _split(kind: str, heads: int):
    """canonical array -> Model Garden's stored array."""
    def f(a):
        if kind == "T":
            return np.ascontiguousarray(a.T)
        if kind == "heads_in":  # [out, in] -> [in, n, d]
            return np.ascontiguousarray(a.T).reshape(a.shape[1], heads, -1)
        if kind == "heads_bias":
            return a.reshape(heads, -1)
        if kind == "heads_out":  # [out, in] -> [n, d, out]
            return np.ascontiguousarray(a.T).reshape(heads, -1, a.shape[0])
        return a
    return f


def write_files(source: Source, d: str, opts: Options) -> list:
    """A Model Garden checkpoint (BertEncoder under ``encoder/``, an MLM head under ``masked_lm/``)
    with its object graph, ``bert_config.json`` and ``vocab.txt`` into the (staging) directory ``d``."""
    notes = []
    reason = source.config.google_mismatch()
    if reason:
        notes.append(f"note: Model Garden's BertEncoder would compute differently: {reason}; "
                     f"bert_config.json records the exact numerics (bert_of_hidden_act / layer_norm_eps)")
    tensors = {s.name: p for s, p in source.tensors}
    dtypes = {str(s.dtype) for s, _ in source.tensors}
    if dtypes != {"float32"}:
        notes.append(f"note: weights written as {', '.join(sorted(dtypes))}; Model Garden's BertEncoder builds "
                     f"float32 variables, which TensorFlow restores only from float32 tensors")
    unplaced = [n for n in tensors if n.startswith("classifier.")]
    if unplaced:
        raise CheckpointError(f"{source.path}: tensor {unplaced[0]} has no place in a Model Garden checkpoint "
                              f"(tf2 writes BertEncoder, BertPretrainerV2's MLM, NSP and span-labeler heads)")
    heads, layers = source.config.num_attention_heads, source.config.num_hidden_layers
    g = GraphBuilder()

    def put(parent, local, canonical, kind=None):
        if canonical in tensors:
            full = SAVED_TABLE.from_canonical(canonical)
            g.var(parent, local, full[0] if full else canonical,
                  lambda p=tensors.pop(canonical), k=kind: _split(k, heads)(p()))

    def dense(parent, local, scope, kind="T"):
        node = g.child(parent, local)
        bias_kind = "heads_bias" if kind == "heads_in" else None
        put(node, "kernel", scope + ".weight", kind)
        put(node, "bias", scope + ".bias", bias_kind)
        return node

    def norm(parent, local, scope):
        node = g.child(parent, local)
        put(node, "gamma", scope + ".LayerNorm.weight")
        put(node, "beta", scope + ".LayerNorm.bias")
        return node

    enc = g.child(0, "encoder")
    parts = []
    for scope in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        node = g.child(enc, f"layer_with_weights-{len(parts)}")
        put(node, "embeddings", f"bert.embeddings.{scope}.weight")
        parts.append(node)
    parts.append(norm(enc, "layer_with_weights-3", "bert.embeddings"))
    blocks = []
    for i in range(layers):
        p = f"bert.encoder.layer.{i}."
        block = g.child(enc, f"layer_with_weights-{4 + i}")
        att = g.child(block, "_attention_layer")
        for local, s in (("_query_dense", "query"), ("_key_dense", "key"), ("_value_dense", "value")):
            dense(att, local, p + "attention.self." + s, "heads_in")
        dense(att, "_output_dense", p + "attention.output.dense", "heads_out")
        norm(block, "_attention_layer_norm", p + "attention.output")
        dense(block, "_intermediate_dense", p + "intermediate.dense")
        dense(block, "_output_dense", p + "output.dense")
        norm(block, "_output_layer_norm", p + "output")
        blocks.append(block)
    pooler = dense(enc, f"layer_with_weights-{4 + layers}", "bert.pooler.dense")
    g.child(enc, "_pooler_layer", pooler)
    stack = g.child(enc, "_transformer_layers")
    for i, block in enumerate(blocks):
        g.child(stack, str(i), block)
    for local, node in zip(("_embedding_layer", "_position_embedding_layer", "_type_embedding_layer",
                            "_embedding_norm_layer"), parts):
        g.child(enc, local, node)
    if "cls.predictions.bias" in tensors:  # BertPretrainerV2's masked_lm, its table the word embeddings
        mlm = g.child(0, "masked_lm")
        g.child(mlm, "embedding_table", g.nodes[parts[0]].children[0][0])
        dense(mlm, "dense", "cls.predictions.transform.dense")
        norm(mlm, "layer_norm", "cls.predictions.transform")
        bias = g.var(mlm, "output_bias/bias", "cls/predictions/output_bias/bias", tensors.pop("cls.predictions.bias"))
        g.child(mlm, "bias", bias)
    for scope, local in (("cls.seq_relationship", "classification"), ("qa_outputs", "span_labeling")):
        if scope + ".weight" in tensors:  # official.legacy.bert's heads ([H, 2] kernels)
            dense(g.child(0, local), "layer_with_weights-0", scope)
            notes.append(f"note: {scope}.* written as official.legacy.bert's {local}/ head; BertEncoder and "
                         f"BertPretrainerV2 restores leave it unread")
    if tensors:
        raise CheckpointError(f"{source.path}: tensor {next(iter(tensors))} has no place in a Model Garden checkpoint")
    g.var(0, "save_counter", "save_counter", lambda: np.asarray(1, np.int64))
    if opts.with_optimizer and source.optimizer:
        notes.append("note: tf2 writes no optimizer state (the weights only)")

    keys = keys_of(g.nodes)
    for node, (full, _) in g.values.items():
        g.nodes[node].attributes.append(("VARIABLE_VALUE", full, keys[node] + VALUE))
    items = [(OBJECT_GRAPH, encode_object_graph(g.nodes))]
    items += [(keys[node] + VALUE, produce) for node, (_, produce) in g.values.items()]
    tf1_bundle_writer.write_bundle(os.path.join(d, PREFIX_NAME), ((k, v if isinstance(v, bytes) else v()) for k, v in items))
    write_google_sidecars(source, d)
    return notes


FORMAT = Format(
    NAME, "TensorFlow 2 Model Garden checkpoint (object-based tf.train.Checkpoint) or TF Hub SavedModel",
    detect, read, write_files, reference_np.ModelGarden, owns=(CONFIG_FILE, VOCAB_FILE, "checkpoint"),
    owns_patterns=(r".+\.index", r".+\.data-\d+-of-\d+"), table=TABLE,
    ecosystem=TF_WEIGHTS,
    numerics_recorded="Model Garden's BertEncoder computes its config's \"gelu\" as the tanh GELU with LayerNorm "
                      "eps 1e-12 (measured on tf-models-official 2.15), a Hub SavedModel computes the graph it holds")  # verify also runs Google's modeling.py in TensorFlow on these weights
