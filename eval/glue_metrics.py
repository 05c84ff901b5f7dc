"""GLUE and XNLI scores: numpy metrics, predictions files, ``glue_score``.

Metrics (numpy only; sklearn/scipy semantics): accuracy, binary F1, Matthews correlation,
Pearson, Spearman (average ranks for ties). ``compute_metrics`` returns fractions;
``glue_score`` returns percentages like the GLUE leaderboard and published tables.
"""

from __future__ import annotations

import math

import numpy as np

from bert_of.eval.errors import EvalDataError, PredictionsError
from bert_of.eval.glue_data import _lines, _read_text, finite_number, read_examples, task_spec


# --------------------------------------------------------------------------- metrics


def accuracy(y_true, y_pred) -> float:
    t, p = np.asarray(y_true), np.asarray(y_pred)
    return float(np.mean(t == p))


def f1_binary(y_true, y_pred, positive=1) -> float:
    """F1 of the positive class; 0 when there is no true or predicted positive (sklearn's value)."""
    t, p = np.asarray(y_true) == positive, np.asarray(y_pred) == positive
    tp = int(np.sum(t & p))
    fp = int(np.sum(~t & p))
    fn = int(np.sum(t & ~p))
    denom = 2 * tp + fp + fn
    return 2.0 * tp / denom if denom else 0.0


def matthews_corrcoef(y_true, y_pred) -> float:
    """Matthews correlation (multi-class form; for two classes
    (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn))); 0 when undefined (constant input)."""
    t, p = np.asarray(y_true), np.asarray(y_pred)
    classes, inv = np.unique(np.concatenate([t, p]), return_inverse=True)
    ti, pi = inv[:len(t)], inv[len(t):]
    k = len(classes)
    cm = np.zeros((k, k), dtype=np.float64)
    np.add.at(cm, (ti, pi), 1)
    t_sum, p_sum = cm.sum(axis=1), cm.sum(axis=0)
    correct, n = np.trace(cm), cm.sum()
    cov_tp = correct * n - np.dot(t_sum, p_sum)
    cov_pp = n * n - np.dot(p_sum, p_sum)
    cov_tt = n * n - np.dot(t_sum, t_sum)
    if cov_pp == 0 or cov_tt == 0:
        return 0.0
    return float(cov_tp / math.sqrt(cov_tt * cov_pp))


def pearson(x, y) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2:
        return float("nan")
    xm, ym = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(np.dot(xm, xm)) * float(np.dot(ym, ym)))
    return float(np.dot(xm, ym) / denom) if denom else float("nan")


def rankdata(a) -> np.ndarray:
    """1-based ranks, ties get the average of their ranks (scipy's 'average')."""
    a = np.asarray(a, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a), dtype=np.float64)
    sa = a[order]
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and sa[j + 1] == sa[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x, y) -> float:
    """Pearson correlation of the (tie-averaged) ranks."""
    return pearson(rankdata(x), rankdata(y))


def compute_metrics(task: str, labels, preds) -> dict:
    """Task metrics as fractions. ``labels``/``preds``: label strings (floats for STS-B)."""
    spec = task_spec(task)
    if len(labels) != len(preds):
        raise PredictionsError(f"{len(preds)} predictions for {len(labels)} examples")
    if not labels:
        raise PredictionsError("no examples to score")
    if spec.labels is None:
        return {"pearson": pearson(labels, preds), "spearman": spearman(labels, preds)}
    t, p = np.array(labels, dtype=object), np.array(preds, dtype=object)
    out = {}
    for m in spec.metrics:
        if m == "accuracy":
            out[m] = accuracy(t, p)
        elif m == "f1":
            out[m] = f1_binary(t, p, spec.positive)
        elif m == "mcc":
            out[m] = matthews_corrcoef(t, p)
    return out


# --------------------------------------------------------------------------- predictions files


def read_predictions(path: str, task: str, n_examples: int) -> list:
    """Predictions for ``n_examples`` examples, in data order.

    Two formats: one prediction per line (line i = example i), or a GLUE submission file with
    a header ``index<TAB>prediction`` and lines ``i<TAB>label`` (i = 0-based position of the
    example in the data file; any order, each once). A prediction is a label string
    ("entailment", "1") or, for classification, a class id into ``get_labels(task)``; for
    STS-B a number.
    """
    spec = task_spec(task)
    lines = [ln.rstrip("\r\n") for ln in _lines(_read_text(path, PredictionsError))]
    numbered = [(i + 1, ln.strip()) for i, ln in enumerate(lines) if ln.strip()]
    head = [c.strip().lower() for c in numbered[0][1].split("\t")]
    values: list = [None] * n_examples
    if head[:2] == ["index", "prediction"]:
        for line_no, ln in numbered[1:]:
            parts = ln.split("\t")
            if len(parts) != 2:
                raise PredictionsError(f"{path}: line {line_no}: expected 'index<TAB>prediction'")
            try:
                idx = int(parts[0])
            except ValueError:
                raise PredictionsError(f"{path}: line {line_no}: index {parts[0]!r} is not an integer") from None
            if not 0 <= idx < n_examples:
                raise PredictionsError(f"{path}: line {line_no}: index {idx} is not an example "
                                       f"(the data has {n_examples}: 0..{n_examples - 1})")
            if values[idx] is not None:
                raise PredictionsError(f"{path}: line {line_no}: index {idx} predicted twice")
            values[idx] = (line_no, parts[1].strip())
        absent = [i for i, v in enumerate(values) if v is None]
        if absent:
            raise PredictionsError(f"{path}: no prediction for index {absent[0]}"
                                   + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""))
    else:
        if len(numbered) != n_examples:
            raise PredictionsError(f"{path}: {len(numbered)} predictions for {n_examples} examples")
        values = list(numbered)

    out = []
    for line_no, v in values:
        if spec.labels is None:
            out.append(finite_number(v, f"{path}: line {line_no}: ", PredictionsError))
        elif v in spec.labels:
            out.append(v)
        elif v.isdigit() and int(v) < len(spec.labels):
            out.append(spec.labels[int(v)])
        else:
            raise PredictionsError(f"{path}: line {line_no}: {v!r} is not a {spec.name} label "
                                   f"({', '.join(spec.labels)})")
    return out


def glue_score(task: str, data_path: str, predictions_path: str, *, language: str | None = None) -> dict:
    """Score a predictions file against a labeled GLUE/XNLI TSV: metrics in percent."""
    examples = read_examples(task, data_path, language=language)
    if any(e.label is None for e in examples):
        raise EvalDataError(f"{data_path}: has no labels (a test file?); score a train/dev file")
    preds = read_predictions(predictions_path, task, len(examples))
    metrics = compute_metrics(task, [e.label for e in examples], preds)
    return {k: 100.0 * v for k, v in metrics.items()}
