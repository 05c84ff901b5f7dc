"""transformers' calls as people type them, held to transformers' own answers: ``forward`` with
``position_ids`` / ``head_mask`` / ``inputs_embeds``, the embedding table API
(``get_input_embeddings``, ``set_input_embeddings``, ``resize_token_embeddings``),
``from_pretrained(..., ignore_mismatched_sizes=True)`` and ``from_pretrained(..., vocab=...)``, a
wrong ``X2of`` naming the format the folder is.

transformers' answers are recorded by tests/data/hf/make_transformers_calls.py (transformers
4.57.6 on ``tiny_pt/``, checked with 5.25.0); where transformers is installed, the last test asks
it again in-process. Every other check is on bert_of's side for real: the same computation
reached two ways (ids vs their embedding rows, default vs explicit positions, a silenced head vs
its value projection zeroed)."""

import json
import os
import shutil

import numpy as np
import pytest

from bert_of import BertForPreTraining, BertForSequenceClassification, BertModel
from bert_of._flow import flow
from bert_of.errors import CheckpointError, ConfigError, InputError, MissingVocab
from tests.conftest import ROOT, error_lines, run_cli, write_vocab

pytestmark = pytest.mark.oneflow

DATA = os.path.join(ROOT, "tests", "data", "hf")
TINY_PT = os.path.join(DATA, "tiny_pt")


@pytest.fixture(scope="module", autouse=True)
def home(tmp_path_factory):
    """Converted copies go to a home of this module's own."""
    saved = os.environ.get("BERT_OF_HOME")
    os.environ["BERT_OF_HOME"] = str(tmp_path_factory.mktemp("home"))
    yield os.environ["BERT_OF_HOME"]
    if saved is None:
        os.environ.pop("BERT_OF_HOME", None)
    else:
        os.environ["BERT_OF_HOME"] = saved


@pytest.fixture(scope="module")
def ref():
    with np.load(os.path.join(DATA, "transformers_calls.npz"), allow_pickle=False) as d:
        rec = {k: d[k] for k in d.files}
    with np.load(os.path.join(DATA, "tiny_pt_outputs.npz"), allow_pickle=False) as d:
        rec.update({k: d[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    return rec


@pytest.fixture(scope="module")
def model():
    return BertModel.from_pretrained(TINY_PT)


def run(model, **kw):
    with flow.no_grad():
        return model(**kw)


def close(a, b, tol=1e-5):
    diff = float(np.max(np.abs(np.asarray(a, np.float64) - b)))
    assert diff < tol, diff


# --------------------------------------------------------------------------- forward's keywords


def test_position_ids_and_inputs_embeds_give_transformers_outputs(model, ref):
    batch = {k: ref[k] for k in ("token_type_ids", "attention_mask")}
    out = run(model, input_ids=ref["input_ids"], position_ids=ref["position_ids"], **batch)
    close(out.last_hidden_state.numpy(), ref["pos_sequence_output"])
    close(out.pooler_output.numpy(), ref["pos_pooled_output"])
    out = run(model, inputs_embeds=ref["inputs_embeds"], **batch)
    close(out.last_hidden_state.numpy(), ref["embeds_sequence_output"])
    close(out.pooler_output.numpy(), ref["embeds_pooled_output"])


def test_the_same_computation_reached_two_ways(model, ref):
    ids, batch = ref["input_ids"], {k: ref[k] for k in ("token_type_ids", "attention_mask")}
    plain = run(model, input_ids=ids, **batch).last_hidden_state.numpy()
    rows = model.get_input_embeddings().weight.numpy()[ids]  # the ids' own word vectors
    assert np.array_equal(run(model, inputs_embeds=rows, **batch).last_hidden_state.numpy(), plain)
    S = ids.shape[1]
    for pos in (np.arange(S)[None], np.tile(np.arange(S), (ids.shape[0], 1))):  # [1, S] and [B, S]
        assert np.array_equal(run(model, input_ids=ids, position_ids=pos, **batch).last_hidden_state.numpy(), plain)
    assert np.array_equal(run(model, input_ids=ids, head_mask=np.ones(4), **batch).last_hidden_state.numpy(), plain)


def test_head_mask_gives_transformers_4_outputs_and_attentions(model, ref):
    out = run(model, input_ids=ref["input_ids"], token_type_ids=ref["token_type_ids"],
              attention_mask=ref["attention_mask"], head_mask=ref["head_mask"], output_attentions=True)
    close(out.last_hidden_state.numpy(), ref["head_sequence_output"])
    close(np.stack([a.numpy() for a in out.attentions]), ref["head_attentions"])


def test_a_silenced_head_is_its_value_projection_zeroed(ref):
    """head_mask 0 for head 1 of layer 0 == that head's value rows and bias zero (its context is 0)."""
    masked = BertModel.from_pretrained(TINY_PT)
    zeroed = BertModel.from_pretrained(TINY_PT)
    D = zeroed.config.hidden_size // zeroed.config.num_attention_heads
    value = zeroed.encoder.layer[0].attention.self.value
    with flow.no_grad():
        w, b = value.weight.numpy().copy(), value.bias.numpy().copy()
        w[D:2 * D], b[D:2 * D] = 0, 0
        value.weight.copy_(flow.tensor(w))
        value.bias.copy_(flow.tensor(b))
    hm = np.ones((3, 4), np.float32)
    hm[0, 1] = 0
    a = run(masked, input_ids=ref["input_ids"], head_mask=hm).last_hidden_state.numpy()
    b = run(zeroed, input_ids=ref["input_ids"]).last_hidden_state.numpy()
    close(a, b, 1e-6)


@pytest.mark.parametrize("kw,message", [
    ({"inputs_embeds": "ids"}, "exactly one of input_ids or inputs_embeds (not both)"),
    ({"input_ids": None}, "exactly one of input_ids or inputs_embeds"),
    ({"inputs_embeds": np.zeros((1, 4, 31), np.float32), "input_ids": None}, "inputs_embeds: expected [batch, sequence, 32]"),
    ({"position_ids": np.array([[0, 1, 2, 40]])}, "position_ids holds 40, outside [0, 40)"),
    ({"position_ids": np.array([[0, 1, 2]])}, "position_ids: shape [1, 3], expected [1, 4] or [1, 4]"),
    ({"position_ids": np.array([[0.0, 1, 2, 3]])}, "position_ids: expected integers"),
    ({"head_mask": np.ones(3)}, "head_mask: shape [3], expected [4] (every layer) or [3, 4]"),
    ({"head_mask": np.full(4, 2.0)}, "head_mask holds 2: 1 keeps a head, 0 silences it"),
    ({"head_mask": np.array([1, 0, np.nan, 1])}, "head_mask holds nan"),
    # OneFlow 0.9's max skips NaN: the gate counts them (a NaN mask passed before)
    ({"attention_mask": np.array([[1.0, np.nan, 1.0, 1.0]])}, "attention_mask holds nan"),
], ids=range(10))
def test_the_input_gate_refuses_them_in_one_line(model, kw, message):
    kw = dict(kw)
    ids = np.array([[2, 7, 9, 3]])
    if isinstance(kw.get("inputs_embeds"), str):
        kw["inputs_embeds"] = np.zeros((1, 4, 32), np.float32)
    kw.setdefault("input_ids", ids)
    with pytest.raises(InputError) as e:
        model(**kw)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_heads_take_the_keywords_too(ref):
    clf = BertForSequenceClassification.from_pretrained(TINY_PT, num_labels=3)
    rows = clf.get_input_embeddings().weight.numpy()[ref["input_ids"]]
    a = run(clf, input_ids=ref["input_ids"]).logits.numpy()
    assert np.array_equal(run(clf, inputs_embeds=rows).logits.numpy(), a)
    assert run(clf, input_ids=ref["input_ids"], head_mask=ref["head_mask"]).logits.shape == (3, 3)


# --------------------------------------------------------------------------- the embedding table


def test_resize_token_embeddings_as_transformers(ref):
    model = BertForPreTraining.from_pretrained(TINY_PT)
    old = model.get_input_embeddings().weight.numpy().copy()
    old_bias = model.cls.predictions.bias.numpy().copy()
    table = model.resize_token_embeddings(105, mean_resizing=False)
    assert table is model.get_input_embeddings() and tuple(table.weight.shape) == (105, 32)
    assert model.config.vocab_size == 105 and model.bert.config.vocab_size == 105
    new = table.weight.numpy()
    assert np.array_equal(new[:99], old) and 0.005 < new[99:].std() < 0.05  # N(0, initializer_range)
    assert np.array_equal(model.cls.predictions.bias.numpy(), ref["resized_bias"])  # transformers': kept, then 0
    out = run(model, input_ids=np.array([[2, 104, 3]]))
    assert tuple(out.prediction_logits.shape) == (1, 3, 105)
    with pytest.raises(InputError, match="holds 105, outside \\[0, 105\\)"):
        model(np.array([[2, 105, 3]]))
    model.resize_token_embeddings(110)  # mean_resizing: the old rows' mean, the bias' mean
    w = model.get_input_embeddings().weight.numpy()
    close(w[105:], np.broadcast_to(new.mean(axis=0), (5, 32)), 1e-6)
    close(model.cls.predictions.bias.numpy()[105:], np.full(5, ref["resized_bias"].mean()), 1e-6)
    assert model.resize_token_embeddings(None, pad_to_multiple_of=64).num_embeddings == 128
    model.resize_token_embeddings(50)  # shrinking keeps the first rows
    assert np.array_equal(model.get_input_embeddings().weight.numpy(), old[:50])
    assert model.cls.predictions.bias.shape == (50,) and model.config.vocab_size == 50


def test_set_input_embeddings_replaces_the_table_the_gate_checks():
    model = BertModel.from_pretrained(TINY_PT)
    table = flow.nn.Embedding(120, 32)
    model.set_input_embeddings(table)
    assert model.get_input_embeddings() is table and model.config.vocab_size == 120
    assert tuple(run(model, input_ids=np.array([[2, 119]])).last_hidden_state.shape) == (1, 2, 32)
    with pytest.raises(ConfigError, match="width 32"):
        model.set_input_embeddings(flow.nn.Embedding(10, 16))
    mlm = BertForPreTraining.from_pretrained(TINY_PT)
    with pytest.raises(ConfigError, match="resize_token_embeddings\\(120\\)"):
        mlm.set_input_embeddings(flow.nn.Embedding(120, 32))


# --------------------------------------------------------------------------- from_pretrained's keywords


def test_ignore_mismatched_sizes_reinitialises_the_head_with_a_note(tmp_path, capsys):
    two = BertForSequenceClassification.from_pretrained(TINY_PT, num_labels=2)
    two.save_pretrained(str(tmp_path / "two"), vocab_file=os.path.join(TINY_PT, "vocab.txt"))
    with pytest.raises(CheckpointError) as e:
        BertForSequenceClassification.from_pretrained(str(tmp_path / "two"), num_labels=3)
    assert "classifier.weight: checkpoint shape [2, 32] != model shape [3, 32]" in str(e.value)
    assert "ignore_mismatched_sizes=True" in str(e.value) and "\n" not in str(e.value)
    capsys.readouterr()
    three = BertForSequenceClassification.from_pretrained(str(tmp_path / "two"), num_labels=3,
                                                          ignore_mismatched_sizes=True)
    assert "classifier.weight newly initialised: the checkpoint's is [2, 32], the model's [3, 32]" in \
        capsys.readouterr().err
    assert three.loading_info["mismatched"] == [("classifier.weight", (2, 32), (3, 32)),
                                                ("classifier.bias", (2,), (3,))]
    ids = np.array([[2, 7, 9, 3]])
    assert tuple(run(three, input_ids=ids).logits.shape) == (1, 3)
    assert np.array_equal(run(three, input_ids=ids).pooled_output.numpy(), run(two, input_ids=ids).pooled_output.numpy())


def test_from_pretrained_vocab_for_a_model_only_folder(tmp_path):
    hf = tmp_path / "model_only"
    hf.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(TINY_PT, name), hf / name)
    with pytest.raises(MissingVocab) as e:
        BertModel.from_pretrained(str(hf))
    assert "pass vocab='path/to/vocab.txt'" in str(e.value) and "--vocab" not in str(e.value)
    r = run_cli("convert", "hf2of", hf, "-o", tmp_path / "cli", check=False, process=True)
    assert r.returncode == 1 and "pass --vocab" in error_lines(r.stderr)[-1], r.stderr
    model = BertModel.from_pretrained(str(hf), vocab=os.path.join(TINY_PT, "vocab.txt"))
    assert open(model.vocab_file).read() == open(os.path.join(TINY_PT, "vocab.txt")).read()
    close(run(model, input_ids=np.array([[2, 7, 3]])).last_hidden_state.numpy(),
          run(BertModel.from_pretrained(TINY_PT), input_ids=np.array([[2, 7, 3]])).last_hidden_state.numpy(), 1e-7)
    short = write_vocab(tmp_path / "short.txt", 50)
    with pytest.raises(ConfigError, match="50 tokens but the model's vocab_size is 99"):
        BertModel.from_pretrained(TINY_PT, vocab=short)
    with pytest.raises(CheckpointError, match="vocab='nope.txt': no such file"):
        BertModel.from_pretrained(str(hf), vocab="nope.txt")


def test_a_model_folder_with_tokenizer_json_only_loads_with_its_vocabulary(tmp_path):
    hf = tmp_path / "fast"
    hf.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(TINY_PT, name), hf / name)
    spec = json.load(open(os.path.join(DATA, "tokenizer_json", "tokenizer.json"), encoding="utf-8"))
    tokens = open(os.path.join(TINY_PT, "vocab.txt"), encoding="utf-8").read().split()
    spec["model"]["vocab"] = {t: i for i, t in enumerate(tokens)}
    (hf / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    model = BertModel.from_pretrained(str(hf))
    assert open(model.vocab_file, encoding="utf-8").read().split() == tokens


def test_a_wrong_direction_names_the_format_the_folder_is(tmp_path):
    for direction, said in (("tf2of", "this is an hf checkpoint, not tf: hf2of reads it"),
                            ("h52of", "this is an hf checkpoint, not h5: hf2of reads it"),
                            ("of2hf", "this is an hf checkpoint, not of: it is hf already")):
        r = run_cli("convert", direction, TINY_PT, "-o", tmp_path / direction, check=False, process=True)
        lines = error_lines(r.stderr)
        assert r.returncode == 1 and lines == [f"bert-of: error: {TINY_PT}: {said}"], r.stderr
        assert not (tmp_path / direction).exists()


# --------------------------------------------------------------------------- transformers itself


def test_against_transformers_in_process_where_installed(model, ref):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertModel.from_pretrained(TINY_PT, attn_implementation="eager").eval()
    t = {k: torch.tensor(ref[k]) for k in ("input_ids", "token_type_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        want = theirs(**t).last_hidden_state.numpy()
        want_embeds = theirs(inputs_embeds=torch.tensor(ref["inputs_embeds"]), token_type_ids=t["token_type_ids"],
                             attention_mask=t["attention_mask"]).last_hidden_state.numpy()
    close(run(model, **{k: ref[k] for k in t}).last_hidden_state.numpy(), want)
    close(run(model, inputs_embeds=ref["inputs_embeds"], token_type_ids=ref["token_type_ids"],
              attention_mask=ref["attention_mask"]).last_hidden_state.numpy(), want_embeds)
    pt = transformers.BertForPreTraining.from_pretrained(TINY_PT).eval()
    pt.resize_token_embeddings(105, mean_resizing=False)
    ours = BertForPreTraining.from_pretrained(TINY_PT)
    ours.resize_token_embeddings(105, mean_resizing=False)
    assert ours.config.vocab_size == pt.config.vocab_size == 105
    assert np.array_equal(ours.cls.predictions.bias.numpy(), pt.cls.predictions.bias.detach().numpy())
    assert np.array_equal(ours.get_input_embeddings().weight.numpy()[:99],
                          pt.get_input_embeddings().weight.detach().numpy()[:99])
