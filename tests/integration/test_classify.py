"""`bert-of finetune / predict / eval classify|tag` on a user's own files (tests/data/user/).

A tiny BERT (hidden 32, 2 layers, vocabulary from the shipped files) is fine-tuned for a few steps;
the tests check the whole path (columns, string labels and their recorded order, features, head,
training, predictions with probabilities in input order, metrics, the results store), and that the
metrics `eval classify` reports equal the textbook formulas recomputed here from its predictions
file. Accuracy itself is not the point (a few steps of a tiny model).
"""

import csv
import json
import math
import os
import shlex
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import ROOT, error_lines, run_cli
from tests.helpers.models import FAST, S_DEV, S_NEW, S_TRAIN, USER, tiny_bert, user_rows as _rows, user_vocab as _vocab

pytestmark = pytest.mark.oneflow

R_TRAIN, R_DEV = (os.path.join(USER, f"ratings-{s}.csv") for s in ("train", "dev"))
CLASSES = ["negative", "neutral", "positive"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("classify")
    saved = os.environ.get("BERT_OF_HOME")
    os.environ["BERT_OF_HOME"] = str(root / "home")  # results store and eval folders inside the test
    try:
        vocab, n = _vocab(root / "vocab.txt")
        yield SimpleNamespace(root=root, results=str(root / "home" / "results.jsonl"),
                              base=tiny_bert(root / "tiny", vocab, n, dropout=0.0))
    finally:
        if saved is None:
            os.environ.pop("BERT_OF_HOME", None)
        else:
            os.environ["BERT_OF_HOME"] = saved


@pytest.fixture(scope="module")
def sentiment(env):
    ft = str(env.root / "sentiment")
    r = run_cli("finetune", "classify", "--model", env.base, "--train", S_TRAIN, "-o", ft, "--steps", 30,
                "--lr", 3e-3, *FAST, "--eval-data", S_DEV)
    return SimpleNamespace(ft=ft, after_training=json.loads(r.stdout[r.stdout.index("{"):]))


# --------------------------------------------------------------------------- independent formulas


def _accuracy(t, p):
    return sum(a == b for a, b in zip(t, p)) / len(t)


def _macro_f1(t, p):
    f1 = []
    for c in sorted(set(t) | set(p)):
        tp = sum(a == c and b == c for a, b in zip(t, p))
        fp = sum(a != c and b == c for a, b in zip(t, p))
        fn = sum(a == c and b != c for a, b in zip(t, p))
        f1.append(2 * tp / (2 * tp + fp + fn))
    return sum(f1) / len(f1)


def _mcc(t, p):
    """Gorodkin's multi-class MCC from the confusion matrix (sklearn's matthews_corrcoef)."""
    classes = sorted(set(t) | set(p))
    c = np.array([[sum(a == i and b == j for a, b in zip(t, p)) for j in classes] for i in classes], float)
    n, correct = c.sum(), np.trace(c)
    t_k, p_k = c.sum(1), c.sum(0)
    denom = math.sqrt((n * n - p_k @ p_k) * (n * n - t_k @ t_k))
    return (correct * n - t_k @ p_k) / denom if denom else 0.0


def _ranks(x):
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0.0] * len(x)
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def _pearson(x, y):
    return float(np.corrcoef(np.asarray(x, float), np.asarray(y, float))[0, 1])


# --------------------------------------------------------------------------- classification


def test_finetune_records_the_classes_and_evaluates_eval_data(sentiment, env):
    args = json.load(open(os.path.join(sentiment.ft, "final", "train_args.json")))
    assert args["task"] == "classify" and args["problem"] == "single_label" and args["labels"] == CLASSES
    assert args["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert args["columns"] == {"text": "text", "text_pair": None, "label": "label"}
    assert args["train_examples"] == 72 and args["hparams"]["steps"] == 30
    assert args["final_loss"] < args["first_loss"]
    a = sentiment.after_training
    assert a["task"] == "classify" and a["examples"] == 24 and set(a) >= {"accuracy", "macro_f1", "mcc"}
    # --eval-data's predictions and scores in the run folder (-o), as run_squad.py's --output_dir holds them
    ev = os.path.join(sentiment.ft, "eval", "sentiment-dev")
    assert sorted(os.listdir(ev)) == ["predictions.csv", "scores.json"]
    scores = json.load(open(os.path.join(ev, "scores.json")))
    assert scores == {"data": S_DEV, "scores": {k: a[k] for k in ("accuracy", "macro_f1", "mcc")}}
    assert [r["label"] for r in _rows(os.path.join(ev, "predictions.csv"))] == [r["label"] for r in _rows(S_DEV)]


def test_predict_writes_label_and_probabilities_in_input_order(sentiment, tmp_path):
    run_cli("predict", "classify", "--model", sentiment.ft, "--data", S_NEW, "-o", tmp_path / "p.csv")
    run_cli("predict", "classify", "--model", sentiment.ft, "--data", S_NEW, "-o", tmp_path / "p.jsonl")
    new = _rows(S_NEW)
    rows = _rows(tmp_path / "p.csv")
    recs = [json.loads(l) for l in open(tmp_path / "p.jsonl", encoding="utf-8")]
    probs = [f"p({c})" for c in CLASSES]
    assert list(rows[0]) == list(new[0]) + ["prediction"] + probs  # the input's columns, then the prediction
    assert [{k: r[k] for k in new[0]} for r in rows] == new == [{k: j[k] for k in new[0]} for j in recs]
    for r, j in zip(rows, recs):
        p = [float(r[c]) for c in probs]
        assert sum(p) == pytest.approx(1.0, abs=1e-9) and all(0 <= v <= 1 for v in p)
        assert r["prediction"] == CLASSES[int(np.argmax(p))] == j["prediction"]
        assert list(j)[-len(probs):] == probs and [j[c] for c in probs] == pytest.approx(p, abs=1e-6)


def test_predictions_sit_beside_the_users_columns_and_eval_scores_that_file(sentiment, tmp_path):
    """An id,text,label CSV: predict writes id,text,label,prediction,p(...) in input order; eval of
    that file reads its gold column and scores it (its own predictions go beside, renamed)."""
    src = tmp_path / "rows.csv"
    dev = _rows(S_DEV)
    with open(src, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text", "label"])
        w.writerows([[f"r{i}", r["text"], r["label"]] for i, r in enumerate(dev)])
    run_cli("predict", "classify", "--model", sentiment.ft, "--data", src, "-o", tmp_path / "out.csv")
    out = _rows(tmp_path / "out.csv")
    assert list(out[0]) == ["id", "text", "label", "prediction"] + [f"p({c})" for c in CLASSES]
    assert [(r["id"], r["text"], r["label"]) for r in out] == [(f"r{i}", r["text"], r["label"]) for i, r in
                                                              enumerate(dev)]
    r = run_cli("eval", "classify", "--model", sentiment.ft, "--data", tmp_path / "out.csv", "-o", tmp_path / "ev",
                "--no-record")
    got = json.loads(r.stdout[r.stdout.index("{"):])
    assert got["accuracy"] == pytest.approx(100 * _accuracy([x["label"] for x in out],
                                                            [x["prediction"] for x in out]), abs=1e-9)
    again = _rows(tmp_path / "ev" / "predictions.csv")
    assert list(again[0])[-4:] == ["prediction.1"] + [f"p({c}).1" for c in CLASSES]
    assert [x["prediction.1"] for x in again] == [x["prediction"] for x in out]
    assert "has columns named as predictions: writing 'prediction' as 'prediction.1'" in r.stderr


def test_rows_from_a_pipe_stdin_and_process_substitution_predict_as_the_file(sentiment, tmp_path):
    """--data FILE, --data - < FILE, --data /dev/stdin from a pipe, --data <(cat FILE): the same bytes out."""
    outs = [tmp_path / f"p{i}.csv" for i in range(4)]
    args = ("predict", "classify", "--model", sentiment.ft, "-o")
    run_cli(*args, outs[0], "--data", S_NEW)
    with open(S_NEW, "rb") as f:
        r = subprocess.run([sys.executable, "-m", "bert_of.cli", *map(str, args), str(outs[1]), "--data", "-"],
                           stdin=f, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    cmd = " ".join(shlex.quote(str(a)) for a in (sys.executable, "-m", "bert_of.cli", *args))
    for out, how in ((outs[2], f"cat {shlex.quote(S_NEW)} | {cmd} {outs[2]} --data /dev/stdin"),
                     (outs[3], f"{cmd} {outs[3]} --data <(cat {shlex.quote(S_NEW)})")):
        r = subprocess.run(["bash", "-c", how], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stderr
    assert len({o.read_bytes() for o in outs}) == 1 and len(_rows(outs[0])) == len(_rows(S_NEW))


def test_rows_padded_to_their_batch_predict_as_rows_padded_to_the_maximum(sentiment, tmp_path):
    """The default (each batch padded to its longest row, rows grouped by length) and
    --pad-to-max-length (every row at --max-seq-length, 32 here): the same labels, probabilities within 1e-5, rows
    in input order both ways."""
    got = {}
    for name, extra in (("batch", []), ("max", ["--pad-to-max-length"])):
        run_cli("predict", "classify", "--model", sentiment.ft, "--data", S_DEV, "-o", tmp_path / f"{name}.csv",
                "--predict-batch-size", 4, *extra)
        got[name] = _rows(tmp_path / f"{name}.csv")
    assert [r["text"] for r in got["batch"]] == [r["text"] for r in got["max"]] == [r["text"] for r in _rows(S_DEV)]
    assert [r["prediction"] for r in got["batch"]] == [r["prediction"] for r in got["max"]]
    np.testing.assert_allclose([[float(r[f"p({c})"]) for c in CLASSES] for r in got["batch"]],
                               [[float(r[f"p({c})"]) for c in CLASSES] for r in got["max"]], rtol=0, atol=1e-5)


def test_the_first_fine_tuning_step_loses_the_same_padded_to_the_batch_or_the_maximum(env, tmp_path):
    """One step on the same shuffled batch (one seed), dropout off: step 1's loss within 1e-6 relative."""
    first = {}
    for name, extra in (("batch", []), ("max", ["--pad-to-max-length"])):
        run_cli("finetune", "classify", "--model", env.base, "--train", S_TRAIN, "-o", tmp_path / name, "--steps", 1,
                "--lr", 3e-3, *FAST, "--no-record", *extra)
        first[name] = json.load(open(tmp_path / name / "final" / "train_args.json"))["first_loss"]
    assert first["batch"] == pytest.approx(first["max"], rel=1e-6)


def test_eval_metrics_equal_the_formulas_on_its_predictions(sentiment, env, tmp_path):
    r = run_cli("eval", "classify", "--model", sentiment.ft, "--data", S_DEV, "-o", tmp_path, "--name", "senti")
    got = json.loads(r.stdout[r.stdout.index("{"):])
    preds = _rows(tmp_path / "predictions.csv")
    truth = [row["label"] for row in _rows(S_DEV)]
    assert [row["label"] for row in preds] == truth  # the gold column stays in the predictions file
    pred = [row["prediction"] for row in preds]
    assert [row["text"] for row in preds] == [row["text"] for row in _rows(S_DEV)]
    assert got["examples"] == len(truth) == 24 and got["problem"] == "single_label"
    assert got["accuracy"] == pytest.approx(100 * _accuracy(truth, pred), abs=1e-9)
    assert got["macro_f1"] == pytest.approx(100 * _macro_f1(truth, pred), abs=1e-9)
    assert got["mcc"] == pytest.approx(100 * _mcc(truth, pred), abs=1e-9)
    assert got == sentiment.after_training  # the same model scored the same file after training

    from bert_of.eval.results import load_results

    recs = [x for x in load_results(env.results) if x["task"] == "classify" and x["checkpoint"]["name"] == "senti"]
    assert len(recs) == 1 and recs[0]["metrics"] == {k: pytest.approx(got[k]) for k in ("accuracy", "macro_f1", "mcc")}
    assert recs[0]["split"] == "sentiment-dev.csv" and recs[0]["tool"] == "bert-of eval classify"


def test_a_label_the_model_does_not_know_is_one_error_line(sentiment, tmp_path):
    bad = tmp_path / "dev.csv"
    bad.write_text("text,label\nfine,positive\n\"a long,\nquoted review\",angry\n", encoding="utf-8")
    r = run_cli("eval", "classify", "--model", sentiment.ft, "--data", bad, "-o", tmp_path / "out", check=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert error_lines(r.stderr) == [f"bert-of: error: {bad}: line 3: column 'label': label 'angry' is not one of "
                                     "the model's classes (negative, neutral, positive)"]
    assert not (tmp_path / "out").exists()  # nothing written


# --------------------------------------------------------------------------- regression


def test_regression_csv_gives_pearson_and_spearman(env, tmp_path):
    ft = tmp_path / "ratings"
    run_cli("finetune", "classify", "--model", env.base, "--train", R_TRAIN, "-o", ft, "--steps", 20, "--lr", 3e-3,
            *FAST, "--no-record")
    assert json.load(open(ft / "final" / "train_args.json"))["problem"] == "regression"
    r = run_cli("eval", "classify", "--model", ft, "--data", R_DEV, "-o", tmp_path / "ev", "--no-record")
    got = json.loads(r.stdout[r.stdout.index("{"):])
    preds = _rows(tmp_path / "ev" / "predictions.csv")
    assert list(preds[0]) == list(_rows(R_DEV)[0]) + ["score"]
    y = [float(row["rating"]) for row in _rows(R_DEV)]
    v = [float(row["score"]) for row in preds]
    assert got["problem"] == "regression" and got["examples"] == len(y)
    assert got["pearson"] == pytest.approx(100 * _pearson(y, v), abs=1e-6)
    assert got["spearman"] == pytest.approx(100 * _pearson(_ranks(y), _ranks(v)), abs=1e-6)
    assert got["mse"] == pytest.approx(sum((a - b) ** 2 for a, b in zip(y, v)) / len(y), rel=1e-6)


def test_a_bad_training_row_or_output_name_is_one_error_line(env, tmp_path):
    bad = tmp_path / "train.csv"
    bad.write_text("\ufefftext,label\nfine,positive\n,negative\n", encoding="utf-8")  # a BOM, then an empty text
    cases = [(["finetune", "classify", "--model", env.base, "--train", bad, "-o", tmp_path / "m", "--steps", 1],
              f"{bad}: line 3: column 'text': empty"),
             (["predict", "classify", "--model", env.base, "--data", S_NEW, "-o", tmp_path / "p.txt"],
              f"-o {tmp_path / 'p.txt'}: a predictions file ends .csv or .jsonl"),
             (["predict", "classify", "--model", env.base, "--data", S_NEW, "-o", tmp_path / "p.csv"],
              "tiny: not fine-tuned by `bert-of finetune classify` (its train_args.json records no classify problem "
              "and labels)")]
    for args, message in cases:
        r = run_cli(*args, check=False)
        assert r.returncode == 1 and error_lines(r.stderr) == [f"bert-of: error: {message}"], r.stderr
    assert sorted(os.listdir(tmp_path)) == ["train.csv"]  # nothing written


# --------------------------------------------------------------------------- tagging

N_TRAIN, N_DEV = os.path.join(USER, "ner-train.conll"), os.path.join(USER, "ner-dev.conll")


def _conll(path, column=-1):
    """(tokens, tags) per sentence (the tag: ``column``), read here without bert_of."""
    out, cur = [], []
    for line in open(path, encoding="utf-8"):
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append((parts[0], parts[column]))
    if cur:
        out.append(cur)
    return [([w for w, _ in s], [t for _, t in s]) for s in out]


def _spans(tags):
    """BIO entities (type, first, last): a B- starts one, an I- of another type (or after O) too."""
    out, start, typ = set(), None, None
    for i, t in enumerate(list(tags) + ["O"]):
        if t == "O" or t.startswith("B-") or (t.startswith("I-") and t[2:] != typ):
            if start is not None:
                out.add((typ, start, i - 1))
            start, typ = (i, t[2:]) if t != "O" else (None, None)
    return out


def test_tag_conll_end_to_end_with_entity_scores_recomputed(env, tmp_path):
    ft = tmp_path / "ner"
    run_cli("finetune", "tag", "--model", env.base, "--train", N_TRAIN, "-o", ft, "--steps", 40, "--lr", 3e-3,
            *FAST, "--no-record")
    args = json.load(open(ft / "final" / "train_args.json"))
    assert args["task"] == "tag" and args["labels"][0] == "O" and args["final_loss"] < args["first_loss"]
    r = run_cli("eval", "tag", "--model", ft, "--data", N_DEV, "-o", tmp_path / "ev", "--results", env.results)
    got = json.loads(r.stdout[r.stdout.index("{"):])
    gold = _conll(N_DEV)
    preds = [json.loads(l) for l in open(tmp_path / "ev" / "predictions.jsonl", encoding="utf-8")]
    assert [p["tokens"] for p in preds] == [g[0] for g in gold] and got["examples"] == len(gold)
    tp = n_pred = n_true = 0
    for (_, t), p in zip(gold, preds):
        assert p["tags"] == t  # the gold tags stay beside the predicted ones
        assert len(p["prediction"]) == len(t) and set(p["prediction"]) <= set(args["labels"])
        a, b = _spans(t), _spans(p["prediction"])
        tp, n_pred, n_true = tp + len(a & b), n_pred + len(b), n_true + len(a)
    prec, rec = tp / n_pred if n_pred else 0.0, tp / n_true
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    assert got["precision"] == pytest.approx(100 * prec) and got["recall"] == pytest.approx(100 * rec)
    assert got["f1"] == pytest.approx(100 * f1) and got["f1"] > 0  # the model learned some entities
    run_cli("predict", "tag", "--model", ft, "--data", N_DEV, "-o", tmp_path / "p.conll")
    assert _conll(tmp_path / "p.conll") == [(p["tokens"], p["prediction"]) for p in preds]  # tag last
    assert _conll(tmp_path / "p.conll", column=-2) == gold  # each word's columns as read before it
    # every sentence padded to --max-seq-length (32 here) tags each word the same (eval padded to the batch)
    run_cli("predict", "tag", "--model", ft, "--data", N_DEV, "-o", tmp_path / "max.conll", "--pad-to-max-length")
    assert _conll(tmp_path / "max.conll") == _conll(tmp_path / "p.conll")
    from bert_of.eval.results import load_results

    assert [x["metrics"]["f1"] for x in load_results(env.results) if x["task"] == "tag"] == [pytest.approx(got["f1"])]


def test_conll_as_files_are_found_trains_and_predicts_and_an_ambiguous_file_is_refused(env, tmp_path):
    """A bare -DOCSTART-, tab and space columns mixed, CRLF, runs of blank lines: 3 sentences, 9
    tokens, to train and to predict (each word's columns kept before its predicted tag); a file
    that is neither clearly CoNLL nor clearly text: one line naming the line."""
    mixed = os.path.join(USER, "ner-mixed.conll")
    ft = tmp_path / "ner"
    run_cli("finetune", "tag", "--model", env.base, "--train", mixed, "-o", ft, "--steps", 2, *FAST, "--no-record")
    assert json.load(open(ft / "final" / "train_args.json"))["train_examples"] == 3
    run_cli("predict", "tag", "--model", ft, "--data", mixed, "-o", tmp_path / "p.conll")
    got = _conll(tmp_path / "p.conll", column=-2)
    assert got == [(["EU", "rejects", "German"], ["B-ORG", "O", "B-MISC"]), (["Peter", "Blackburn"], ["B-PER", "I-PER"]),
                   (["BRUSSELS", "1996-08-22", "the", "end"], ["B-LOC", "O", "O", "O"])]
    assert sum(len(w) for w, _ in got) == 9 and all(len(l.split("\t")) == 3 for l in open(tmp_path / "p.conll") if l.strip())
    amb = tmp_path / "amb.conll"
    amb.write_text("EU B-ORG\nrejects O\nthe cat sat on the mat\n", encoding="utf-8")
    for cmd in (("finetune", "tag", "--model", env.base, "--train", amb, "-o", tmp_path / "run2"),
                ("predict", "tag", "--model", ft, "--data", amb, "-o", tmp_path / "p2.conll")):
        r = run_cli(*cmd, check=False)
        assert r.returncode == 1 and error_lines(r.stderr) == [
            f"bert-of: error: {amb}: line 3: 'the cat sat on the mat' is not 'TOKEN ... TAG'; the file is neither "
            "clearly CoNLL (2 of 3 lines are 'TOKEN ... TAG') nor clearly plain text (a sentence a line); fix that "
            "line or give JSON Lines"], r.stderr
    assert not (tmp_path / "run2").exists() and not (tmp_path / "p2.conll").exists()


def test_a_lone_surrogate_is_one_line_naming_the_line_and_leaves_no_run_folder(env, tmp_path):
    """"\\ud800" is valid JSON but no character: refused where it is read, before any run folder."""
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"text": "fine", "label": "ok"}\n{"text": "odd", "label": "b\\ud800d"}\n', encoding="utf-8")
    r = run_cli("finetune", "classify", "--model", env.base, "--train", bad, "-o", tmp_path / "run", *FAST,
                check=False)
    assert r.returncode == 1 and error_lines(r.stderr) == [
        f"bert-of: error: {bad}: line 2: text 'b\\ud800d' holds a lone surrogate ('\\ud800'): not a character, it "
        "cannot be written as UTF-8"], r.stderr
    assert not (tmp_path / "run").exists()


def test_a_tagger_records_its_tags_in_config_and_of2hf_writes_a_token_classifier(env, tmp_path):
    ft = tmp_path / "ner"
    run_cli("finetune", "tag", "--model", env.base, "--train", N_TRAIN, "-o", ft, "--steps", 2, *FAST,
            "--no-record")
    args = json.load(open(ft / "final" / "train_args.json"))
    cfg = json.load(open(ft / "final" / "config.json"))
    assert cfg["classifier_kind"] == "token" and cfg["num_labels"] == len(args["labels"])
    assert cfg["id2label"] == args["id2label"] == {str(i): t for i, t in enumerate(args["labels"])}
    run_cli("convert", "of2hf", ft / "final", "-o", tmp_path / "hf")  # a run's model
    hf = json.load(open(tmp_path / "hf" / "config.json"))
    assert hf["architectures"] == ["BertForTokenClassification"] and hf["id2label"] == args["id2label"]
    assert hf["label2id"] == args["label2id"]
    from safetensors.numpy import load_file

    assert not any(k.startswith("bert.pooler.") for k in load_file(str(tmp_path / "hf" / "model.safetensors")))


# --------------------------------------------------------------------------- multi-label

T_TRAIN, T_DEV = (os.path.join(USER, f"topics-{s}.csv") for s in ("train", "dev"))


def _label_sets(path):
    return [set(r["labels"].split("|")) for r in _rows(path)]


def _multi_label_scores(gold, pred, classes):
    """micro-F1 (counts pooled over classes), macro-F1 (the mean of the classes' F1, 0 for a class
    never true nor predicted), exact match (the whole set right), from the definitions."""
    f1, tps, fps, fns = [], 0, 0, 0
    for c in classes:
        tp = sum(c in g and c in p for g, p in zip(gold, pred))
        fp = sum(c not in g and c in p for g, p in zip(gold, pred))
        fn = sum(c in g and c not in p for g, p in zip(gold, pred))
        f1.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
        tps, fps, fns = tps + tp, fps + fp, fns + fn
    return {"micro_f1": 2 * tps / (2 * tps + fps + fns), "macro_f1": sum(f1) / len(f1),
            "subset_accuracy": sum(g == p for g, p in zip(gold, pred)) / len(gold)}


def test_multi_label_finetune_predict_eval_with_metrics_recomputed(env, tmp_path):
    classes = sorted(set().union(*_label_sets(T_TRAIN)))
    ft = tmp_path / "topics"
    run_cli("finetune", "classify", "--model", env.base, "--train", T_TRAIN, "-o", ft, "--problem", "multi_label",
            "--steps", 100, "--lr", 5e-3, *FAST, "--no-record")
    args = json.load(open(ft / "final" / "train_args.json"))
    assert args["problem"] == "multi_label" and args["labels"] == classes and args["label_separator"] == "|"
    assert args["final_loss"] < args["first_loss"]
    cfg = json.load(open(ft / "final" / "config.json"))
    assert cfg["problem_type"] == "multi_label_classification" and cfg["num_labels"] == len(classes)
    assert cfg["id2label"] == {str(i): c for i, c in enumerate(classes)}

    # evaluated on the dev rows as JSON Lines (a list of classes per row)
    dev = tmp_path / "topics-dev.jsonl"
    dev.write_text("".join(json.dumps({"text": r["text"], "labels": r["labels"].split("|")}) + "\n"
                           for r in _rows(T_DEV)), encoding="utf-8")
    r = run_cli("eval", "classify", "--model", ft, "--data", dev, "-o", tmp_path / "ev", "--results", env.results)
    got = json.loads(r.stdout[r.stdout.index("{"):])
    assert got["problem"] == "multi_label" and got["examples"] == 16
    preds = _rows(tmp_path / "ev" / "predictions.csv")
    sets = []
    for p in preds:  # the set is every class whose sigmoid reaches 0.5
        probs = {c: float(p[f"p({c})"]) for c in classes}
        assert all(0.0 < v < 1.0 for v in probs.values())
        sets.append({c for c in p["prediction"].split("|") if c})
        assert sets[-1] == {c for c, v in probs.items() if v >= 0.5}
    want = _multi_label_scores(_label_sets(T_DEV), sets, classes)
    for k, v in want.items():
        assert got[k] == pytest.approx(100 * v), k
    assert got["micro_f1"] > 0  # a few steps learned some topics

    # predict: JSON Lines with lists, the same sets
    run_cli("predict", "classify", "--model", ft, "--data", T_DEV, "-o", tmp_path / "p.jsonl")
    recs = [json.loads(l) for l in open(tmp_path / "p.jsonl", encoding="utf-8")]
    assert [set(x["prediction"]) for x in recs] == sets
    assert all([k for k in x if k.startswith("p(")] == [f"p({c})" for c in classes] for x in recs)

    # the loss is the mean binary cross-entropy of the sigmoid (transformers' BCEWithLogitsLoss)
    from bert_of._flow import flow
    from bert_of.heads import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(str(ft))
    ids = flow.tensor(np.array([[2, 7, 9, 11, 3], [2, 5, 3, 0, 0]]), dtype=flow.int64)
    mask = flow.tensor(np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), dtype=flow.int64)
    y = np.zeros((2, len(classes)), np.float32)
    y[0, 0] = y[0, 2] = y[1, 1] = 1.0
    with flow.no_grad():
        out = model(ids, flow.zeros_like(ids), mask, labels=flow.tensor(y))
    z = out.logits.numpy().astype(np.float64)
    bce = np.mean(y * np.log1p(np.exp(-z)) + (1 - y) * np.log1p(np.exp(z)))
    assert float(out.loss.numpy()) == pytest.approx(bce, rel=1e-5)

    # after of2hf transformers' config names the classes and the problem
    run_cli("convert", "of2hf", ft / "final", "-o", tmp_path / "hf")  # a run's model
    hf = json.load(open(tmp_path / "hf" / "config.json"))
    assert hf["problem_type"] == "multi_label_classification" and hf["id2label"] == cfg["id2label"]
    assert hf["label2id"] == {c: i for i, c in enumerate(classes)}
