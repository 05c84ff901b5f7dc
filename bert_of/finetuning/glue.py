"""GLUE / XNLI: fine-tuning, prediction and evaluation (run_classifier.py semantics).

    finetune_glue(GlueOptions(...)) / predict_glue(GlueOptions(...)) / eval_glue(GlueOptions(...))

The model is :class:`~bert_of.heads.BertForSequenceClassification`; its forward computes the
loss from ``labels``: cross-entropy, or the mean squared error of STS-B's one-output head.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bert_of.errors import ConfigError
from bert_of.eval.errors import EvalDataError
from bert_of.eval.glue_data import (convert_example_to_features, get_labels, read_examples, result_task_name,
                                    task_spec)
from bert_of.eval.glue_metrics import compute_metrics
from bert_of.files.atomic import atomic_open
from bert_of.finetuning.task import Help, ModelRun, Task
from bert_of.options import TRAINING, arg
from bert_of.eval.glue_data import TASK_CHOICES
from bert_of.finetuning.options import EVAL, GLUE_MAX_SEQ_LENGTH, PREDICT, RUNS, TRAIN, TaskOptions
from bert_of.progress import note, progress_iter

if TYPE_CHECKING:  # annotations only: the shared steps bring it when a task runs
    from bert_of.training.runtime import Runtime


GLUE = "GLUE / XNLI"


@dataclass(kw_only=True)
class GlueOptions(TaskOptions):
    """``bert-of finetune glue`` / ``predict glue`` / ``eval glue`` (run_classifier.py's defaults)."""

    data: str | None = arg(None, metavar="FILE", commands=RUNS, required=True,
                           help="TSV in the task's official layout (train, dev or test)",
                           helps={EVAL: "labeled TSV in the task's official layout"})
    lr: float = arg(2e-5, help="peak learning rate", metavar="LR", group=TRAINING, commands=(TRAIN,))
    epochs: float = arg(3.0, help="epochs", metavar="E", group=TRAINING, commands=(TRAIN,))
    task: str | None = arg(None, metavar="T", group=GLUE,  # fine-tuning: required (finetune_glue says so)
                           help=f"one of {', '.join(TASK_CHOICES)} (unset: the task the model was fine-tuned for)",
                           helps={TRAIN: f"one of {', '.join(TASK_CHOICES)}"})
    language: str | None = arg(None, help="XNLI: only this language's rows (e.g. de)", metavar="LANG", group=GLUE)
    max_seq_length: int | None = arg(None, metavar="N", group=GLUE,
                                     help=f"tokens per example (unset: {GLUE_MAX_SEQ_LENGTH}; prediction: as the "
                                          "model was trained)")
    skip_malformed: bool = arg(False, help="skip training lines with too few columns (QQP's train file has a few)",
                               group=GLUE, commands=(TRAIN,))


PREDICTIONS_FILE = "predictions.tsv"


@dataclass
class GlueRun(ModelRun):
    examples: list
    predictions: list  # label strings (floats for STS-B)
    path: str


def glue_arrays(examples, labels, max_seq_length, tok) -> dict:
    """Features named like the classifier's forward arguments (``labels``: class ids, or floats for STS-B)."""
    feats = [convert_example_to_features(e, labels, max_seq_length, tok)
             for e in progress_iter(examples, "GLUE features", unit="example")]
    out = {name: np.array([f[k] for f in feats], dtype=np.int64)
           for name, k in (("input_ids", "input_ids"), ("token_type_ids", "segment_ids"),
                           ("attention_mask", "input_mask"))}
    out["labels"] = np.array([f["label_id"] for f in feats], dtype=np.float32 if labels is None else np.int64)
    return out


def _classifier_labels(task: str):
    labels = get_labels(task)
    return labels, (1 if labels is None else len(labels))


def _labeled(opts: GlueOptions, path: str) -> None:
    """``path`` reads as the task's file and has labels (what eval needs)."""
    if any(e.label is None for e in read_examples(opts.task, path, language=opts.language)):
        raise EvalDataError(f"{path}: has no labels (a test file?); evaluation needs a labeled file")


def finetune_glue(opts: GlueOptions) -> dict:
    """Fine-tune in the run folder ``opts.output``, publish its final/ (checkpoint + train_args.json),
    evaluate ``opts.eval_data``."""
    from bert_of.finetuning.driver import (Runtime, base_args, check_eval_data, check_output, finish_finetuning,
                                            train)  # loads OneFlow: only when the task runs
    from bert_of.finetuning.steps import (check_head, check_seq_len, glue_seq_len, load_model, make_tokenizer,
                                          model_folder)
    from bert_of.heads import BertForSequenceClassification
    rt = Runtime.create(opts.device)
    if not opts.task:
        raise ConfigError("--task is required")
    spec = task_spec(opts.task)
    check_output(opts)
    examples = read_examples(opts.task, opts.train, language=opts.language, skip_malformed=opts.skip_malformed)
    if any(e.label is None for e in examples):
        raise EvalDataError(f"{opts.train}: has no labels (a test file?); train on a labeled file")
    labels, num_labels = _classifier_labels(opts.task)
    check_eval_data(opts, lambda d: _labeled(opts, d))
    max_seq = glue_seq_len(opts, {})
    with model_folder(opts) as (path, name, ident):
        check_head(path, num_labels, spec.name, name)
        tok = make_tokenizer(path, opts.do_lower_case, opts.vocab, rt, ident)
        model, _ = load_model(BertForSequenceClassification, path, seed=opts.seed, num_labels=num_labels)
        max_seq = check_seq_len(model.config, max_seq, path, rt, given=opts.max_seq_length is not None)
        if opts.vocab:
            model.vocab_file = opts.vocab  # saved with the fine-tuned checkpoint
        arrays = glue_arrays(examples, labels, max_seq, tok)
        cfg, summary, finished = train(model, arrays, len(examples), opts, opts.epochs, rt, f"finetune {spec.name}")
        args = base_args(spec.name.lower(), opts, cfg, opts.epochs, rt, ident, name, tok)
        args["hparams"].update(max_seq_length=max_seq)
        args.update(labels=labels, language=opts.language, train_examples=len(examples))
        return finish_finetuning(model, opts, rt, args, summary, finished, path, eval_glue)


def _glue_task(opts: GlueOptions, train_args: dict) -> str:
    task = opts.task or train_args.get("task")
    if not task:
        raise ConfigError("--task is required (the model's train_args.json does not name one)")
    return task


def predict_glue(opts: GlueOptions, trained: str | None = None, model=None,
                 rt: Runtime | None = None) -> GlueRun | None:
    """Class predictions for a GLUE/XNLI TSV (labeled or test); rank 0 writes a GLUE submission
    file (``index<TAB>prediction``), ``predictions.tsv`` in the folder ``opts.output``.
    ``trained``/``model``: the folder just written by fine-tuning and its model in memory."""
    from bert_of.finetuning.steps import (check_head, check_seq_len, glue_seq_len, load_predictor, make_tokenizer,
                                          model_folder, predict_mode, predict_runtime, read_train_args)
    from bert_of.training.inference import infer
    rt = rt or predict_runtime(opts)
    if not opts.output:
        raise ConfigError("predict glue: no --output folder")
    out_file = os.path.join(opts.output, PREDICTIONS_FILE)
    with model_folder(opts, trained) as (path, name, ident):
        train_args = read_train_args(path)
        task = _glue_task(opts, train_args)
        spec = task_spec(task)
        trained_for = train_args.get("task")
        if trained_for and trained_for != spec.name.lower() and not str(trained_for).startswith("squad"):
            note(rt, f"warning: {name} was fine-tuned for {trained_for}, predicting {spec.name}")
        examples = read_examples(task, opts.data, language=opts.language)
        labels, num_labels = _classifier_labels(task)
        tok = make_tokenizer(path, opts.do_lower_case, opts.vocab, rt, ident)  # train_args.json's, unless given
        max_seq = glue_seq_len(opts, train_args)
        new_head = False
        if model is None:
            check_head(path, num_labels, spec.name, name)
            model, missing = load_predictor("BertForSequenceClassification", path, name, opts, rt, seed=opts.seed,
                                            num_labels=num_labels)
            new_head = bool(missing)
            if new_head:
                note(rt, f"warning: {name} has no trained classifier head: predictions come from a random "
                         "(newly initialised) head")
        max_seq = check_seq_len(model.config, max_seq, path, rt, given=opts.max_seq_length is not None)
        arrays = glue_arrays(examples, labels, max_seq, tok)
        inputs = [arrays[k] for k in ("input_ids", "token_type_ids", "attention_mask")]
        (logits,) = infer(model, inputs, ("logits",), opts.predict_batch_size, mode := predict_mode(opts, rt), rt,
                          pad_to_batch=not opts.pad_to_max_length)
        if labels is None:
            preds = [float(v) for v in logits.reshape(-1)]
        else:
            preds = [labels[i] for i in logits.argmax(axis=-1)]
        settings = {"max_seq_length": max_seq, "do_lower_case": tok.do_lower_case, "predict_mode": mode, "engine": opts.engine}
        if opts.language:
            settings["language"] = opts.language
        if not rt.is_main:
            return None
        os.makedirs(os.path.dirname(os.path.abspath(out_file)), exist_ok=True)
        with atomic_open(out_file) as f:
            f.write("index\tprediction\n")
            for i, p in enumerate(preds):
                f.write(f"{i}\t{p!r}\n" if labels is None else f"{i}\t{p}\n")
        note(rt, f"predicted {len(examples)} {spec.name} examples; wrote {out_file}")
        return GlueRun(examples=examples, predictions=preds, path=out_file, model_path=path, model_name=name,
                       identity_path=ident, train_args=train_args, new_head=new_head, settings=settings)


def eval_glue(opts: GlueOptions, trained: str | None = None, model=None, rt: Runtime | None = None) -> dict | None:
    """Predict + score (eval.glue_metrics, percent) + record; prints the scores as JSON."""
    from bert_of.finetuning.steps import (default_eval_dir, model_display_name, percent, predict_runtime,
                                          read_train_args, record)
    rt = rt or predict_runtime(opts)
    if not opts.output:
        train_args = read_train_args(opts.model) if os.path.isdir(opts.model) else {}
        task = _glue_task(opts, train_args)
        d = default_eval_dir(model_display_name(opts.model), opts.data, task)
        opts.output = d
    run = predict_glue(opts, trained=trained, model=model, rt=rt)
    if run is None:
        return None
    task = _glue_task(opts, run.train_args)
    if any(e.label is None for e in run.examples):
        raise EvalDataError(f"{opts.data}: has no labels (a test file?); `bert-of predict glue` writes predictions "
                            "for it")
    metrics = percent(compute_metrics(task, [e.label for e in run.examples], run.predictions), rt)
    name = result_task_name(task, opts.data)
    if name == "xnli" and opts.language:
        name = f"xnli-{opts.language}"
    print(json.dumps({"task": name, "examples": len(run.examples), **metrics}, indent=2), flush=True)
    record(opts, rt, name, metrics, run, pred_path=run.path, tool="bert-of eval glue")
    return metrics


class GlueTask(Task):
    name = "glue"
    options = GlueOptions
    predictions_file = PREDICTIONS_FILE
    helps = {
        TRAIN: Help(
            'GLUE / XNLI classification (run_classifier.py)',
            "Fine-tune a classifier on a GLUE / XNLI train file, with run_classifier.py's defaults (each "
            'option shows its own). STS-B trains a one-output regression head (MSE).',
            ('bert-of finetune glue --task mrpc --model bert-base-uncased --train MRPC/train.tsv -o '
             'mrpc-model/ --eval-data MRPC/dev.tsv',
             'bert-of finetune glue --task sts-b --model bert-base-uncased --train STS-B/train.tsv -o stsb/ '
             '--epochs 5')),
        PREDICT: Help(
            'GLUE submission file (index<TAB>prediction)',
            'Classify every row of a GLUE / XNLI TSV (train, dev or test layout) into OUTPUT/predictions.tsv '
            '(index<TAB>prediction).',
            ('bert-of predict glue --model mrpc-model/ --data MRPC/test.tsv -o preds/',
             'bert-of eval glue-score --task mrpc --data MRPC/dev.tsv --predictions preds/predictions.tsv')),
        EVAL: Help(
            'predict a labeled GLUE / XNLI file with a model, score it and record it',
            'Classify DATA, write the predictions (GLUE submission format), score them (CoLA Matthews; '
            'MRPC/QQP F1 + accuracy; STS-B Pearson/Spearman; accuracy) and append the result to the results '
            'store.',
            ('bert-of eval glue --model mrpc-model/ --data MRPC/dev.tsv',
             'bert-of eval glue --model xnli-model/ --task xnli --language de --data xnli.dev.tsv')),
    }

    def finetune(self, opts):
        return finetune_glue(opts)

    def predict(self, opts, trained=None, model=None, rt=None):
        return predict_glue(opts, trained, model, rt)

    def evaluate(self, opts, trained=None, model=None, rt=None):
        return eval_glue(opts, trained, model, rt)


TASK = GlueTask()
