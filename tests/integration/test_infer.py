"""Prediction batches (bert_of/training/inference.py:infer): the same outputs whatever the batch size, padding
(to the batch or to the maximum) or mode; one graph per call of infer, its rows per call bounded on CPU."""

import numpy as np
import pytest

from bert_of._flow import flow
from bert_of.config import BertConfig
from bert_of.heads import BertForQuestionAnswering, BertForSequenceClassification
from bert_of.heads import BertForTokenClassification
from bert_of.training.inference import infer
from bert_of.training.oneflow_engine import graph_rows
from bert_of.training.padding import PAD_MULTIPLE, length_batches, padded_width
from bert_of.training.runtime import Runtime

pytestmark = pytest.mark.oneflow

TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=96, num_labels=3)


def _rows(n=11, seq=80, seed=0):
    """n rows of varied lengths (5..seq tokens, padding after), as run_squad / GLUE features are."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, seq + 1, n)
    lengths[0] = seq  # one full row
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(5, TINY["vocab_size"], (n, seq)) * mask
    segs = (np.arange(seq)[None] >= lengths[:, None] // 2).astype(np.int64) * mask
    return [ids, segs, mask]


@pytest.fixture(scope="module")
def classifier():
    flow.manual_seed(1)
    return BertForSequenceClassification(BertConfig(**TINY, hidden_dropout_prob=0.1))  # dropout: eval turns it off


def test_classifier_logits_are_the_same_for_any_batch_size_padded_to_the_batch_or_the_maximum(classifier):
    rt, rows = Runtime.create("cpu"), _rows()
    (ref,) = infer(classifier, rows, ("logits",), 1, "eager", rt, pad_to_batch=False)
    assert ref.shape == (11, 3)
    for batch, to_batch in ((4, False), (32, False), (1, True), (4, True), (32, True)):
        stats = {}
        (got,) = infer(classifier, rows, ("logits",), batch, "eager", rt, pad_to_batch=to_batch, stats=stats)
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6, err_msg=f"batch {batch}, to the batch {to_batch}")
        # batches padded to the batch are cut to their longest row (one batch of all rows holds the full one)
        assert (stats["positions"] < 11 * 80) == (to_batch and batch < 11)
    assert not classifier.training


def test_short_rows_padded_to_the_batch_give_max_padding_predictions_and_probabilities():
    """The issue's equality: a sequence classifier over short rows (and one long) padded to each
    batch predicts the same classes, probabilities within 1e-5, as every row padded to S; rows
    come back in input order though they ran sorted by length."""
    flow.manual_seed(4)
    model = BertForSequenceClassification(BertConfig(**dict(TINY, num_labels=4)))
    rng = np.random.default_rng(7)
    n, seq = 37, 96
    lengths = rng.integers(3, 20, n)
    lengths[5] = seq  # one row at the cap
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int64)
    rows = [rng.integers(5, TINY["vocab_size"], (n, seq)) * mask, np.zeros((n, seq), np.int64), mask]
    rt = Runtime.create("cpu")
    (full,) = infer(model, rows, ("logits",), 8, "eager", rt, pad_to_batch=False)
    stats = {}
    (cut,) = infer(model, rows, ("logits",), 8, "eager", rt, stats=stats)
    softmax = lambda z: np.exp(z - z.max(1, keepdims=True)) / np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)  # noqa: E731
    assert (cut.argmax(1) == full.argmax(1)).all()
    np.testing.assert_allclose(softmax(cut.astype(np.float64)), softmax(full.astype(np.float64)), rtol=0, atol=1e-5)
    # one batch holds the long row; the other four are at most 24 tokens wide
    assert stats["positions"] <= 8 * seq + 29 * 24 < n * seq / 2
    # each row's own result: row i alone equals row i of the batch run (input order kept)
    (alone,) = infer(model, [r[9:10] for r in rows], ("logits",), 1, "eager", rt)
    np.testing.assert_allclose(alone[0], cut[9], rtol=0, atol=2e-6)


def test_a_graph_runs_short_rows_at_their_longest_with_one_graph(classifier):
    """Graph mode: one shape for every call (no graph per batch width), the longest row of all
    rounded up, not S; the same logits as eager."""
    rt, rows = Runtime.create("cpu"), _rows(n=9, seq=80, seed=5)
    rows = [np.where(np.arange(80)[None] < 17, r, 0) for r in rows]  # rows of at most 17 tokens
    (eager,) = infer(classifier, rows, ("logits",), 4, "eager", rt, pad_to_batch=False)
    stats = {}
    (graph,) = infer(classifier, rows, ("logits",), 4, "graph", rt, stats=stats)
    assert stats["graphs"] == 1 and stats["width"] == 24 and stats["positions"] <= 12 * 24
    np.testing.assert_allclose(graph, eager, rtol=0, atol=1e-5)


def test_a_tagger_padded_to_the_batch_tags_every_real_token_as_at_max_padding():
    """Position-wise outputs come back S wide: the real positions as at max padding, the rest ``fill``."""
    flow.manual_seed(6)
    model = BertForTokenClassification(BertConfig(**dict(TINY, num_labels=5)))
    rt, rows = Runtime.create("cpu"), _rows(n=13, seed=2)
    (full,) = infer(model, rows, ("logits",), 4, "eager", rt, pad_to_batch=False)
    (cut,) = infer(model, rows, ("logits",), 4, "eager", rt, positions=("logits",), fill=-np.inf)
    assert cut.shape == full.shape == (13, 80, 5)
    real = rows[2].astype(bool)
    np.testing.assert_allclose(cut[real], full[real], rtol=0, atol=2e-6)
    assert (cut.argmax(-1)[real] == full.argmax(-1)[real]).all()
    computed = np.isfinite(cut[..., 0])
    assert computed[real].all() and not computed.all()  # some padding positions were never run


def test_batches_by_length_cover_every_row_once_each_as_wide_as_its_longest():
    lengths = np.array([5, 70, 9, 9, 33, 1, 64])
    got = list(length_batches(lengths, 3, 64))
    assert sorted(np.concatenate([i for i, _ in got]).tolist()) == list(range(7))
    assert [w for _, w in got] == [64, 16, 8]  # the cap, 9 -> 16, 1 -> the multiple
    assert [i.tolist() for i, _ in got] == [[1, 6, 4], [2, 3, 0], [5]]  # longest first, ties in input order
    assert padded_width([17], 128) == 24 and padded_width([3], 128, multiple=1) == 3 and PAD_MULTIPLE == 8


def test_graph_predictions_equal_eager_with_one_graph_and_a_padded_last_call(classifier):
    rt, rows = Runtime.create("cpu"), _rows()
    (eager,) = infer(classifier, rows, ("logits",), 32, "eager", rt)
    stats = {}
    # a budget of 4 rows of one layer's activations: one layer graph, calls of 4 + 4 + 3 (padded) rows
    per_row = 2 ** 30 // graph_rows(classifier.config, 80, "cpu", 2 ** 30, layers=1)
    (graph,) = infer(classifier, rows, ("logits",), 32, "graph", rt, graph_budget=4 * per_row, stats=stats)
    assert stats["graphs"] == 1 and stats["batch_size"] == 4 and stats["build_seconds"] > 0 and stats["layerwise"]
    np.testing.assert_allclose(graph, eager, rtol=0, atol=1e-5)
    assert "forward" not in vars(classifier.bert.encoder)  # the encoder's own forward is back
    (again,) = infer(classifier, rows, ("logits",), 5, "eager", rt)
    np.testing.assert_allclose(again, eager, rtol=0, atol=2e-6)


def test_position_outputs_at_max_padding_keep_every_position_in_every_mode():
    flow.manual_seed(2)
    qa = BertForQuestionAnswering(BertConfig(**TINY))
    rt, rows = Runtime.create("cpu"), _rows(n=5)
    keep = dict(pad_to_batch=False)
    start, end = infer(qa, rows, ("start_logits", "end_logits"), 2, "eager", rt, **keep)
    s1, e1 = infer(qa, rows, ("start_logits", "end_logits"), 5, "eager", rt, **keep)
    s2, e2 = infer(qa, rows, ("start_logits", "end_logits"), 5, "graph", rt, graph_budget=1, **keep)  # 1 row per call
    assert start.shape == end.shape == s2.shape == (5, 80)
    np.testing.assert_allclose(start, s1, rtol=0, atol=2e-6)
    np.testing.assert_allclose(end, e1, rtol=0, atol=2e-6)
    np.testing.assert_allclose(s2, s1, rtol=0, atol=1e-5)
    np.testing.assert_allclose(e2, e1, rtol=0, atol=1e-5)
    # padded to the batch: the same at every real position
    s3, e3 = infer(qa, rows, ("start_logits", "end_logits"), 2, "eager", rt,
                   positions=("start_logits", "end_logits"), fill=-1e4)
    real = rows[2].astype(bool)
    np.testing.assert_allclose(s3[real], s1[real], rtol=0, atol=2e-6)
    np.testing.assert_allclose(e3[real], e1[real], rtol=0, atol=2e-6)


def test_cpu_graph_rows_follow_the_activation_budget():
    minilm = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    base = BertConfig()
    assert graph_rows(minilm, 384, "cpu") == 1 and graph_rows(base, 384, "cpu") == 1
    assert graph_rows(minilm, 128, "cpu") > graph_rows(minilm, 384, "cpu")
    assert graph_rows(minilm, 384, "cpu", budget=10 * 2 ** 30) > 1
    assert graph_rows(base, 384, "cuda") is None  # CUDA graphs share memory: the batch is kept


def test_cpu_train_graph_splits_a_step_into_micro_batches_that_fit():
    from bert_of.training.oneflow_engine import graph_accum_steps

    minilm = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    assert graph_accum_steps(minilm, 384, 32, "cpu") == 32  # one row per micro-batch at 384 tokens
    assert graph_accum_steps(minilm, 128, 32, "cpu") == 16
    assert graph_accum_steps(minilm, 128, 32, "cpu", k=32) == 32  # a multiple of what was asked
    assert graph_accum_steps(minilm, 128, 32, "cpu", budget=4 * 2 ** 30) == 4  # 15 rows fit: 4 x 8
    assert graph_accum_steps(minilm, 128, 32, "cpu", k=8, budget=4 * 2 ** 30) == 8
    assert graph_accum_steps(minilm, 384, 32, "cuda", k=2) == 2
    tiny = BertConfig(**TINY)
    assert graph_accum_steps(tiny, 80, 32, "cpu") == 1


def test_a_graph_step_in_micro_batches_equals_the_whole_batch_step():
    """What train() relies on when it splits a CPU graph step: the same losses and weights."""
    from bert_of.options import TrainConfig
    from bert_of.training.trainer import Trainer

    ids, segs, mask = _rows(n=8, seq=48, seed=3)
    batch = dict(input_ids=ids, token_type_ids=segs, attention_mask=mask,
                 start_positions=np.arange(8) % 5 + 1, end_positions=np.arange(8) % 5 + 3)
    runs = []
    for k in (1, 4):
        flow.manual_seed(5)
        model = BertForQuestionAnswering(BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        tr = Trainer(model, TrainConfig(mode="graph", lr=1e-3, steps=10, grad_accum_steps=k))
        losses = [tr.step(batch)["loss"] for _ in range(3)]
        runs.append((losses, model.qa_outputs.weight.numpy().copy()))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=1e-5)
    np.testing.assert_allclose(runs[1][1], runs[0][1], rtol=0, atol=1e-5)


def test_a_model_whose_layers_differ_predicts_through_one_whole_model_graph():
    """Query-key layer scaling gives every layer its own function, so no layer-by-layer run: the
    graph is the whole model (BertGraph), padded to its rows per call, returning the outputs asked for."""
    flow.manual_seed(3)
    qa = BertForQuestionAnswering(BertConfig(**TINY, query_key_layer_scaling=True))
    rt, rows = Runtime.create("cpu"), _rows(n=5)
    pos = dict(positions=("start_logits", "end_logits"), fill=-1e4)
    s1, e1 = infer(qa, rows, ("start_logits", "end_logits"), 5, "eager", rt, **pos)
    stats = {}
    s2, e2 = infer(qa, rows, ("start_logits", "end_logits"), 2, "graph", rt, stats=stats, **pos)  # calls of 2, 2, 1 + pad
    assert stats["graphs"] == 1 and not stats["layerwise"] and stats["batch_size"] == 2
    np.testing.assert_allclose(s2, s1, rtol=0, atol=1e-5)
    np.testing.assert_allclose(e2, e1, rtol=0, atol=1e-5)


@pytest.mark.parametrize("head", ["classify", "tag"])
def test_a_fine_tuning_step_on_a_batch_padded_to_its_longest_row_has_the_max_padding_loss(head):
    """ShuffledRows(pad_to_batch=True) draws the same rows and cuts them to the batch's longest row:
    the step-1 loss (and the next, after an AdamW update) equal the max-padded batch's within 1e-6
    relative (dropout off: its masks are drawn per shape, so they differ with the width)."""
    from bert_of.training.loop import ShuffledRows
    from bert_of.training.optim import TrainConfig
    from bert_of.training.trainer import Trainer

    rng = np.random.default_rng(11)
    n, seq = 24, 96
    lengths = rng.integers(4, 30, n)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(5, TINY["vocab_size"], (n, seq)) * mask
    if head == "classify":
        cls, labels = BertForSequenceClassification, rng.integers(0, 3, n)
    else:
        cls, labels = BertForTokenClassification, np.where(mask == 1, rng.integers(0, 3, (n, seq)), -100)
    arrays = dict(input_ids=ids, token_type_ids=np.zeros_like(ids), attention_mask=mask, labels=labels)
    rt, runs = Runtime.create("cpu"), []
    for to_batch in (False, True):
        flow.manual_seed(5)
        model = cls(BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        tr = Trainer(model, TrainConfig(mode="eager", lr=1e-3, steps=10, seed=3), rt)
        data = ShuffledRows(arrays, 8, 3, rt, pad_to_batch=to_batch)
        batches = [data.next_batch() for _ in range(2)]
        runs.append(([tr.step(b)["loss"] for b in batches], [b["input_ids"].shape[1] for b in batches]))
    (full, full_w), (cut, cut_w) = runs
    assert full_w == [seq, seq] and all(w < 40 for w in cut_w)
    np.testing.assert_allclose(cut[0], full[0], rtol=1e-6)
    np.testing.assert_allclose(cut[1], full[1], rtol=1e-5)
