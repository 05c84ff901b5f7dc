"""`bert-of predict|eval TASK --engine onnxruntime` needs no OneFlow: the core suite (no OneFlow, no
TensorFlow; Python 3.13, NumPy 2) runs it here, and a fresh process that predicts with every task
ends with neither OneFlow nor TensorFlow imported.

The checkpoints are written by bert_of's own writer from NumPy arrays (the fine-tuned heads a task
runs, with the train_args.json ``finetune TASK`` writes beside them), never by OneFlow; the
expected outputs are the float64 NumPy reference's (converters/verify/reference_forward.py).
"""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_of.converters import registry
from bert_of.converters.convert import read
from bert_of.converters.verify import reference_forward
from bert_of.eval.glue_data import InputExample, convert_example_to_features
from bert_of.eval.user_data import read_tagged, tag_list
from bert_of.tokenization import FullTokenizer
from tests.conftest import RANK_VARS, ROOT, run_cli
from tests.helpers.models import DEV11, GL, LENGTHS, S_DEV, USER, build_vocab, random_checkpoint, user_rows, user_vocab

pytest.importorskip("onnxruntime")

SENTIMENT = ["negative", "neutral", "positive"]  # sentiment-dev.csv's classes, sorted as finetune sorts them
N_DEV = os.path.join(USER, "ner-dev.conll")


def classifier(root):
    vocab, n = user_vocab(root / "vocab.txt")
    return random_checkpoint(root / "classify", vocab, n, ("bert.pooler.", "classifier."), seed=1, num_labels=3,
                             train_args={"task": "classify", "problem": "single_label", "labels": SENTIMENT,
                                         "do_lower_case": True})


def test_predict_classify_on_onnxruntime_gives_the_reference_classes_and_probabilities(tmp_path):
    model = classifier(tmp_path)
    out = tmp_path / "preds.csv"
    r = run_cli("predict", "classify", "--model", model, "--data", S_DEV, "-o", out, "--engine", "onnxruntime",
                "--max-seq-length", 32, "--predict-batch-size", 4)
    assert "predict: engine onnxruntime" in r.stderr
    got = user_rows(out)
    rows = user_rows(S_DEV)
    assert [g["text"] for g in got] == [row["text"] for row in rows] and len(got) == 24  # every row, input order
    # the reference: the same rows as run_classifier's features, BERT in float64, softmax
    tok = FullTokenizer(os.path.join(model, "vocab.txt"), do_lower_case=True)
    feats = [convert_example_to_features(InputExample(str(i), row["text"], None), SENTIMENT, 32, tok)
             for i, row in enumerate(rows)]
    arrays = {name: np.array([f[k] for f in feats]) for name, k in
              (("input_ids", "input_ids"), ("token_type_ids", "segment_ids"), ("attention_mask", "input_mask"))}
    source = read(model, "of")
    logits = reference_forward.forward(registry.reference_layout(source), arrays, 4)["logits"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    names = [f"p({k})" for k in SENTIMENT]
    probs = np.array([[float(g[k]) for k in names] for g in got])
    np.testing.assert_allclose(probs, want, rtol=0, atol=1e-5)
    assert [g["prediction"] for g in got] == [SENTIMENT[i] for i in want.argmax(axis=1)]
    assert float(np.ptp(want, axis=0).max()) > 1e-2  # the rows' probabilities differ: not a constant compared


# One process: predict (and eval) of every task on onnxruntime, then what it imported.
_EVERY_TASK = """
import json, sys
from bert_of.cli import main

runs = json.loads(sys.argv[1])
codes = [main(argv) for argv in runs]
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"oneflow", "tensorflow", "torch"})
print(json.dumps({"codes": codes, "heavy": heavy}))
"""


def test_predict_and_eval_of_every_task_on_onnxruntime_import_no_oneflow(tmp_path):
    cls = classifier(tmp_path)
    vocab, n = user_vocab(tmp_path / "vocab.txt")
    tags = tag_list(read_tagged(N_DEV, need_tags=True))
    head = ("bert.pooler.", "classifier.")
    tagger = random_checkpoint(tmp_path / "tag", vocab, n, head, seed=2, num_labels=len(tags), classifier_kind="token",
                               train_args={"task": "tag", "labels": tags, "do_lower_case": True})
    regressor = random_checkpoint(tmp_path / "regress", vocab, n, head, seed=3, num_labels=1,
                                  train_args={"task": "classify", "problem": "regression", "labels": [],
                                              "do_lower_case": True})
    topics = ["a", "b", "c"]
    multi = random_checkpoint(tmp_path / "multi", vocab, n, head, seed=4, num_labels=3,
                              train_args={"task": "classify", "problem": "multi_label", "labels": topics,
                                          "do_lower_case": True})
    fvocab, fn = build_vocab(tmp_path / "fixtures-vocab.txt")
    squad = random_checkpoint(tmp_path / "squad", fvocab, fn, ("bert.pooler.", "qa_outputs."), seed=5)
    glue = random_checkpoint(tmp_path / "glue", fvocab, fn, ("bert.pooler.", "classifier."), seed=6, num_labels=2)
    out = tmp_path / "out"
    ort = ["--engine", "onnxruntime"]
    runs = [
        ["predict", "classify", "--model", cls, "--data", S_DEV, "-o", str(out / "c.csv"), *ort],
        ["eval", "classify", "--model", cls, "--data", S_DEV, "-o", str(out / "ec"), "--no-record", *ort],
        ["predict", "classify", "--model", regressor, "--data", S_DEV, "-o", str(out / "r.csv"), *ort],
        ["predict", "classify", "--model", multi, "--data", S_DEV, "-o", str(out / "m.jsonl"), *ort],
        ["predict", "tag", "--model", tagger, "--data", N_DEV, "-o", str(out / "t.conll"), *ort],
        ["eval", "tag", "--model", tagger, "--data", N_DEV, "-o", str(out / "et"), "--no-record", *ort],
        ["predict", "squad", "--model", squad, "--data", DEV11, *LENGTHS, "-o", str(out / "s"), *ort],
        ["eval", "squad", "--model", squad, "--data", DEV11, *LENGTHS, "-o", str(out / "es"), "--no-record", *ort],
        ["predict", "glue", "--model", glue, "--task", "sst-2", "--data", os.path.join(GL, "sst-2-test.tsv"),
         "-o", str(out / "g"), *ort],
        ["eval", "glue", "--model", glue, "--task", "sst-2", "--data", os.path.join(GL, "sst-2-dev.tsv"),
         "-o", str(out / "eg"), "--no-record", *ort],
    ]
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env.update(PYTHONPATH=ROOT, BERT_OF_HOME=str(tmp_path / "home"))
    r = subprocess.run([sys.executable, "-c", _EVERY_TASK, json.dumps(runs)], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result == {"codes": [0] * len(runs), "heavy": []}, r.stderr
    assert r.stderr.count("predict: engine onnxruntime") == len(runs)
    # each command wrote what it says, every input row answered
    with open(out / "c.csv", encoding="utf-8", newline="") as f:
        assert len(list(csv.DictReader(f))) == 24
    assert len(user_rows(out / "r.csv")) == 24 and "score" in user_rows(out / "r.csv")[0]
    assert all(set(json.loads(line)["prediction"]) <= set(topics) for line in open(out / "m.jsonl", encoding="utf-8"))
    assert set(os.listdir(out / "s")) >= {"predictions.json", "nbest_predictions.json"}
    assert open(out / "g" / "predictions.tsv", encoding="utf-8").readline() == "index\tprediction\n"
    for scored in ("ec", "et", "es", "eg"):
        assert os.listdir(out / scored), scored


@pytest.mark.oneflow
def test_the_control_predict_on_oneflow_does_import_it(tmp_path):
    """The same process check sees OneFlow where it is used: ``--engine oneflow`` on the same checkpoint."""
    model = classifier(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env.update(PYTHONPATH=ROOT, BERT_OF_HOME=str(tmp_path / "home"))
    runs = [["predict", "classify", "--model", model, "--data", S_DEV, "-o", str(tmp_path / "p.csv"), "--engine",
             "oneflow"]]
    r = subprocess.run([sys.executable, "-c", _EVERY_TASK, json.dumps(runs)], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"codes": [0], "heavy": ["oneflow"]}
