"""Prediction batches (bert_of/training/inference.py:infer): the same outputs whatever the batch size, length
bucketing or mode; one graph per call of infer, its rows per call bounded on CPU."""

import numpy as np
import pytest

from bert_of._flow import flow
from bert_of.config import BertConfig
from bert_of.heads import BertForQuestionAnswering, BertForSequenceClassification
from bert_of.training.inference import LENGTH_STEP, graph_rows, infer
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


def test_classifier_logits_are_the_same_for_any_batch_size_with_or_without_bucketing(classifier):
    rt, rows = Runtime.create("cpu"), _rows()
    (ref,) = infer(classifier, rows, ("logits",), 1, "eager", rt)
    assert ref.shape == (11, 3)
    for batch, bucket in ((4, False), (32, False), (1, True), (4, True), (32, True)):
        stats = {}
        (got,) = infer(classifier, rows, ("logits",), batch, "eager", rt, bucket=bucket, stats=stats)
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6, err_msg=f"batch {batch}, bucket {bucket}")
        # bucketed batches are cut to their longest row (one batch of all rows holds the full one)
        assert (stats["positions"] < 11 * 80) == (bucket and batch < 11)
    assert not classifier.training


def test_graph_predictions_equal_eager_with_one_graph_and_a_padded_last_call(classifier):
    rt, rows = Runtime.create("cpu"), _rows()
    (eager,) = infer(classifier, rows, ("logits",), 32, "eager", rt)
    stats = {}
    # a budget of 4 rows of one layer's activations: one layer graph, calls of 4 + 4 + 3 (padded) rows
    per_row = 2 ** 30 // graph_rows(classifier.config, 80, "cpu", 2 ** 30, layers=1)
    (graph,) = infer(classifier, rows, ("logits",), 32, "graph", rt, bucket=True, graph_budget=4 * per_row,
                     stats=stats)
    assert stats["graphs"] == 1 and stats["batch_size"] == 4 and stats["build_seconds"] > 0 and stats["layerwise"]
    np.testing.assert_allclose(graph, eager, rtol=0, atol=1e-5)
    assert "forward" not in vars(classifier.bert.encoder)  # the encoder's own forward is back
    (again,) = infer(classifier, rows, ("logits",), 5, "eager", rt)
    np.testing.assert_allclose(again, eager, rtol=0, atol=2e-6)


def test_position_outputs_keep_every_position(classifier):
    flow.manual_seed(2)
    qa = BertForQuestionAnswering(BertConfig(**TINY))
    rt, rows = Runtime.create("cpu"), _rows(n=5)
    start, end = infer(qa, rows, ("start_logits", "end_logits"), 2, "eager", rt)
    s1, e1 = infer(qa, rows, ("start_logits", "end_logits"), 5, "eager", rt)
    s2, e2 = infer(qa, rows, ("start_logits", "end_logits"), 5, "graph", rt, graph_budget=1)  # 1 row per call
    assert start.shape == end.shape == s2.shape == (5, 80)
    np.testing.assert_allclose(start, s1, rtol=0, atol=2e-6)
    np.testing.assert_allclose(end, e1, rtol=0, atol=2e-6)
    np.testing.assert_allclose(s2, s1, rtol=0, atol=1e-5)
    np.testing.assert_allclose(e2, e1, rtol=0, atol=1e-5)


def test_cpu_graph_rows_follow_the_activation_budget():
    minilm = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    base = BertConfig()
    assert graph_rows(minilm, 384, "cpu") == 1 and graph_rows(base, 384, "cpu") == 1
    assert graph_rows(minilm, 128, "cpu") > graph_rows(minilm, 384, "cpu")
    assert graph_rows(minilm, 384, "cpu", budget=10 * 2 ** 30) > 1
    assert graph_rows(base, 384, "cuda") is None  # CUDA graphs share memory: the batch is kept
    assert LENGTH_STEP > 0


def test_cpu_train_graph_splits_a_step_into_micro_batches_that_fit():
    from bert_of.training.inference import graph_accum_steps

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
    s1, e1 = infer(qa, rows, ("start_logits", "end_logits"), 5, "eager", rt)
    stats = {}
    s2, e2 = infer(qa, rows, ("start_logits", "end_logits"), 2, "graph", rt, stats=stats)  # calls of 2, 2, 1 + pad
    assert stats["graphs"] == 1 and not stats["layerwise"] and stats["batch_size"] == 2
    np.testing.assert_allclose(s2, s1, rtol=0, atol=1e-5)
    np.testing.assert_allclose(e2, e1, rtol=0, atol=1e-5)
