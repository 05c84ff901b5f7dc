"""TensorFlow 2 Model Garden checkpoints and TF Hub SavedModels (converters/formats/tf2/): written by our
writer and read back bit for bit, the object graph deciding which variable is which, verify's
reference in Model Garden's own layout, controls that must fail; TensorFlow itself is the oracle
where it restores our files and writes checkpoints and SavedModels we read."""

import json
import os
import shutil

import numpy as np
import pytest

from bert_of.config import BertConfig
from bert_of.checkpoint import write_checkpoint
from bert_of.errors import CheckpointError
from bert_of.tensors import expected_shapes
from bert_of.converters.containers import tf1_bundle, tf1_bundle_writer
from bert_of.converters.formats import tf2
from bert_of.converters.formats.tf2 import object_graph as tf2_object_graph
from bert_of.converters.convert import convert, detect, read
from bert_of.converters.source import Options
from bert_of.converters.verify.compare import verify
from tests.conftest import TINY, error_lines, run_cli, write_vocab

HEADS = {"pretraining": ("cls.predictions.", "cls.seq_relationship."), "squad": ("qa_outputs.",)}


def _of_checkpoint(d, heads="pretraining", seed=3):
    """A bert_of checkpoint of random weights at trained-BERT magnitudes (no TensorFlow)."""
    config = BertConfig.from_google_dict(dict(TINY))
    rng = np.random.default_rng(seed)
    tensors = []
    for name, shape in expected_shapes(config).items():
        if not name.startswith(("bert.",) + HEADS[heads]):
            continue
        scale = 1.0 if "LayerNorm.weight" in name else 0.3
        value = rng.normal(1.0 if "LayerNorm.weight" in name else 0.0, scale * 0.2, shape)
        tensors.append((name, value.astype(np.float32)))
    vocab = write_vocab(os.path.join(os.path.dirname(str(d)), f"vocab-{seed}.txt"), TINY["vocab_size"])
    write_checkpoint(str(d), tensors, config, vocab)
    return str(d)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(bert_of checkpoint, its tf2 conversion) with MLM + NSP heads."""
    root = tmp_path_factory.mktemp("tf2")
    of = _of_checkpoint(root / "of")
    out = str(root / "tf2")
    convert("of2tf2", of, out, Options())
    return of, out


def _tensors(path, fmt, **kw):
    src = read(path, fmt, Options(**kw))
    return {s.name: p() for s, p in src.tensors}, src


def test_of_tf2_of_is_bit_exact_and_every_tensor_is_accounted_for(pair, tmp_path):
    of, t2 = pair
    assert detect(t2) == "tf2" and detect(of) == "of"
    back = str(tmp_path / "back")
    convert("tf22of", t2, back, Options())
    a, _ = _tensors(of, "of")
    b, _ = _tensors(back, "of")
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
    _, src = _tensors(t2, "tf2")
    index = tf1_bundle.read_index(os.path.join(t2, tf2.PREFIX_NAME))
    assert sorted(r.source for r in src.report) == sorted(index)  # every stored tensor has a line
    kinds = {r.source: r.action for r in src.report}
    assert kinds[tf2.OBJECT_GRAPH] == "dropped" and kinds["save_counter" + tf2.VALUE] == "dropped"
    # the layout as Model Garden stores it: einsum attention, [in, out] kernels, the MLM's tied table
    shapes = {k: e.shape for k, e in index.items()}
    assert shapes["encoder/layer_with_weights-4/_attention_layer/_query_dense/kernel" + tf2.VALUE] == (32, 4, 8)
    assert shapes["encoder/layer_with_weights-4/_attention_layer/_query_dense/bias" + tf2.VALUE] == (4, 8)
    assert shapes["encoder/layer_with_weights-4/_attention_layer/_output_dense/kernel" + tf2.VALUE] == (4, 8, 32)
    assert shapes["encoder/layer_with_weights-4/_intermediate_dense/kernel" + tf2.VALUE] == (32, 37)
    assert "masked_lm/embedding_table" + tf2.VALUE in shapes and not any("layer_with_weights-0/embeddings" in k
                                                                         for k in shapes)


def test_squad_head_round_trips(tmp_path):
    of = _of_checkpoint(tmp_path / "of", heads="squad", seed=4)
    convert("of2tf2", of, str(tmp_path / "t2"), Options())
    convert("tf22of", str(tmp_path / "t2"), str(tmp_path / "back"), Options())
    a, _ = _tensors(of, "of")
    b, _ = _tensors(str(tmp_path / "back"), "of")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert "span_labeling/layer_with_weights-0/kernel" + tf2.VALUE in tf1_bundle.read_index(
        os.path.join(tmp_path, "t2", tf2.PREFIX_NAME))


def test_convert_verify_cli(pair, tmp_path):
    r = run_cli("convert", "tf22of", pair[1], "-o", str(tmp_path / "o"), "--verify", "--json")
    report = json.loads(r.stdout)
    assert report["ok"] and report["worst"] <= 1e-5
    assert {"sequence_output", "pooled_output", "prediction_logits", "seq_relationship_logits"} <= set(report["outputs"])
    assert report["reference"] == "numpy-float64 (tf2 layout)"
    tf_run = report["ecosystem"].get("A:tf-float64")  # Google's modeling.py in TF on these weights
    assert tf_run is None or isinstance(tf_run, str) or max(tf_run.values()) <= 1e-9, tf_run


def _rewrite(src_prefix, dst_prefix, nodes):
    """The checkpoint at ``src_prefix`` with object graph ``nodes``: keys recomputed as TF would."""
    old_keys = {key: i for i, n in enumerate(tf2_object_graph.parse_object_graph(_graph_bytes(src_prefix)))
                for _, _, key in n.attributes}
    keys = tf2_object_graph.keys_of(nodes)
    index = tf1_bundle.read_index(src_prefix)
    values = {}
    for i, n in enumerate(nodes):
        n.attributes = [(a, f, keys[i] + tf2.VALUE) for a, f, _ in n.attributes]
    for key, i in old_keys.items():
        values[keys[i] + tf2.VALUE] = tf1_bundle.read_tensor(src_prefix, index[key])
    values[tf2.OBJECT_GRAPH] = tf2_object_graph.encode_object_graph(nodes)
    tf1_bundle_writer.write_bundle(dst_prefix, values)


def _graph_bytes(prefix):
    return tf1_bundle.read_bytes(prefix, tf1_bundle.read_index(prefix)[tf2.OBJECT_GRAPH])


def test_the_object_graph_not_the_key_says_which_layer(pair, tmp_path):
    """layer_with_weights-N follows creation order; swap two layers' numbers and keep the graph's
    _transformer_layers list: the reader must follow the list (a key-number reader would not)."""
    prefix = os.path.join(pair[1], tf2.PREFIX_NAME)
    nodes = tf2_object_graph.parse_object_graph(_graph_bytes(prefix))
    enc = nodes[0].children[0][0]
    swap = {"layer_with_weights-4": "layer_with_weights-6", "layer_with_weights-6": "layer_with_weights-4"}
    nodes[enc].children = [(i, swap.get(n, n)) for i, n in nodes[enc].children]
    out = tmp_path / "swapped"
    out.mkdir()
    for f in ("bert_config.json", "vocab.txt"):
        (out / f).write_bytes(open(os.path.join(pair[1], f), "rb").read())
    _rewrite(prefix, str(out / tf2.PREFIX_NAME), nodes)
    keys = tf1_bundle.read_index(str(out / tf2.PREFIX_NAME))
    q0 = next(k for k, v in keys.items() if k.endswith("-6/_attention_layer/_query_dense/kernel" + tf2.VALUE))
    a, _ = _tensors(pair[1], "tf2")
    b, src = _tensors(str(out), "tf2")
    assert next(r.target for r in src.report if r.source == q0) == "bert.encoder.layer.0.attention.self.query.weight"
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_controls_that_must_fail(pair, tmp_path):
    prefix = os.path.join(pair[1], tf2.PREFIX_NAME)
    index = tf1_bundle.read_index(prefix)
    values = {k: tf1_bundle.read_tensor(prefix, e) for k, e in index.items() if k != tf2.OBJECT_GRAPH}
    # no object graph: a TF1 bundle of TF2 names is not read as tf2
    bare = tmp_path / "bare"
    tf1_bundle_writer.write_bundle(str(bare / "ckpt"), values)
    assert detect(str(bare)) != "tf2"
    with pytest.raises(CheckpointError, match="this is a tf checkpoint, not tf2"):
        read(str(bare), "tf2", Options(config=os.path.join(pair[1], "bert_config.json")))
    # a graph referring to a node that does not exist
    broken = tmp_path / "broken"
    tf1_bundle_writer.write_bundle(str(broken / "ckpt"), {**values, tf2.OBJECT_GRAPH: (
        tf2_object_graph.encode_object_graph([tf2_object_graph.Node(children=[(7, "encoder")])]))})
    with pytest.raises(CheckpointError, match="corrupt _CHECKPOINTABLE_OBJECT_GRAPH"):
        read(str(broken), "tf2", Options())
    # a config whose head count does not split the einsum tensors
    cfg = dict(TINY, num_attention_heads=8)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"has shape \[4, 8\] but the config implies \[8, 4\] \(8 heads of 4"):
        read(pair[1], "tf2", Options(config=str(tmp_path / "c.json")))
    # a variable that is not BERT's: an error unless --skip-unknown
    nodes = tf2_object_graph.parse_object_graph(_graph_bytes(prefix))
    nodes.append(tf2_object_graph.Node(attributes=[("VARIABLE_VALUE", "extra", "")]))
    nodes[0].children.append((len(nodes) - 1, "extra_thing"))
    odd = tmp_path / "odd"
    odd.mkdir()
    _rewrite_with_extra(prefix, str(odd / "ckpt"), nodes, np.ones(3, np.float32))
    r = run_cli("convert", "tf22of", str(odd), "-o", str(tmp_path / "o"), "--config",
                os.path.join(pair[1], "bert_config.json"), check=False)
    assert r.returncode == 1 and error_lines(r.stderr)[-1].startswith("bert-of: error: ")
    assert "unknown variable extra_thing" in r.stderr and "--skip-unknown" in r.stderr
    assert not (tmp_path / "o").exists()


def _rewrite_with_extra(src_prefix, dst_prefix, nodes, extra):
    keys = tf2_object_graph.keys_of(nodes)
    nodes[-1].attributes = [("VARIABLE_VALUE", "extra", keys[len(nodes) - 1] + tf2.VALUE)]
    index = tf1_bundle.read_index(src_prefix)
    values = {k: tf1_bundle.read_tensor(src_prefix, e) for k, e in index.items() if k != tf2.OBJECT_GRAPH}
    values[keys[len(nodes) - 1] + tf2.VALUE] = extra
    values[tf2.OBJECT_GRAPH] = tf2_object_graph.encode_object_graph(nodes)
    tf1_bundle_writer.write_bundle(dst_prefix, values)


def test_head_layout_matters_to_verify(pair, tmp_path):
    """Control: the q kernel's heads permuted in the file (a reader ignoring the einsum layout would
    not notice) makes verify fail against the original."""
    prefix = os.path.join(pair[1], tf2.PREFIX_NAME)
    index = tf1_bundle.read_index(prefix)
    values = {k: (e.dtype, tf1_bundle.read_tensor(prefix, e) if k != tf2.OBJECT_GRAPH else _graph_bytes(prefix))
              for k, e in index.items()}
    key = "encoder/layer_with_weights-4/_attention_layer/_query_dense/kernel" + tf2.VALUE
    out = tmp_path / "permuted"
    out.mkdir()
    for f in ("bert_config.json", "vocab.txt"):
        (out / f).write_bytes(open(os.path.join(pair[1], f), "rb").read())
    tf1_bundle_writer.write_bundle(str(out / tf2.PREFIX_NAME), {
        k: (v[:, ::-1].copy() if k == key else v) for k, (_, v) in values.items()})
    report = verify(pair[0], str(out), modes=("eager",))
    assert not report["ok"] and report["worst"] > 1e-3
    assert verify(pair[0], pair[1], modes=("eager",))["ok"]


# ----------------------------------------------------------------------------- TensorFlow as the oracle


def _module_tree(tf, tensors, config, heads_order=None):
    """tf.Module objects named as Model Garden's BertEncoder tracks its layers (with its
    layer_with_weights-N aliases, numbered in ``heads_order``), holding ``tensors`` as stored."""
    n = config.num_attention_heads
    H = config.hidden_size

    def m(**kw):
        mod = tf.Module()
        for k, v in kw.items():
            setattr(mod, k, v)
        return mod

    def var(a, name):  # unique names, as Keras gives them (a Keras 2.11+ optimizer names its slots by them)
        return tf.Variable(a, name=name)

    def dense(scope, kind="T"):
        w, b = tensors[scope + ".weight"], tensors[scope + ".bias"]
        k, bn = scope + "/kernel", scope + "/bias"
        if kind == "in":
            return m(kernel=var(w.T.reshape(H, n, -1), k), bias=var(b.reshape(n, -1), bn))
        if kind == "out":
            return m(kernel=var(w.T.reshape(n, -1, H), k), bias=var(b, bn))
        return m(kernel=var(w.T.copy(), k), bias=var(b, bn))

    def ln(scope):
        return m(gamma=var(tensors[scope + ".LayerNorm.weight"], scope + "/gamma"),
                 beta=var(tensors[scope + ".LayerNorm.bias"], scope + "/beta"))

    emb = [m(embeddings=var(tensors[f"bert.embeddings.{s}.weight"], s))
           for s in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    blocks = []
    for i in range(config.num_hidden_layers):
        p = f"bert.encoder.layer.{i}."
        att = m(_query_dense=dense(p + "attention.self.query", "in"), _key_dense=dense(p + "attention.self.key", "in"),
                _value_dense=dense(p + "attention.self.value", "in"),
                _output_dense=dense(p + "attention.output.dense", "out"))
        blocks.append(m(_attention_layer=att, _attention_layer_norm=ln(p + "attention.output"),
                        _intermediate_dense=dense(p + "intermediate.dense"), _output_dense=dense(p + "output.dense"),
                        _output_layer_norm=ln(p + "output")))
    enc = m(_embedding_layer=emb[0], _position_embedding_layer=emb[1], _type_embedding_layer=emb[2],
            _embedding_norm_layer=ln("bert.embeddings"), _transformer_layers=list(blocks),
            _pooler_layer=dense("bert.pooler.dense"))
    order = heads_order or range(len(blocks))
    for k, layer in enumerate([emb[0], emb[1], emb[2], enc._embedding_norm_layer] + [blocks[j] for j in order] +
                              [enc._pooler_layer]):
        setattr(enc, f"layer_with_weights-{k}", layer)
    return enc


def test_tensorflow_restores_what_we_write(pair):
    tf = pytest.importorskip("tensorflow")
    tensors, src = _tensors(pair[0], "of")
    zeros = {k: np.zeros_like(v) for k, v in tensors.items()}
    enc = _module_tree(tf, zeros, src.config)
    status = tf.train.Checkpoint(encoder=enc).read(os.path.join(pair[1], tf2.PREFIX_NAME))
    status.assert_existing_objects_matched()
    want = _module_tree(tf, tensors, src.config)
    got = {v.name + str(i): v.numpy() for i, v in enumerate(enc.trainable_variables)}
    exp = {v.name + str(i): v.numpy() for i, v in enumerate(want.trainable_variables)}
    assert len(got) == 55 and all(np.array_equal(got[k], exp[k]) for k in exp)


def test_we_read_what_tensorflow_writes(pair, tmp_path):
    """tf.train.Checkpoint writes the tree; its keys number the layers in a permuted creation
    order, and only the object graph's _transformer_layers list says which is which."""
    tf = pytest.importorskip("tensorflow")
    tensors, src = _tensors(pair[0], "of")
    encoder = {k: v for k, v in tensors.items() if k.startswith("bert.")}
    enc = _module_tree(tf, encoder, src.config, heads_order=[2, 0, 1])
    tf.train.Checkpoint(encoder=enc).save(str(tmp_path / "ckpt"))
    (tmp_path / "bert_config.json").write_text(json.dumps(TINY))
    got, read_src = _tensors(str(tmp_path), "tf2")
    assert sorted(got) == sorted(encoder) and all(np.array_equal(got[k], encoder[k]) for k in encoder)
    mapped = [r for r in read_src.report if r.action == "mapped"]
    assert any("layer_with_weights" in r.source for r in mapped)  # the keys are TF's own


def test_we_read_a_savedmodel_tensorflow_saves(pair, tmp_path):
    """tf.saved_model.save of variables named as Model Garden names them, in a shuffled list: the
    bundle's keys are variables/N; saved_model.pb's object graph names each one."""
    tf = pytest.importorskip("tensorflow")
    tensors, src = _tensors(pair[0], "of")
    names = {}
    for canonical in tensors:
        spelled = tf2.SAVED_TABLE.from_canonical(canonical)
        if spelled:
            names[canonical] = spelled[0]
    n, H = src.config.num_attention_heads, src.config.hidden_size
    order = sorted(names, key=lambda k: hash(k) % 97)
    save_savedmodel(tf, tensors, order, n, H, str(tmp_path / "sm"))
    assert detect(str(tmp_path / "sm")) == "tf2"
    got, sm = _tensors(str(tmp_path / "sm"), "tf2")
    assert sorted(got) == sorted(names) and all(np.array_equal(got[k], tensors[k]) for k in names)
    assert sm.config.extra["do_lower_case"] is False and sm.config.hidden_act == "gelu_tanh"
    assert any(r.source.startswith("vars/") for r in sm.report)
    # control: saved_model.pb of one SavedModel beside the variables/ of another (another order)
    save_savedmodel(tf, tensors, order[::-1], n, H, str(tmp_path / "other"))
    shutil.rmtree(tmp_path / "sm" / "variables")
    shutil.copytree(tmp_path / "other" / "variables", tmp_path / "sm" / "variables")
    with pytest.raises(CheckpointError, match="files of two different SavedModels"):
        read(str(tmp_path / "sm"), "tf2", Options())


def save_savedmodel(tf, tensors, order, n, H, path):
    """tf.saved_model.save of the tensors as Model Garden stores them, named as it names them."""
    root = tf.Module()
    variables = []
    for canonical in order:
        a = tensors[canonical]
        spelled, transform = tf2.SAVED_TABLE.from_canonical(canonical)
        if transform == "heads_in":
            a = a.T.reshape(H, n, -1)
        elif transform == "heads_bias":
            a = a.reshape(n, -1)
        elif transform == "heads_out":
            a = a.T.reshape(n, -1, H)
        elif transform == "T":
            a = a.T.copy()
        variables.append(tf.Variable(a, name=spelled))
    root.vars = variables
    root.do_lower_case = tf.Variable(False, trainable=False, name="do_lower_case")
    tf.saved_model.save(root, path)


def test_hostile_object_graphs_are_one_line_errors(pair, tmp_path):
    prefix = os.path.join(pair[1], tf2.PREFIX_NAME)
    index = tf1_bundle.read_index(prefix)
    values = {k: tf1_bundle.read_tensor(prefix, e) for k, e in index.items() if k != tf2.OBJECT_GRAPH}
    config = os.path.join(pair[1], "bert_config.json")
    # 60 diamonds: 2**60 paths from the root; the walk stops at its bound
    diamonds = [tf2_object_graph.Node(children=[(i + 1, "a"), (i + 1, "b")]) for i in range(60)] + [tf2_object_graph.Node()]
    cases = {"paths": (tf2_object_graph.encode_object_graph(diamonds), "more than 200000 paths"),
             "truncated": (tf2_object_graph.encode_object_graph(diamonds)[:-3], "corrupt _CHECKPOINTABLE_OBJECT_GRAPH")}
    for name, (graph, message) in cases.items():
        tf1_bundle_writer.write_bundle(str(tmp_path / name / "ckpt"), {**values, tf2.OBJECT_GRAPH: graph})
        r = run_cli("convert", "tf22of", str(tmp_path / name), "-o", str(tmp_path / f"o-{name}"), "--config", config,
                    check=False)
        assert r.returncode == 1 and message in error_lines(r.stderr)[-1], (name, r.stderr)
        assert "Traceback" not in r.stderr and not (tmp_path / f"o-{name}").exists()
    # no nodes at all, and a name that is not UTF-8: one line each, not the internal-error fallback
    for name, graph, message in (("empty", b"", "the object graph has no nodes"),):
        tf1_bundle_writer.write_bundle(str(tmp_path / name / "ckpt"), {**values, tf2.OBJECT_GRAPH: graph})
        r = run_cli("convert", "tf22of", str(tmp_path / name), "-o", str(tmp_path / f"o-{name}"), "--config", config,
                    check=False)
        assert r.returncode == 1 and len(error_lines(r.stderr)) == 1 and message in error_lines(r.stderr)[-1], r.stderr
    # the object graph's bytes changed after the index was written: its CRC says so
    crc = tmp_path / "crc"
    tf1_bundle_writer.write_bundle(str(crc / "ckpt"), {**values, tf2.OBJECT_GRAPH: _graph_bytes(prefix)})
    data = crc / "ckpt.data-00000-of-00001"
    entry = tf1_bundle.read_index(str(crc / "ckpt"))[tf2.OBJECT_GRAPH]
    raw = bytearray(data.read_bytes())
    raw[entry.offset + entry.size - 1] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="CRC32C mismatch for tensor '_CHECKPOINTABLE_OBJECT_GRAPH'"):
        read(str(crc), "tf2", Options(config=config))


@pytest.mark.parametrize("keras_optimizer", ["legacy", "current"])
def test_we_read_a_training_checkpoint_with_adam_slots(tmp_path, keras_optimizer):
    """official.legacy.bert's layout: Checkpoint(model=..., optimizer=Keras Adam, global_step=its
    iterations) after one step. A legacy Keras optimizer's slots are found through the graph's
    slot_variables, a Keras 2.11+ one's by their names (``Adam/m/<variable>``)."""
    tf = pytest.importorskip("tensorflow")
    of = _of_checkpoint(tmp_path / "of", heads="squad", seed=6)
    tensors, src = _tensors(of, "of")
    enc = _module_tree(tf, {k: v for k, v in tensors.items() if k.startswith("bert.")}, src.config)
    qa = tf.Module()
    setattr(qa, "layer_with_weights-0", tf.Module())
    head = getattr(qa, "layer_with_weights-0")
    head.kernel = tf.Variable(tensors["qa_outputs.weight"].T.copy(), name="qa/kernel")
    head.bias = tf.Variable(tensors["qa_outputs.bias"], name="qa/bias")
    model = tf.Module()
    setattr(model, "layer_with_weights-0", enc)
    model.span_labeling = qa
    opt = (tf.keras.optimizers.legacy.Adam if keras_optimizer == "legacy" else tf.keras.optimizers.Adam)(1e-3, epsilon=1e-6)
    variables = list(enc.trainable_variables) + [head.kernel, head.bias]
    rng = np.random.default_rng(0)
    grads = [tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in variables]
    opt.apply_gradients(zip(grads, variables))
    tf.train.Checkpoint(model=model, optimizer=opt, global_step=opt.iterations).save(str(tmp_path / "ckpt" / "ctl_step"))
    got, read_src = _tensors(str(tmp_path / "ckpt"), "tf2", with_optimizer=True)  # no config beside: inferred
    state = {s.name: p() for s, p in read_src.optimizer}
    assert state["step"] == 1 and len(state) == 1 + 2 * len(variables)
    q = enc._transformer_layers[1]._attention_layer._query_dense.kernel

    def slot(var, name):  # TF's own slot
        if keras_optimizer == "legacy":
            return opt.get_slot(var, name).numpy()
        return next(s for s in opt.variables if s.name.split(":")[0] == f"Adam/{name}/{var.name.split(':')[0]}").numpy()
    assert np.array_equal(state["m/bert.encoder.layer.1.attention.self.query.weight"], slot(q, "m").reshape(32, 32).T)
    assert np.array_equal(state["v/qa_outputs.weight"], slot(head.kernel, "v").T)
    assert np.array_equal(got["qa_outputs.weight"], head.kernel.numpy().T)
    dropped = {r.note for r in read_src.report if r.action == "dropped"}
    assert "optimizer hyper-parameter (not state)" in dropped and read_src.optimizer_meta["bias_correction"] == "true"
    assert read_src.config.num_attention_heads == 4 and read_src.config.intermediate_size == 37
    plain = read(str(tmp_path / "ckpt"), "tf2", Options())  # without --with-optimizer: reported, not kept
    assert not plain.optimizer and sum(r.note.startswith("optimizer state") for r in plain.report) == len(state)


def test_the_object_graph_walk_is_linear(pair, tmp_path):
    """A chain of 30,000 nodes under the root, a variable at its end: the walk kept every path
    as a string (10k nodes 2.0 s / 175 MB, 30k nodes 23 s / 1.16 GB); now each step is a link."""
    import time

    prefix = os.path.join(pair[1], tf2.PREFIX_NAME)
    nodes = tf2_object_graph.parse_object_graph(_graph_bytes(prefix))
    base = len(nodes)
    chain = [tf2_object_graph.Node(children=[(base + k + 1, f"n{k}")]) for k in range(30_000)]
    chain[-1].children = []
    nodes += chain
    nodes[0].children.append((base, "deep"))
    t = time.perf_counter()
    paths = tf2_object_graph.aliases(nodes, "x")
    took = time.perf_counter() - t
    assert took < 1.0, took  # 23 s before
    nodes[-1].attributes = [("VARIABLE_VALUE", "deep", "")]
    t = time.perf_counter()
    paths = tf2_object_graph.aliases(nodes, "x")
    assert time.perf_counter() - t < 1.0
    assert paths[len(nodes) - 1] == ["deep/" + "/".join(f"n{k}" for k in range(29_999))]
    # read as a checkpoint (a 2,000-node chain: the key TF gives the variable spells its path out):
    # the deep variable is not BERT's, so it is named in one line
    nodes = nodes[:base + 2000]
    nodes[-1].children, nodes[-1].attributes = [], [("VARIABLE_VALUE", "deep", "")]
    odd = tmp_path / "deep"
    odd.mkdir()
    _rewrite_with_extra(prefix, str(odd / "ckpt"), nodes, np.ones(3, np.float32))
    r = run_cli("convert", "tf22of", str(odd), "-o", str(tmp_path / "o"), "--config",
                os.path.join(pair[1], "bert_config.json"), check=False)
    assert r.returncode == 1 and "unknown variable deep/n0/n1" in error_lines(r.stderr)[-1]
