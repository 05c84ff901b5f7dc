"""The model API a transformers user expects: hidden states and attention probabilities,
return_dict=False tuples, NumPy and list inputs, one error for ids the model cannot look up,
save_pretrained into an existing folder, and vocabularies that must fit their model."""

import json
import os
import re
from dataclasses import replace

import numpy as np
import pytest

from bert_of import (BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
                     BertForTokenClassification, BertModel, BertOfError, InputError)
from bert_of._flow import flow
from bert_of.checkpoint import load_checkpoint
from bert_of.converters.verify.compare import make_batch
from tests.conftest import ROOT, TINY, error_lines, run_cli, write_vocab
from tests.helpers.models import DEV11, LENGTHS, build_vocab, tiny_bert

pytestmark = pytest.mark.oneflow

CFG = BertConfig.from_google_dict(TINY)
L, N, H = CFG.num_hidden_layers, CFG.num_attention_heads, CFG.hidden_size
HEADS = [BertModel, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
         BertForTokenClassification]


def _model(cls=BertModel, config=CFG, seed=1):
    m = cls(config)
    m.init_weights(seed=seed)
    return m.eval()


def _batch(b=2, s=9, seed=0):
    """NumPy int64 [b, s] ids, types, mask (the second row padded at its end)."""
    batch = make_batch(CFG, batch_size=b, seq_len=s, seed=seed)
    arrays = [np.asarray(batch[k], np.int64) for k in ("input_ids", "token_type_ids", "attention_mask")]
    arrays[2][1, s - 3:] = 0
    return arrays


def _t(arrays):
    return [flow.tensor(a, dtype=flow.int64) for a in arrays]


# --------------------------------------------------------------------------- hidden states, attentions


@pytest.mark.parametrize("pre_ln", [False, True])
def test_hidden_states_and_attentions_have_transformers_shapes(pre_ln):
    config = replace(CFG, layernorm_placement="pre") if pre_ln else CFG
    model = _model(config=config)
    ids, tt, mask = _t(_batch(b=2, s=9))
    out = model(ids, token_type_ids=tt, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == L + 1 and len(out.attentions) == L
    assert all(tuple(h.shape) == (2, 9, H) for h in out.hidden_states)
    assert all(tuple(a.shape) == (2, N, 9, 9) for a in out.attentions)
    assert np.array_equal(out.hidden_states[-1].numpy(), out.sequence_output.numpy())
    plain = model(ids, token_type_ids=tt, attention_mask=mask)  # asking for them changes nothing else
    assert plain.hidden_states is None and plain.attentions is None
    # (within float rounding: with autograd on, the probabilities asked for come from OneFlow's softmax,
    # the plain run's from the CPU training kernel's, as transformers' eager attention and its sdpa)
    np.testing.assert_allclose(plain.sequence_output.numpy(), out.sequence_output.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(plain.pooled_output.numpy(), out.pooled_output.numpy(), rtol=0, atol=1e-5)


def test_attention_probabilities_are_rows_of_a_softmax_over_the_unmasked_keys():
    model = _model()
    ids, tt, mask = _batch(b=2, s=9)
    out = model(*_t([ids, tt, mask]), output_attentions=True)
    for a in out.attentions:
        p = a.numpy()
        np.testing.assert_allclose(p.sum(-1), 1.0, rtol=0, atol=1e-5)
        assert (p >= 0).all()
        assert p[1, :, :, mask[1] == 0].max() < 1e-6  # padded keys get (almost) nothing


def _np_layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def test_layer0_attention_probabilities_equal_a_numpy_computation_from_the_weights():
    model = _model(seed=4)
    ids, tt, mask = _batch(b=2, s=9, seed=5)
    out = model(*_t([ids, tt, mask]), output_hidden_states=True, output_attentions=True)
    w = {k: v.astype(np.float64) for k, v in model.canonical_state().items()}
    e = "bert.embeddings."
    S = ids.shape[1]
    x = w[e + "word_embeddings.weight"][ids] + w[e + "token_type_embeddings.weight"][tt] \
        + w[e + "position_embeddings.weight"][:S][None]
    x = _np_layer_norm(x, w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"], CFG.layer_norm_eps)
    np.testing.assert_allclose(out.hidden_states[0].numpy(), x, rtol=0, atol=1e-5)
    a = "bert.encoder.layer.0.attention.self."
    D = H // N

    def heads(name):
        y = x @ w[a + name + ".weight"].T + w[a + name + ".bias"]
        return y.reshape(2, S, N, D).transpose(0, 2, 1, 3)

    scores = heads("query") @ heads("key").transpose(0, 1, 3, 2) / np.sqrt(D)
    scores = scores + (1.0 - mask[:, None, None, :]) * -10000.0
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(out.attentions[0].numpy(), probs, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- tuples


def _same(a, b):
    """The same outputs in the same order, within float rounding (a run asking for the attention
    probabilities takes OneFlow's softmax, one without the CPU training kernel's)."""
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and np.allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-5)


def test_return_dict_false_gives_transformers_tuple_order():
    ids, tt, mask = _t(_batch())
    flags = dict(output_hidden_states=True, output_attentions=True)
    bare = _model()
    d = bare(ids, tt, mask, **flags)
    t = bare(ids, tt, mask, return_dict=False, **flags)
    assert _same(t, (d.sequence_output, d.pooled_output, d.hidden_states, d.attentions))
    assert _same(bare(ids, tt, mask, return_dict=False), (d.sequence_output, d.pooled_output))
    assert _same(bare(ids, tt, mask, return_dict=False, output_attentions=True),
                 (d.sequence_output, d.pooled_output, d.attentions))
    clf = _model(BertForSequenceClassification)
    labels = flow.tensor([0, 1], dtype=flow.int64)
    d = clf(ids, tt, mask, labels=labels, **flags)
    t = clf(ids, tt, mask, labels=labels, return_dict=False, **flags)
    assert _same(t, (d.loss, d.logits, d.hidden_states, d.attentions))
    qa = _model(BertForQuestionAnswering)
    d = qa(ids, tt, mask, output_hidden_states=True)
    assert _same(qa(ids, tt, mask, return_dict=False, output_hidden_states=True),
                 (d.start_logits, d.end_logits, d.hidden_states))
    pt = _model(BertForPreTraining)
    d = pt(ids, tt, mask, output_attentions=True)
    assert _same(pt(ids, tt, mask, return_dict=False, output_attentions=True),
                 (d.prediction_logits, d.seq_relationship_logits, d.attentions))


@pytest.mark.parametrize("cls", HEADS)
def test_every_head_passes_hidden_states_and_attentions_on(cls):
    model = _model(cls)
    ids, tt, mask = _t(_batch())
    out = model(ids, tt, mask, output_hidden_states=True, output_attentions=True)
    bare = BertModel(CFG)
    bare.load_canonical(model.canonical_state())  # the same backbone weights
    ref = bare.eval()(ids, tt, mask, output_hidden_states=True, output_attentions=True)
    assert _same(out.hidden_states, ref.hidden_states) and _same(out.attentions, ref.attentions)


# --------------------------------------------------------------------------- NumPy and list inputs


@pytest.mark.parametrize("cls", HEADS)
def test_numpy_and_list_inputs_give_the_outputs_of_flow_tensors(cls):
    model = _model(cls)
    arrays = _batch()
    ref = model(*_t(arrays)).to_dict()
    for given in (arrays, [a.tolist() for a in arrays], [a.astype(np.int32) for a in arrays],
                  arrays[:2] + [arrays[2].astype(np.float32)]):  # a float mask, as transformers takes
        got = model(given[0], token_type_ids=given[1], attention_mask=given[2]).to_dict()
        assert set(got) == set(ref)
        for k in ref:
            assert np.array_equal(got[k].numpy(), ref[k].numpy()), k


def test_numpy_labels_give_the_loss_of_flow_labels():
    arrays = _batch()
    clf = _model(BertForSequenceClassification)
    labels = np.array([1, 0])
    assert clf(*arrays, labels=labels).loss.numpy() == clf(*_t(arrays), labels=flow.tensor(labels)).loss.numpy()
    pt = _model(BertForPreTraining)
    mlm = np.where(arrays[2] == 1, arrays[0], -100)
    a = pt(*arrays, labels=mlm, next_sentence_label=[0, 1])
    b = pt(*_t(arrays), labels=flow.tensor(mlm), next_sentence_label=flow.tensor([0, 1]))
    assert a.loss.numpy() == b.loss.numpy()


def test_inputs_that_are_not_integer_matrices_are_one_error():
    model = _model()
    with pytest.raises(InputError, match=r"input_ids: expected integers shaped \[batch, sequence\], got float64"):
        model(np.zeros((2, 5)))
    with pytest.raises(InputError, match=r"got int64 \[5\]"):
        model([1, 2, 3, 4, 5])


# --------------------------------------------------------------------------- range checks


def test_ids_types_and_lengths_the_embeddings_cannot_look_up_are_one_error():
    model = _model(BertForSequenceClassification)
    ids, tt, mask = _batch(s=9)
    assert issubclass(InputError, BertOfError)
    V, T, P = CFG.vocab_size, CFG.type_vocab_size, CFG.max_position_embeddings
    cases = []
    for value in (V, V + 57, -1):
        bad = ids.copy()
        bad[1, 4] = value
        cases.append(((bad, tt), f"input_ids holds {value}, outside [0, {V}): the model's vocab_size is {V}"))
    bad = tt.copy()
    bad[0, 2] = T
    cases.append(((ids, bad), f"token_type_ids holds {T}, outside [0, {T}): the model's type_vocab_size is {T}"))
    long = np.ones((1, P + 1), np.int64)
    cases.append(((long, None), f"input of {P + 1} tokens is longer than the model's max_position_embeddings {P}"))
    for (i, t), message in cases:
        for conv in (lambda a: a, lambda a: None if a is None else flow.tensor(a, dtype=flow.int64)):
            with pytest.raises(InputError) as e:
                model(conv(i), token_type_ids=conv(t))
            assert str(e.value) == message
    model(np.full((1, P), V - 1), token_type_ids=np.full((1, P), T - 1))  # the limits themselves are fine


def test_cli_on_a_checkpoint_whose_vocabulary_outgrows_its_model_is_one_line(tmp_path):
    """A checkpoint whose vocab.txt defines more ids than its embedding table: fine-tuning and
    (graph) evaluation stop with one line before any graph runs."""
    vocab, n = build_vocab(tmp_path / "vocab.txt")
    small = n // 2
    ck = tiny_bert(tmp_path / "small", vocab, small, dropout=0.0)
    home = {"BERT_OF_HOME": str(tmp_path / "home")}
    pattern = rf"bert-of: error: input_ids holds (\d+), outside \[0, {small}\): the model's vocab_size is {small}"
    runs = [("eval", "squad", "--model", ck, "--data", DEV11, *LENGTHS, "--mode", "graph", "-o", tmp_path / "ev"),
            ("finetune", "classify", "--model", ck, "--train", os.path.join(ROOT, "tests", "data", "user",
                                                                          "sentiment-train.csv"),
             "-o", tmp_path / "ft", "--steps", 1, "--max-seq-length", 32)]
    for args in runs:
        r = run_cli(*args, "-q", check=False, env=home)  # -q: errors only (no notes on the new head)
        lines = error_lines(r.stderr)
        assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        m = re.fullmatch(pattern, lines[0])
        assert m and small <= int(m.group(1)) < n, lines
    assert not (tmp_path / "ev").exists() and not (tmp_path / "ft").exists()


# --------------------------------------------------------------------------- save_pretrained


def test_save_pretrained_into_an_existing_folder_keeps_foreign_files_and_replaces_ours(tmp_path):
    folder = tmp_path / "ck"
    first, second = _model(BertForPreTraining, seed=1), _model(BertForPreTraining, seed=2)
    first.save_pretrained(str(folder), vocab_file=write_vocab(tmp_path / "v1.txt", CFG.vocab_size))
    (folder / "README.md").write_text("my notes\n")
    (folder / "optimizer.safetensors").write_bytes(b"left from other weights")
    v2 = tmp_path / "v2.txt"
    v2.write_text("\n".join(f"w{i}" for i in range(CFG.vocab_size)) + "\n")
    second.save_pretrained(str(folder), vocab_file=str(v2))
    assert sorted(os.listdir(folder)) == ["README.md", "config.json", "model.safetensors", "vocab.txt"]
    assert (folder / "README.md").read_text() == "my notes\n"
    assert (folder / "vocab.txt").read_bytes() == v2.read_bytes()
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == CFG.vocab_size
    saved = load_checkpoint(str(folder)).tensors
    want = second.canonical_state()
    assert set(saved) == set(want) and all(np.array_equal(saved[k], want[k]) for k in want)
    assert sorted(os.listdir(tmp_path)) == ["ck", "v1.txt", "v2.txt"]  # no staging folder left
    back = BertForPreTraining.from_pretrained(str(folder))  # read straight into its parameters
    got = back.canonical_state()
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    ids, tt, mask = _t(_batch())
    assert np.array_equal(back(ids, token_type_ids=tt, attention_mask=mask).prediction_logits.numpy(),
                          second.eval()(ids, token_type_ids=tt, attention_mask=mask).prediction_logits.numpy())
    back.save_pretrained(str(folder))  # into the folder it was loaded from, its own vocab.txt included
    assert (folder / "vocab.txt").read_bytes() == v2.read_bytes()


def test_save_pretrained_errors_speak_to_a_python_caller(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("x")
    with pytest.raises(BertOfError) as e:
        _model().save_pretrained(str(target))
    assert str(e.value) == f"{target}: exists and is not a directory" and "--" not in str(e.value)
    assert target.read_text() == "x"


# --------------------------------------------------------------------------- vocabularies


def test_a_vocab_that_does_not_fit_the_model_is_refused_with_both_numbers(tmp_path):
    hf = os.path.join(ROOT, "tests", "data", "hf", "tiny_pt")
    n = json.load(open(os.path.join(hf, "config.json")))["vocab_size"]
    for size in (n + 1, n - 1):
        vocab = write_vocab(tmp_path / f"v{size}.txt", size)
        r = run_cli("convert", "hf2of", hf, "-o", tmp_path / "of", "--vocab", vocab, check=False)
        assert r.returncode == 1 and error_lines(r.stderr) == [
            f"bert-of: error: {vocab} has {size} tokens but the model's vocab_size is {n}: not this model's "
            "vocabulary"], r.stderr
    assert not (tmp_path / "of").exists()
    vocab, n = build_vocab(tmp_path / "vocab.txt")
    ck = tiny_bert(tmp_path / "tiny", vocab, n, dropout=0.0)
    other = write_vocab(tmp_path / "other.txt", n + 3)
    r = run_cli("finetune", "classify", "--model", ck, "--vocab", other, "--train",
                os.path.join(ROOT, "tests", "data", "user", "sentiment-train.csv"), "-o", tmp_path / "ft",
                "--steps", 1, check=False, env={"BERT_OF_HOME": str(tmp_path / "home")})
    assert r.returncode == 1 and error_lines(r.stderr) == [
        f"bert-of: error: {other} has {n + 3} tokens but the model's vocab_size is {n}: not this model's "
        "vocabulary"], r.stderr
    assert not (tmp_path / "ft").exists()
