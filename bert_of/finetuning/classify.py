"""Your own data: a sequence classifier (or regressor, or multi-label classifier) fine-tuned, run and
scored on a CSV, TSV or JSON Lines file with named columns.

    finetune_classify(ClassifyOptions(...)) / predict_classify(...) / eval_classify(...)

Rows are read by :func:`bert_of.eval.user_data.read_table`; features are run_classifier.py's
(:func:`bert_of.eval.glue_data.convert_example_to_features`), the model
:class:`~bert_of.heads.BertForSequenceClassification` (cross-entropy; MSE for one output;
multi-label: a sigmoid per class and binary cross-entropy, a class predicted at probability >= 0.5).
The class order (transformers' run_glue order: sorted) is recorded in the fine-tuned model's
train_args.json (``labels``, ``problem``) and prediction and evaluation use it; the model's
config.json records it too (``id2label``, with HF's ``problem_type``), so after ``convert of2hf``
transformers shows the class names.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bert_of.errors import ConfigError
from bert_of.eval.errors import EvalDataError
from bert_of.eval.glue_data import InputExample
from bert_of.eval.user_data import (cell, classification_metrics, encode_labels, label_list, multi_label_metrics,
                                    prediction_names, problem_of, read_table, regression_metrics)
from bert_of.files.atomic import atomic_open
from bert_of.finetuning.glue import glue_arrays
from bert_of.finetuning.task import Help, ModelRun, Task
from bert_of.options import TRAINING, arg
from bert_of.progress import note
from bert_of.eval.user_data import FORMATS, LABEL_SEPARATOR
from bert_of.finetuning.options import EVAL, GLUE_MAX_SEQ_LENGTH, PREDICT, RUNS, RUN_FOLDER, TRAIN, TaskOptions

if TYPE_CHECKING:  # annotations only: the shared steps bring it when a task runs
    from bert_of.training.runtime import Runtime


YOUR_DATA = "your data"
CLASSIFY_PROBLEMS = ("auto", "single_label", "regression", "multi_label")


@dataclass(kw_only=True)
class ClassifyOptions(TaskOptions):
    """``bert-of finetune classify`` / ``predict classify`` / ``eval classify``: a user's CSV, TSV or
    JSON Lines file with named columns (run_classifier.py's defaults, transformers' run_glue columns)."""

    data: str | None = arg(None, metavar="FILE", commands=RUNS, required=True, path=True,
                           help="CSV, TSV or JSON Lines with a text column (labels not needed)",
                           helps={EVAL: "labeled CSV, TSV or JSON Lines"})
    output: str | None = arg(None, short="-o", metavar="PATH", required=(PREDICT,), path=True,
                             help="folder for predictions.csv, or the predictions file itself: CSV when it ends "
                                  ".csv, JSON Lines when .jsonl",
                             helps={TRAIN: RUN_FOLDER,
                                    EVAL: "folder for predictions.csv (unset: $BERT_OF_HOME/eval/MODEL/"
                                          "classify-DATA-TIME/)"})
    lr: float = arg(2e-5, help="peak learning rate", metavar="LR", group=TRAINING, commands=(TRAIN,))
    epochs: float = arg(3.0, help="epochs", metavar="E", group=TRAINING, commands=(TRAIN,))
    text_column: str | None = arg(None, metavar="NAME", group=YOUR_DATA,
                                  help="the text (unset: text, sentence, sentence1, premise, question, review or "
                                       "content)")
    text_pair_column: str | None = arg(None, metavar="NAME", group=YOUR_DATA,
                                       help="the second text of a pair (unset: text_pair, sentence2, hypothesis or "
                                            "passage when present)")
    label_column: str | None = arg(None, metavar="NAME", group=YOUR_DATA, commands=(TRAIN, EVAL),
                                   help="the label (unset: label, labels, target, or the only other column)")
    problem: str = arg("auto", choices=CLASSIFY_PROBLEMS, group=YOUR_DATA, commands=(TRAIN,),
                       help="auto: regression when the labels are real numbers, else classes; multi_label: "
                            "each row holds a set of classes (sigmoid per class, binary cross-entropy)")
    label_separator: str = arg(LABEL_SEPARATOR, metavar="SEP", group=YOUR_DATA,
                               help="multi_label: what separates a row's classes in a CSV/TSV cell (JSON Lines "
                                    "may hold a list); the predictions file joins them with it")
    max_seq_length: int | None = arg(None, metavar="N", group=YOUR_DATA,
                                     help=f"tokens per example (unset: {GLUE_MAX_SEQ_LENGTH}; prediction: as the "
                                          "model was trained)")
    format: str | None = arg(None, choices=FORMATS, group=YOUR_DATA,
                             help="the files' format when their names do not say (-, /dev/stdin, <(...)); unset: "
                                  "the extension, else the content (a JSON object: JSON Lines; a header with "
                                  "tabs: TSV; with commas: CSV)")


NAME = "classify"
PREDICTIONS_FILE = "predictions.csv"
OUTPUT_KINDS = (".csv", ".jsonl")
THRESHOLD = 0.5  # multi-label: a class is predicted when its sigmoid reaches this
# our problem -> transformers' config.problem_type
PROBLEM_TYPE = {"single_label": "single_label_classification", "regression": "regression",
                "multi_label": "multi_label_classification"}


@dataclass
class ClassifyRun(ModelRun):
    table: object  # user_data.Table
    problem: str
    labels: list  # class names in the model's order ([] for regression)
    predictions: np.ndarray  # class ids [n], values [n] (regression), or 0/1 [n, k] (multi-label)
    probabilities: np.ndarray | None  # [n, k] (softmax, or each class's sigmoid)
    path: str
    targets: np.ndarray | None = None  # the file's labels encoded (evaluation): ids, values or 0/1 [n, k]


def _arrays(table, max_seq: int, tok, targets=None) -> dict:
    """The classifier's forward arguments for every row (``labels``: ``targets`` when given)."""
    examples = [InputExample(str(r.line), r.text, r.text_pair) for r in table.rows]
    arrays = glue_arrays(examples, None, max_seq, tok)
    if targets is not None:
        arrays["labels"] = targets
    return arrays


def _read(opts: ClassifyOptions, path: str, need_labels: bool, problem: str = "auto"):
    if not opts.label_separator:
        raise ConfigError("--label-separator: empty (a multi-label cell needs a separator between its classes)")
    return read_table(path, opts.text_column, opts.text_pair_column, opts.label_column if need_labels else None,
                      need_labels=need_labels, problem=problem, label_separator=opts.label_separator,
                      fmt=opts.format)


def finetune_classify(opts: ClassifyOptions) -> dict:
    """Fine-tune on ``opts.train`` in the run folder ``opts.output``, publish its final/ (checkpoint +
    train_args.json with the class order), evaluate each ``opts.eval_data``."""
    from bert_of.finetuning.driver import (Runtime, base_args, check_eval_data, check_output, finish_finetuning,
                                            train)  # loads OneFlow: only when the task runs
    from bert_of.finetuning.steps import (check_head, check_seq_len, glue_seq_len, load_model, make_tokenizer,
                                          model_folder)
    from bert_of.heads import BertForSequenceClassification
    rt = Runtime.create(opts.device)
    check_output(opts)
    table = _read(opts, opts.train, True, opts.problem)
    problem = problem_of(table, opts.problem)
    labels = label_list(table, problem)
    if problem == "single_label" and len(labels) < 2:
        raise EvalDataError(f"{opts.train}: column {table.label_column!r} holds one class ({labels[0]}); a "
                            "classifier needs two or more")
    num_labels = len(labels) or 1
    targets = encode_labels(table, problem, labels)
    check_eval_data(opts, lambda d: encode_labels(_read(opts, d, True, problem), problem, labels))
    max_seq = glue_seq_len(opts, {})
    with model_folder(opts) as (path, name, ident):
        check_head(path, num_labels, NAME, name)
        tok = make_tokenizer(path, opts.do_lower_case, opts.vocab, rt, ident)
        model, _ = load_model(BertForSequenceClassification, path, seed=opts.seed, num_labels=num_labels,
                              id2label=dict(enumerate(labels)) if labels else None,  # travels in config.json
                              problem_type=PROBLEM_TYPE[problem])
        max_seq = check_seq_len(model.config, max_seq, path, rt, given=opts.max_seq_length is not None)
        if opts.vocab:
            model.vocab_file = opts.vocab  # saved with the fine-tuned checkpoint
        arrays = _arrays(table, max_seq, tok, targets)
        n = len(table.rows)
        cfg, summary, finished = train(model, arrays, n, opts, opts.epochs, rt, f"finetune {NAME}")
        args = base_args(NAME, opts, cfg, opts.epochs, rt, ident, name, tok)
        args["hparams"].update(max_seq_length=max_seq)
        args.update(problem=problem, labels=labels, id2label={str(i): k for i, k in enumerate(labels)},
                    label2id={k: i for i, k in enumerate(labels)}, train_examples=n,
                    **({"label_separator": opts.label_separator} if problem == "multi_label" else {}),
                    columns={"text": table.text_column, "text_pair": table.text_pair_column,
                             "label": table.label_column})
        return finish_finetuning(model, opts, rt, args, summary, finished, path, eval_classify)


def _model_labels(train_args: dict, name: str) -> tuple:
    problem = train_args.get("problem")
    labels = train_args.get("labels")
    if train_args.get("task") != NAME or problem not in PROBLEM_TYPE or not isinstance(labels, list):
        raise ConfigError(f"{name}: not fine-tuned by `bert-of finetune classify` (its train_args.json records no "
                          "classify problem and labels)")
    return problem, [str(k) for k in labels]


def _check_output_kind(path: str) -> None:
    if not path.lower().endswith(OUTPUT_KINDS):
        raise ConfigError(f"-o {path}: a predictions file ends .csv or .jsonl")


def predict_classify(opts: ClassifyOptions, trained: str | None = None, model=None, rt: Runtime | None = None,
                     need_labels: bool = False, out_file: str | None = None) -> ClassifyRun | None:
    """Predictions for every row of ``opts.data``; rank 0 writes them to ``out_file`` (default
    ``opts.output``): per row, in input order, the label and every class's probability (or the
    regression value)."""
    from bert_of.finetuning.steps import (check_head, check_seq_len, glue_seq_len, load_predictor, make_tokenizer,
                                          model_folder, predict_mode, predict_runtime, read_train_args)
    from bert_of.training.inference import infer
    rt = rt or predict_runtime(opts)
    out_file = out_file or opts.output
    if not out_file:
        raise ConfigError("predict classify: no -o FILE")
    _check_output_kind(out_file)
    with model_folder(opts, trained) as (path, name, ident):
        train_args = read_train_args(path)
        problem, labels = _model_labels(train_args, name)
        table = _read(opts, opts.data, need_labels, problem)
        targets = encode_labels(table, problem, labels) if need_labels else None  # unknown labels: before the work
        num_labels = len(labels) or 1
        tok = make_tokenizer(path, opts.do_lower_case, opts.vocab, rt, ident)  # train_args.json's, unless given
        max_seq = glue_seq_len(opts, train_args)
        new_head = False
        if model is None:
            check_head(path, num_labels, NAME, name)
            model, missing = load_predictor("BertForSequenceClassification", path, name, opts, rt,
                                            num_labels=num_labels)
            new_head = bool(missing)
        max_seq = check_seq_len(model.config, max_seq, path, rt, given=opts.max_seq_length is not None)
        arrays = _arrays(table, max_seq, tok)
        inputs = [arrays[k] for k in ("input_ids", "token_type_ids", "attention_mask")]
        (logits,) = infer(model, inputs, ("logits",), opts.predict_batch_size, mode := predict_mode(opts, rt), rt,
                          pad_to_batch=not opts.pad_to_max_length)
        if problem == "regression":
            preds, probs = logits.reshape(-1).astype(np.float64), None
        elif problem == "multi_label":
            probs = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
            preds = (probs >= THRESHOLD).astype(np.int64)
        else:
            z = logits.astype(np.float64)
            e = np.exp(z - z.max(axis=1, keepdims=True))
            probs = e / e.sum(axis=1, keepdims=True)
            preds = logits.argmax(axis=-1)
        settings = {"max_seq_length": max_seq, "do_lower_case": tok.do_lower_case, "predict_mode": mode, "engine": opts.engine}
        if not rt.is_main:
            return None
        _write_predictions(out_file, table, problem, labels, preds, probs, opts.label_separator, rt)
        note(rt, f"predicted {len(table.rows)} rows of {opts.data}; wrote {out_file}")
        return ClassifyRun(table=table, problem=problem, labels=labels, predictions=preds, probabilities=probs,
                           path=out_file, targets=targets, model_path=path, model_name=name, identity_path=ident,
                           train_args=train_args, new_head=new_head, settings=settings)


def _write_predictions(path, table, problem, labels, preds, probs, separator="|", rt=None) -> None:
    """One record per input row, in input order: every column of the row as read (CSV/TSV cells, or
    the JSON object's keys), unchanged, then the prediction: ``prediction`` (the class; multi-label:
    the predicted classes in the model's order, a list in JSON Lines, joined by ``separator`` in CSV)
    and ``p(CLASS)`` per class (softmax, or each class's sigmoid), or ``score`` (regression). A name
    the input already has becomes ``NAME.1`` (:func:`~bert_of.eval.user_data.free_name`), with a note."""
    wanted = ["score"] if problem == "regression" else ["prediction"] + [f"p({k})" for k in labels]
    names = prediction_names(wanted, table.columns)
    renamed = [f"{w!r} as {n!r}" for w, n in names.items() if w != n]
    if renamed:
        note(rt, f"note: {table.path} has columns named as predictions: writing {', '.join(renamed)}")
    jsonl = path.lower().endswith(".jsonl")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_open(path) as f:
        w = None if jsonl else csv.writer(f, lineterminator="\n")
        if w is not None:
            w.writerow(list(table.columns) + [names[k] for k in wanted])
        for i, r in enumerate(table.rows):
            if problem == "regression":
                got = {"score": float(preds[i])}
            else:
                got = {"prediction": [k for k, on in zip(labels, preds[i]) if on] if problem == "multi_label"
                       else labels[int(preds[i])]}
                got.update((f"p({k})", float(p)) for k, p in zip(labels, probs[i]))
            if jsonl:
                f.write(json.dumps({**r.record, **{names[k]: v for k, v in got.items()}}, ensure_ascii=False) + "\n")
            else:
                w.writerow([cell(r.record.get(c)) for c in table.columns]
                           + [separator.join(v) if isinstance(v, list) else cell(v) for v in got.values()])


def eval_classify(opts: ClassifyOptions, trained: str | None = None, model=None,
                  rt: Runtime | None = None) -> dict | None:
    """Predict a labeled file, score it (accuracy, macro-F1, MCC; Pearson, Spearman, MSE; or for
    multi-label micro-F1, macro-F1 and subset accuracy), print the scores as JSON and record them."""
    from bert_of.finetuning.steps import default_eval_dir, model_display_name, percent, predict_runtime, record
    rt = rt or predict_runtime(opts)
    if not opts.output:
        opts.output = default_eval_dir(model_display_name(opts.model), opts.data, NAME)
    run = predict_classify(opts, trained=trained, model=model, rt=rt, need_labels=True,
                           out_file=os.path.join(opts.output, PREDICTIONS_FILE))
    if run is None:
        return None
    if run.problem == "regression":
        metrics = percent(regression_metrics(run.targets, run.predictions), rt, keep=("mse",))
    elif run.problem == "multi_label":
        metrics = percent(multi_label_metrics(run.targets, run.predictions), rt)
    else:
        metrics = percent(classification_metrics(run.targets, run.predictions, len(run.labels)), rt)
    print(json.dumps({"task": NAME, "problem": run.problem, "examples": len(run.table.rows), **metrics}, indent=2),
          flush=True)
    record(opts, rt, NAME, metrics, run, pred_path=run.path, tool="bert-of eval classify")
    return metrics


class ClassifyTask(Task):
    name = "classify"
    options = ClassifyOptions
    predictions_file = PREDICTIONS_FILE
    file_kinds = OUTPUT_KINDS
    helps = {
        TRAIN: Help(
            'your own CSV / TSV / JSON Lines: classes or a regression target',
            'Fine-tune a classifier on a file with named columns (a text, optionally a second text, a '
            'label): string or integer labels are classes (sorted, recorded in the model), real numbers a '
            "regression target (MSE). run_classifier.py's defaults.",
            ('bert-of finetune classify --model bert-base-uncased --train train.csv -o sentiment-model/ '
             '--eval-data dev.csv',
             'bert-of finetune classify --model bert-base-uncased --train pairs.jsonl --text-column q1 '
             '--text-pair-column q2 --label-column same -o pairs-model/')),
        PREDICT: Help(
            "per row: the label and every class's probability (CSV / JSON Lines)",
            'Run a model from `bert-of finetune classify` over every row of a CSV / TSV / JSON Lines file '
            "(no labels needed); writes, in input order, each row's label and every class's probability "
            '(regression: the value) to OUTPUT (.csv or .jsonl).',
            ('bert-of predict classify --model sentiment-model/ --data new.csv -o preds.csv',
             'bert-of predict classify --model sentiment-model/ --data new.jsonl -o preds.jsonl')),
        EVAL: Help(
            'predict your own labeled CSV / TSV / JSON Lines file, score it and record it',
            'Classify DATA with a model from `bert-of finetune classify` (its classes, in its order), write '
            'OUTPUT/predictions.csv, score it (accuracy, macro-F1, MCC; regression: Pearson, Spearman, MSE), '
            'print that JSON and append it to the results store.',
            ('bert-of eval classify --model sentiment-model/ --data dev.csv',)),
    }

    def finetune(self, opts):
        return finetune_classify(opts)

    def predict(self, opts, trained=None, model=None, rt=None):
        return predict_classify(opts, trained, model, rt)

    def evaluate(self, opts, trained=None, model=None, rt=None):
        return eval_classify(opts, trained, model, rt)


TASK = ClassifyTask()
