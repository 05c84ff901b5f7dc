"""HF Keras weights (tf_model.h5): h52of / of2h5 against files transformers itself wrote.

The fixtures in tests/data/h5/ were written by transformers 4.57.6
``TFBertForPreTraining`` / ``TFBertModel`` / ``TFBertForQuestionAnswering`` /
``TFBertForSequenceClassification.save_pretrained`` (see make_fixtures.py),
with HF-TF's forward outputs on a fixed batch beside them: an independent
reference, no transformers needed here. Keras itself (TF 2.15) loads what we
write.
"""

import gzip
import json
import os
import shutil

import h5py
import numpy as np
import pytest

from tests.conftest import ROOT, TINY, error_lines, run_cli, write_vocab

DATA = os.path.join(ROOT, "tests", "data", "h5")
FIXTURES = ("pretraining", "bare", "qa", "classifier")
SCOPES = {"pretraining": "tf_bert_for_pre_training", "bare": "tf_bert_model", "qa": "tf_bert_for_question_answering",
          "classifier": "tf_bert_for_sequence_classification"}
INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def unpack(name, dst):
    """A fixture as HF wrote it: dst/tf_model.h5 + dst/config.json (no vocab.txt)."""
    os.makedirs(dst)
    with gzip.open(os.path.join(DATA, name, "tf_model.h5.gz"), "rb") as g, \
            open(os.path.join(dst, "tf_model.h5"), "wb") as f:
        shutil.copyfileobj(g, f)
    shutil.copyfile(os.path.join(DATA, name, "config.json"), os.path.join(dst, "config.json"))
    return dst


def expected(name):
    with np.load(os.path.join(DATA, name, "expected.npz"), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def describe(path):
    """Everything in an h5 file: every group's and the root's attrs (with their HDF5
    string types), every dataset's dtype, shape and bytes."""
    out = {}

    def attrs(obj):
        d = {}
        for k in obj.attrs:
            a = obj.attrs.get_id(k)
            v = obj.attrs[k]
            d[k] = (type(a.get_type()).__name__, a.shape, v.tolist() if hasattr(v, "tolist") else v)
        return d

    with h5py.File(path, "r") as f:
        out["/"] = attrs(f)

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = (obj.dtype.str, obj.shape, obj[()].tobytes(), attrs(obj))
            else:
                out[name] = attrs(obj)
        f.visititems(visit)
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("h5")
    for name in FIXTURES:
        unpack(name, str(r / name))
    write_vocab(r / "vocab.txt", 99)
    return r


@pytest.fixture(scope="module")
def of_dirs(root):
    """Each fixture converted once with the real CLI."""
    out = {}
    for name in FIXTURES:
        r = run_cli("convert", "h52of", root / name, "-o", root / f"{name}-of", "--vocab", root / "vocab.txt")
        out[name] = (root / f"{name}-of", r.stdout)
    return out


def _run(path, batch, fmt="of", **opts):
    from bert_of.converters.source import Options
    from bert_of.converters.convert import read
    from bert_of.converters.verify.compare import run_bert_of

    return run_bert_of(read(str(path), fmt, Options(**opts)), batch)


# --------------------------------------------------------------------------- forward equality


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.oneflow
def test_h52of_reproduces_hf_tf_outputs_eager_and_graph(of_dirs, name):
    exp = expected(name)
    runs = _run(of_dirs[name][0], {k: exp[k] for k in INPUTS})
    outputs = {k for k in exp if k not in INPUTS}
    assert outputs >= {"sequence_output"} and ("pooled_output" in outputs) == (name != "qa")
    for mode, out in runs.items():
        for k in outputs:
            diff = float(np.max(np.abs(out[k].astype(np.float64) - exp[k])))
            assert diff <= 1e-5, (name, mode, k, diff)
    cfg = json.loads((of_dirs[name][0] / "config.json").read_text())
    hf = json.loads(open(os.path.join(DATA, name, "config.json")).read())
    # HF semantics: "gelu" is erf, "gelu_new" tanh; eps from config.json
    assert cfg["hidden_act"] == {"gelu": "gelu_erf", "gelu_new": "gelu_tanh", "relu": "relu"}[hf["hidden_act"]]
    assert cfg["layer_norm_eps"] == hf["layer_norm_eps"] and cfg["provenance"] == "hf"
    assert cfg["num_labels"] == (3 if name == "classifier" else 2)


@pytest.mark.oneflow
def test_wrong_numerics_are_visible(root):
    """--numerics tf1 (tanh GELU) on an erf model misses HF's outputs by far more than 1e-5."""
    exp = expected("pretraining")
    out = _run(root / "pretraining", {k: exp[k] for k in INPUTS}, fmt="h5", numerics="tf1")["eager"]
    assert np.max(np.abs(out["sequence_output"] - exp["sequence_output"])) > 1e-4


@pytest.mark.oneflow
def test_verify_h5_against_of(root, of_dirs, tmp_path):
    r = run_cli("verify", root / "pretraining", of_dirs["pretraining"][0], "-o", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert r.returncode == 0 and report["ok"] and report["a"]["format"] == "h5" and report["b"]["format"] == "of"
    assert set(report["max_abs_diff"]) == {"B:eager", "B:graph"} and report["reference"] == "numpy-float64 (h5 layout)"


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", ["pretraining", "bare", "qa"])
def test_round_trip_h5_of_h5_is_bit_exact(root, of_dirs, tmp_path, name):
    of, stdout = of_dirs[name]
    counts = {"pretraining": "67 source tensors: 5 dropped, 62 mapped",  # 5 tied embedding copies
              "bare": "55 source tensors: 55 mapped",
              "qa": "55 source tensors: 55 mapped"}
    assert counts[name] in stdout
    if name == "qa":  # TFBertForQuestionAnswering has no pooler: zeros fill bert_of's, said in the report
        r = run_cli("convert", "h52of", root / "qa", "-o", tmp_path / "qa-of", "--vocab", root / "vocab.txt", "-v")
        assert "qa_outputs.weight  (transposed; no pooler in the source (TFBertForQuestionAnswering has none)" \
            in r.stdout
        from bert_of.checkpoint import load_safetensors
        pooler = load_safetensors(str(of / "model.safetensors"))["bert.pooler.dense.weight"]
        assert pooler.shape == (32, 32) and not pooler.any()
    r = run_cli("convert", "of2h5", of, "-o", tmp_path / "back")
    a, b = describe(root / name / "tf_model.h5"), describe(tmp_path / "back" / "tf_model.h5")
    assert list(a) == list(b)
    for k in a:
        assert a[k] == b[k], k
    assert a["/"]["layer_names"][2] == {"pretraining": ["bert", "nsp___cls", "mlm___cls"], "bare": ["bert"],
                                        "qa": ["bert", "qa_outputs"]}[name]
    assert all(w.startswith(SCOPES[name] + "/") for w in a["bert"]["weight_names"][2])
    # config.json byte for byte (unknown HF keys travel in config.extra)
    assert (tmp_path / "back" / "config.json").read_bytes() == (root / name / "config.json").read_bytes()
    assert (tmp_path / "back" / "vocab.txt").read_bytes() == (root / "vocab.txt").read_bytes()
    assert ("no pooler" in r.stdout) == (name == "qa")


def test_classifier_round_trip_keeps_every_weight(root, of_dirs, tmp_path):
    """HF's own file lists a weightless dropout_NN layer (its name is a Keras counter); we write none."""
    run_cli("convert", "of2h5", of_dirs["classifier"][0], "-o", tmp_path / "back")
    a, b = describe(root / "classifier" / "tf_model.h5"), describe(tmp_path / "back" / "tf_model.h5")
    dropout = [k for k in a if k.startswith("dropout_")]
    assert len(dropout) == 1 and a[dropout[0]]["weight_names"][2] == []
    assert b["/"]["layer_names"][2] == ["bert", "classifier"]
    assert {k: v for k, v in a.items() if k not in dropout + ["/"]} == {k: v for k, v in b.items() if k != "/"}
    assert json.loads((tmp_path / "back" / "config.json").read_text()) == \
        json.loads((root / "classifier" / "config.json").read_text())


@pytest.mark.tf
def test_h5_tf_h5_through_the_hub(root, tmp_path):
    """h52tf --verify (bert_of on the h5 vs the TF reference on what we wrote), then tf2h5: bit-exact."""
    r = run_cli("convert", "h52tf", root / "pretraining", "-o", tmp_path / "tf", "--vocab", root / "vocab.txt", "--verify", "--json")
    report = json.loads(r.stdout)
    assert report["ok"] and report["reference"] == "numpy-float64 (h5 layout)" and report["worst"] <= 1e-5
    # what we wrote, run by TensorFlow's graph of Google's code and by the reference in Google's layout
    assert {"B:tf-float64", "B:numpy-float64 (tf layout)", "B:eager", "B:graph"} == set(report["max_abs_diff"])
    exp = expected("pretraining")
    run_cli("convert", "tf2h5", tmp_path / "tf", "-o", tmp_path / "h5")
    a, b = describe(root / "pretraining" / "tf_model.h5"), describe(tmp_path / "h5" / "tf_model.h5")
    assert a == b
    assert json.loads((tmp_path / "h5" / "config.json").read_text()) == \
        json.loads((root / "pretraining" / "config.json").read_text())
    out = _run(tmp_path / "h5", {k: exp[k] for k in INPUTS}, fmt="h5")["graph"]
    assert np.max(np.abs(out["prediction_logits"] - exp["prediction_logits"])) <= 1e-5


def _fp16_copy(src, dst):
    os.makedirs(dst)
    shutil.copyfile(os.path.join(src, "config.json"), os.path.join(dst, "config.json"))
    with h5py.File(os.path.join(src, "tf_model.h5"), "r") as a, h5py.File(os.path.join(dst, "tf_model.h5"), "w") as b:
        for k, v in a.attrs.items():
            b.attrs[k] = v

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                b.create_dataset(name, data=obj[()].astype(np.float16))
            else:
                g = b.require_group(name)
                for k, v in obj.attrs.items():
                    g.attrs[k] = v
        a.visititems(visit)
        b.require_group("top_level_model_weights").attrs["weight_names"] = []
    return dst


def test_fp16_kept_through_the_round_trip_unless_dtype(root, tmp_path):
    from bert_of.checkpoint import SafetensorsFile

    src = _fp16_copy(str(root / "pretraining"), str(tmp_path / "fp16"))
    run_cli("convert", "h52of", src, "-o", tmp_path / "of", "--vocab", root / "vocab.txt")
    with SafetensorsFile(str(tmp_path / "of" / "model.safetensors")) as f:
        assert {str(f.dtype(k)) for k in f.keys()} == {"float16"}
    run_cli("convert", "of2h5", tmp_path / "of", "-o", tmp_path / "back")
    a, b = describe(os.path.join(src, "tf_model.h5")), describe(tmp_path / "back" / "tf_model.h5")
    assert {k: v for k, v in a.items() if k != "/"} == {k: v for k, v in b.items() if k != "/"}
    run_cli("convert", "of2h5", tmp_path / "of", "-o", tmp_path / "f32", "--dtype", "float32")
    with h5py.File(os.path.join(src, "tf_model.h5"), "r") as a, h5py.File(tmp_path / "f32" / "tf_model.h5", "r") as b:
        k = "bert/tf_bert_for_pre_training/bert/encoder/layer_._2/output/dense/kernel:0"
        assert b[k].dtype == np.float32 and np.array_equal(b[k][()], a[k][()].astype(np.float32))


# --------------------------------------------------------------------------- Keras loads what we write


def _keras_model(path):
    """A Keras model whose layers and weights carry the file's names (the shape of HF's
    classes, no transformers): layer per layer_names entry, weights in weight_names order,
    the MLM layer holding references to the embedding variables like HF's does."""
    import tensorflow as tf

    with h5py.File(path, "r") as f:
        layers = [str(n) for n in f.attrs["layer_names"]]
        names = {g: [str(w) for w in f[g].attrs["weight_names"]] for g in layers}
        specs = {g: [(f[g][w].shape, f[g][w].dtype) for w in names[g]] for g in layers}
    scope = names["bert"][0].split("/")[0]

    class Holder(tf.keras.layers.Layer):
        def __init__(self, own, shared, **kw):
            super().__init__(**kw)
            self.own, self.shared = own, shared

        def build(self, input_shape):
            for name, shape, dtype in self.own:
                self.add_weight(name=name[:-len(":0")], shape=shape, dtype=dtype, initializer="zeros")
            if self.shared:
                self.tied = self.shared()
            super().build(input_shape)

        def call(self, x):
            return x

    class Model(tf.keras.Model):
        def __init__(self):
            super().__init__(name=scope)
            self.holders = []
            for g in layers:
                own = [(w.split("/", 2)[2], s, d) for w, (s, d) in zip(names[g], specs[g]) if w.split("/")[1] == g]
                tied = [w for w in names[g] if w.split("/")[1] != g]
                shared = (lambda tied=tied: [next(v for v in self.holders[0].weights if v.name == t) for t in tied]) \
                    if tied else None
                self.holders.append(Holder(own, shared, name=g))

        def call(self, x):
            for h in self.holders:
                x = h(x)
            return x

    model = Model()
    model(tf.zeros((1,)))
    return model, names


@pytest.mark.tf
def test_keras_loads_h5_written_from_a_tf1_checkpoint(tmp_path):
    """tf2h5 of a Google checkpoint: Keras' load_weights takes it by topology, the values are
    the checkpoint's, and Keras' own save_weights of that model writes the same file."""
    from bert_of.converters.containers import tf1_bundle
    from bert_of.converters.verify import tf_reference_checkpoint as ref

    d = tmp_path / "tf"
    d.mkdir()
    ref.make_checkpoint(str(d / "bert_model.ckpt"), dict(TINY), seed=5, heads=("pretraining",), realistic=True,
                        with_optimizer=True, global_step=7)
    (d / "bert_config.json").write_text(json.dumps(TINY))
    write_vocab(d / "vocab.txt", TINY["vocab_size"])
    r = run_cli("convert", "tf2h5", d, "-o", tmp_path / "h5", "--with-optimizer")
    assert "optimizer state is not representable in HF Keras h5" in r.stdout
    n_opt = sum(1 for n in tf1_bundle.read_index(str(d / "bert_model.ckpt")) if n.endswith(("adam_m", "adam_v")))
    assert f"{n_opt + 1} optimizer tensor(s) not written" in r.stdout  # + global_step
    cfg = json.loads((tmp_path / "h5" / "config.json").read_text())
    assert cfg["hidden_act"] == "gelu_new" and cfg["layer_norm_eps"] == 1e-12  # Google's tanh GELU, in HF's words
    assert cfg["architectures"] == ["BertForPreTraining"] and cfg["model_type"] == "bert"

    path = str(tmp_path / "h5" / "tf_model.h5")
    model, names = _keras_model(path)
    for layer in model.layers:
        assert [w.name for w in layer.weights] == names[layer.name]  # the file's names, HF's order
    model.load_weights(path)
    ckpt = {n: tf1_bundle.read_tensor(str(d / "bert_model.ckpt"), e)
            for n, e in tf1_bundle.read_index(str(d / "bert_model.ckpt")).items()}
    bert = {w.name: w.numpy() for w in model.layers[0].weights}
    kernel = "tf_bert_for_pre_training/bert/encoder/layer_._1/attention/self/value/kernel:0"
    assert np.array_equal(bert[kernel], ckpt["bert/encoder/layer_1/attention/self/value/kernel"])
    assert np.array_equal(model.layers[1].weights[0].numpy(), ckpt["cls/seq_relationship/output_weights"].T)
    assert np.array_equal(bert["tf_bert_for_pre_training/bert/embeddings/word_embeddings/weight:0"],
                          ckpt["bert/embeddings/word_embeddings"])
    model.save_weights(str(tmp_path / "keras.h5"))
    assert describe(tmp_path / "keras.h5") == describe(path)


# --------------------------------------------------------------------------- bad input


def _truncate(d):
    p = d / "tf_model.h5"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _garbage(d):
    (d / "tf_model.h5").write_bytes(os.urandom(4096))


def _not_bert(d):
    import tensorflow as tf

    (d / "tf_model.h5").unlink()
    m = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,), name="dense")])
    m.save_weights(str(d / "tf_model.h5"))


def _wrong_shape(d):
    name = "bert/tf_bert_for_pre_training/bert/encoder/layer_._1/intermediate/dense/kernel:0"
    with h5py.File(d / "tf_model.h5", "r+") as f:
        del f[name]
        f.create_dataset(name, data=np.zeros((32, 36), np.float32))


def _config_misfit(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 40
    (d / "config.json").write_text(json.dumps(cfg))


def _no_config(d):
    (d / "config.json").unlink()


def _untied(d):
    name = "mlm___cls/tf_bert_for_pre_training/bert/embeddings/word_embeddings/weight:0"
    with h5py.File(d / "tf_model.h5", "r+") as f:
        f[name][7, 3] += 1.0


def _unlisted(d):
    with h5py.File(d / "tf_model.h5", "r+") as f:
        f.create_dataset("bert/extra/step:0", data=np.zeros(3, np.float32))


BAD = {
    "truncated": (_truncate, "tf_model.h5: truncated HDF5 file ("),
    "garbage": (_garbage, "tf_model.h5: not a readable HDF5 file"),
    "not bert": (_not_bert, "not a HF BERT Keras h5"),
    "wrong shape": (_wrong_shape, "dataset bert/tf_bert_for_pre_training/bert/encoder/layer_._1/intermediate/dense/"
                                  "kernel:0 has shape [32, 36] but the config implies [32, 37]"),
    "config misfit": (_config_misfit, "intermediate/dense/kernel:0 has shape [32, 37] but the config implies [32, 40]"),
    "missing config": (_no_config, "config.json: config file not found (pass --config)"),
    "untied embeddings": (_untied, "dataset mlm___cls/tf_bert_for_pre_training/bert/embeddings/word_embeddings/"
                                   "weight:0 differs from bert/tf_bert_for_pre_training/bert/embeddings/"),
    "unlisted dataset": (_unlisted, "unknown dataset bert/extra/step:0"),
    "missing vocab": (None, "a bert_of checkpoint needs one (HuggingFace and Keras directories often lack it: pass --vocab)"),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.tf) if c == "not bert" else c for c in BAD])  # Keras writes it
def test_bad_input_one_line_nonzero_no_output(root, tmp_path, case):
    breaker, needle = BAD[case]
    src = tmp_path / "src"
    shutil.copytree(root / "pretraining", src)
    if breaker:
        breaker(src)
    out = tmp_path / "out"
    out.mkdir()
    vocab = [] if case == "missing vocab" else ["--vocab", root / "vocab.txt"]
    r = run_cli("convert", "h52of", src, "-o", out / "of", *vocab, check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith("bert-of: error: "), lines
    assert needle in lines[0], lines[0]
    assert os.listdir(out) == []  # no partial output, no temp leftovers


def test_of2h5_refuses_bfloat16_and_leaves_nothing(of_dirs, tmp_path):
    run_cli("convert", "of2of", of_dirs["bare"][0], "-o", tmp_path / "bf16", "--dtype", "bfloat16")
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli("convert", "of2h5", tmp_path / "bf16", "-o", out / "h5", check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and "--dtype float32" in lines[0], lines
    assert os.listdir(out) == []


def test_detect_directory_and_file(root):
    from bert_of.converters.convert import detect

    assert detect(str(root / "bare")) == "h5"
    assert detect(str(root / "bare" / "tf_model.h5")) == "h5"


@pytest.mark.tf
def test_long_name_lists_split_like_keras(tmp_path):
    """Keras splits attributes past HDF5's 64 KB header limit into name0, name1, ...; we read and write that."""
    from keras.src.saving.legacy.hdf5_format import load_attributes_from_hdf5_group

    from bert_of.converters.formats import h5 as fmt
    from bert_of.converters.formats.h5 import write as h5_write

    names = [f"tf_bert_model/bert/encoder/layer_._{i}/attention/self/query/kernel:0" for i in range(1200)]
    with h5py.File(tmp_path / "a.h5", "w") as f:
        h5_write._set_list_attr(f, "weight_names", names)
        assert "weight_names" not in f.attrs and "weight_names1" in f.attrs
        assert fmt._attr_list(f, "weight_names") == names
        assert [n.decode() if isinstance(n, bytes) else n for n in load_attributes_from_hdf5_group(f, "weight_names")] \
            == names


def test_model_scope_read_from_the_file(root, tmp_path):
    """Keras numbers a second model of a class (tf_bert_model_1): the scope comes from the file."""
    src = tmp_path / "src"
    shutil.copytree(root / "bare", src)
    with h5py.File(src / "tf_model.h5", "r+") as f:
        g = f["bert"]
        g.move("tf_bert_model", "tf_bert_model_1")
        g.attrs["weight_names"] = [w.replace("tf_bert_model/", "tf_bert_model_1/", 1).encode()
                                   for w in g.attrs["weight_names"]]
    from bert_of.converters.source import Options
    from bert_of.converters.formats.h5 import read

    got = read(str(src), Options()).load()
    want = read(str(root / "bare"), Options()).load()
    assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)
