"""The model API's one input gate (bert_of/inputs.py): what OneFlow would abort on or compute
silently wrong is an InputError (a ValueError) or InputTypeError (a TypeError) naming the input."""

import subprocess
import sys

import numpy as np
import pytest

from bert_of import (BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
                     BertForTokenClassification, BertModel, InputError)
from bert_of._flow import flow
from bert_of.errors import InputTypeError
from tests.conftest import ROOT, TINY

pytestmark = pytest.mark.oneflow

CFG = BertConfig.from_google_dict(TINY)  # vocab 99, 2 labels
B, S = 2, 6


def _model(cls=BertModel, **overrides):
    from dataclasses import replace
    m = cls(replace(CFG, **overrides) if overrides else CFG)
    m.init_weights(seed=3)
    return m.eval()


def _ids(b=B, s=S):
    return (np.arange(b * s, dtype=np.int64).reshape(b, s) % 90) + 5


# --------------------------------------------------------------------------- aborts: a subprocess each

ABORTS = {
    "empty batch": "BertModel(cfg)(np.zeros((0, 6), np.int64))",
    "empty sequence": "BertModel(cfg)(np.zeros((2, 0), np.int64))",
    "masked_lm_positions past the sequence": "BertForPreTraining(cfg)(np.ones((2, 6), np.int64), "
                                             "masked_lm_positions=np.array([[0, 6], [1, 2]]))",
}


@pytest.mark.parametrize("case", sorted(ABORTS))
def test_what_oneflow_aborts_on_is_an_exception(case):
    code = ("import numpy as np\nfrom bert_of import BertConfig, BertModel, BertForPreTraining\n"
            f"from tests.conftest import TINY\ncfg = BertConfig.from_google_dict(TINY)\n{ABORTS[case]}\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])  # not -6 (SIGABRT)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("bert_of.errors.InputError: "), last
    assert ("empty batch" in last) if "empty" in case else ("masked_lm_positions holds 6, outside [0, 6)" in last)


# --------------------------------------------------------------------------- ids, types, masks


def test_a_1d_attention_mask_is_refused_not_ignored():
    model = _model()
    with pytest.raises(InputError, match=r"attention_mask: shape \[6\] does not fit input_ids \[2, 6\]"):
        model(_ids(), attention_mask=np.array([1, 1, 1, 0, 0, 0]))


def test_masks_2d_3d_and_4d_mean_the_same_keep_and_drop():
    model = _model()
    ids = _ids()
    mask = np.ones((B, S), np.int64)
    mask[1, 3:] = 0
    want = model(ids, attention_mask=mask).sequence_output.numpy()
    per_query = np.broadcast_to(mask[:, None, :], (B, S, S)).copy()  # every query sees the same keys
    got3 = model(ids, attention_mask=per_query).sequence_output.numpy()
    got4 = model(ids, attention_mask=flow.tensor(per_query[:, None].astype(bool))).sequence_output.numpy()
    # within float rounding: with autograd on, a [B, 1, 1, S] mask takes the CPU training kernel's softmax,
    # a per-query one OneFlow's
    np.testing.assert_allclose(got3, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got4, want, rtol=0, atol=1e-5)
    assert not np.array_equal(model(ids).sequence_output.numpy()[1], want[1])  # the mask does something


def test_additive_masks_and_bad_shapes_are_refused():
    model = _model()
    with pytest.raises(InputError, match="attention_mask holds -10000: a mask holds 1"):
        model(_ids(), attention_mask=np.full((B, S), -10000.0))
    with pytest.raises(InputError, match=r"token_type_ids: shape \[2, 5\] != input_ids' \[2, 6\]"):
        model(_ids(), token_type_ids=np.zeros((B, S - 1), np.int64))
    with pytest.raises(InputError, match=r"input_ids: expected integers shaped \[batch, sequence\], got int64 \[6\]"):
        model(np.arange(6))
    with pytest.raises(InputTypeError, match="input_ids: expected integers"):
        model(flow.tensor(_ids(), dtype=flow.float32))
    with pytest.raises(TypeError):  # a TypeError for Python too
        model(np.ones((B, S), np.float32))
    with pytest.raises(InputError, match="input_ids holds 99, outside \\[0, 99\\)"):
        model(np.full((B, S), 99))


# --------------------------------------------------------------------------- labels, every head


@pytest.mark.parametrize("bad", [2, -1, 10 ** 9])
def test_sequence_classification_labels_outside_the_classes(bad):
    model = _model(BertForSequenceClassification)
    with pytest.raises(InputError, match=f"labels holds {bad}, outside \\[0, 2\\).*num_labels 2"):
        model(_ids(), labels=[0, bad])
    with pytest.raises(InputError, match=f"labels holds {bad}"):  # as a tensor: the device reduction
        model(flow.tensor(_ids()), labels=flow.tensor([bad, 1], dtype=flow.int64))


def test_ignore_index_is_ignored_where_transformers_ignores_it():
    model = _model(BertForSequenceClassification)
    both = model(_ids(), labels=[1, 0]).loss.numpy()
    logits = model(_ids()).logits.numpy()
    first = np.log(np.exp(logits[0]).sum()) - logits[0, 1]  # cross-entropy of row 0 alone
    np.testing.assert_allclose(model(_ids(), labels=[1, -100]).loss.numpy(), first, rtol=1e-5)
    assert not np.isclose(both, first)
    tok = _model(BertForTokenClassification)
    labels = np.full((B, S), -100)
    labels[0, 1] = 1
    assert np.isfinite(tok(_ids(), labels=labels).loss.numpy())
    labels[1, 0] = -1
    with pytest.raises(InputError, match="labels holds -1, outside \\[0, 2\\) \\(or -100, ignored\\)"):
        tok(_ids(), labels=labels)
    labels[1, 0] = 0
    labels[1, 2] = 2
    with pytest.raises(InputError, match="labels holds 2"):
        tok(_ids(), labels=labels)


def test_regression_and_multi_label_targets():
    reg = _model(BertForSequenceClassification, num_labels=1)
    assert np.isfinite(reg(_ids(), labels=[0.5, 3.0]).loss.numpy())
    with pytest.raises(InputError, match="labels holds nan: targets must be finite"):
        reg(_ids(), labels=[0.5, float("nan")])
    multi = _model(BertForSequenceClassification, num_labels=3, problem_type="multi_label_classification")
    assert np.isfinite(multi(_ids(), labels=[[1, 0, 1], [0, 0, 1]]).loss.numpy())
    with pytest.raises(InputError, match=r"labels: shape \[2\], expected \[2, 3\]"):
        multi(_ids(), labels=[1, 2])
    with pytest.raises(InputError, match="labels holds 2: multi-label targets are 0 or 1"):
        multi(_ids(), labels=[[1, 0, 2], [0, 0, 1]])


@pytest.mark.parametrize("bad", [5000, -1, 99])
def test_mlm_labels_outside_the_vocabulary(bad):
    model = _model(BertForPreTraining)
    labels = np.full((B, S), -100)
    labels[0, 2] = 7
    assert np.isfinite(model(_ids(), labels=labels).loss.numpy())
    labels[1, 3] = bad
    with pytest.raises(InputError, match=f"labels holds {bad}, outside \\[0, 99\\).*vocab_size is 99"):
        model(_ids(), labels=labels)
    with pytest.raises(InputError, match=f"masked_lm_ids holds {bad}"):
        model(_ids(), masked_lm_positions=[[1, 2], [3, 4]], masked_lm_ids=[[5, bad], [6, 7]])


def test_nsp_labels_and_pretraining_shapes():
    model = _model(BertForPreTraining)
    for bad in (2, -1):
        with pytest.raises(InputError, match=f"next_sentence_labels holds {bad}.*0 \\(is next\\) or 1"):
            model(_ids(), next_sentence_labels=[0, bad])
        with pytest.raises(InputError, match=f"next_sentence_labels holds {bad}"):
            model(_ids(), next_sentence_label=[bad, 1])  # transformers' spelling
    with pytest.raises(InputError, match="masked_lm_positions holds -1"):
        model(_ids(), masked_lm_positions=[[0, -1], [1, 2]])
    with pytest.raises(InputError, match=r"masked_lm_ids: shape \[2, 3\], expected \[2, 2\]"):
        model(_ids(), masked_lm_positions=[[0, 1], [1, 2]], masked_lm_ids=[[5, 6, 7], [6, 7, 8]])
    with pytest.raises(InputError, match=r"masked_lm_positions: shape \[2, 0\], expected \[2, P\] with P >= 1"):
        model(_ids(), masked_lm_positions=np.zeros((B, 0), np.int64))


def test_squad_positions_outside_the_sequence():
    model = _model(BertForQuestionAnswering)
    assert np.isfinite(model(_ids(), start_positions=[0, 5], end_positions=[1, 5]).loss.numpy())
    with pytest.raises(InputError, match="end_positions holds 6, outside \\[0, 6\\)"):
        model(_ids(), start_positions=[0, 5], end_positions=[1, 6])
    with pytest.raises(InputError, match=r"start_positions: shape \[3\], expected \[2\]"):
        model(_ids(), start_positions=[0, 1, 2], end_positions=[1, 2])


def test_a_graph_checks_its_inputs_before_running():
    from bert_of.modeling import BertGraph

    graph = BertGraph(_model())
    with pytest.raises(InputError, match="input_ids holds 99, outside \\[0, 99\\)"):
        graph(flow.tensor(np.full((B, S), 99), dtype=flow.int64))
    with pytest.raises(InputError, match=r"attention_mask: shape \[6\]"):
        graph(flow.tensor(_ids()), attention_mask=flow.tensor(np.ones(S, np.int64)))
