"""GLUE / XNLI fine-tuning, prediction and evaluation (run_classifier.py semantics)."""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass

import numpy as np

from bert_of._flow import flow
from bert_of.errors import CheckpointError, ConfigError
from bert_of.eval.errors import EvalDataError
from bert_of.fs import atomic_open
from bert_of.eval.tasks.common import (COMMON_DEFAULTS, SQUAD_PREDICT_DEFAULTS, Runtime, _base_args, _check_output,
                                       _check_seq_len, _checkpoint_head_labels, _eval_opts, _hyper, _record,
                                       default_eval_dir, infer, load_model, make_tokenizer, note, read_train_args,
                                       resolve_model, save_finetuned, train_loop)

GLUE_TRAIN_DEFAULTS = dict(lr=2e-5, batch_size=32, epochs=3.0, warmup_proportion=0.1, max_seq_length=128)


class ClassifierLoss(flow.nn.Module):
    """CE over the labels; MSE for a one-output (regression) head."""

    def __init__(self, model, regression: bool):
        super().__init__()
        self.model, self.regression = model, regression

    def forward(self, input_ids, segment_ids, input_mask, labels):
        logits = self.model(input_ids, segment_ids, input_mask).logits
        if self.regression:
            diff = logits.reshape(-1) - labels
            return (diff * diff).mean()
        return flow.nn.functional.cross_entropy(logits, labels)


def _glue_arrays(examples, labels, max_seq_length, tok):
    from bert_of.eval.glue import convert_example_to_features

    feats = [convert_example_to_features(e, labels, max_seq_length, tok) for e in examples]
    out = [np.array([f[k] for f in feats], dtype=np.int64) for k in ("input_ids", "segment_ids", "input_mask")]
    label_dtype = np.float32 if labels is None else np.int64
    return out, np.array([f["label_id"] for f in feats], dtype=label_dtype)


def _glue_seq_len(opts, train_args: dict) -> int:
    v = getattr(opts, "max_seq_length", None)
    glue_trained = train_args.get("task") and not str(train_args["task"]).startswith("squad")
    saved = (train_args.get("hparams") or {}).get("max_seq_length") if glue_trained else None
    return int(v if v is not None else (saved or GLUE_TRAIN_DEFAULTS["max_seq_length"]))


def _classifier_labels(task: str):
    from bert_of.eval.glue import get_labels

    labels = get_labels(task)
    return labels, (1 if labels is None else len(labels))


def _check_head(path: str, num_labels: int, task: str, name: str) -> None:
    have = _checkpoint_head_labels(path)
    if have is not None and have != num_labels:
        raise CheckpointError(f"{name}: its classifier head has {have} output(s) but {task} needs {num_labels} "
                              "(a checkpoint fine-tuned for another task?)")


def finetune_glue(opts) -> dict:
    from bert_of.modeling import BertForSequenceClassification
    from bert_of.eval.glue import read_examples, task_spec

    rt = Runtime.create(getattr(opts, "device", None))
    spec = task_spec(opts.task)
    _check_output(opts.output, opts.overwrite)
    examples = read_examples(opts.task, opts.train, language=getattr(opts, "language", None),
                             skip_malformed=getattr(opts, "skip_malformed", False))
    if any(e.label is None for e in examples):
        raise EvalDataError(f"{opts.train}: has no labels (a test file?); train on a labeled file")
    labels, num_labels = _classifier_labels(opts.task)
    h = _hyper(opts, GLUE_TRAIN_DEFAULTS, GLUE_TRAIN_DEFAULTS["epochs"])
    max_seq = _glue_seq_len(opts, {})
    path, name, tmp = resolve_model(opts.model)
    try:
        _check_head(path, num_labels, spec.name, name)
        tok = make_tokenizer(path, opts.do_lower_case, getattr(opts, "vocab", None), rt)
        model, _ = load_model(BertForSequenceClassification, path, seed=h.seed, num_labels=num_labels)
        _check_seq_len(model.config, max_seq, path)
        if getattr(opts, "vocab", None):
            model.vocab_file = opts.vocab  # saved with the fine-tuned checkpoint
        inputs, y = _glue_arrays(examples, labels, max_seq, tok)
        rt.place(model)
        summary = train_loop(ClassifierLoss(model, labels is None), model, inputs + [y], len(examples), h, rt,
                             opts.log_every or COMMON_DEFAULTS["log_every"], f"finetune {spec.name}")
        task = spec.name.lower()
        args = _base_args(task, h, rt, path, name, None if tmp is None else os.path.abspath(opts.model),
                          opts.train, tok.do_lower_case)
        args["hparams"].update(max_seq_length=max_seq, steps=h.steps, warmup_steps=h.warmup_steps)
        args.update(labels=labels, language=getattr(opts, "language", None), train_examples=len(examples), **summary)
        save_finetuned(model, opts.output, args, opts.overwrite, rt)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    note(rt, f"wrote {opts.output} (loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f}, "
             f"{summary['train_seconds']:.1f} s)")
    for data in getattr(opts, "eval_data", None) or []:
        eval_glue(_eval_opts(opts, data), model=model, rt=rt)
    return args


@dataclass
class GlueRun:
    examples: list
    predictions: list  # label strings (floats for STS-B)
    path: str
    settings: dict
    model_path: str
    model_name: str
    identity_path: str
    train_args: dict
    new_head: bool


def _glue_task(opts, train_args: dict) -> str:
    task = getattr(opts, "task", None) or train_args.get("task")
    if not task:
        raise ConfigError("--task is required (the model's train_args.json does not name one)")
    return task


def predict_glue(opts, model=None, rt: Runtime | None = None) -> GlueRun | None:
    """Class predictions for a GLUE/XNLI TSV (labeled or test); rank 0 writes a GLUE submission
    file (``index<TAB>prediction``) to ``opts.output``."""
    from bert_of.modeling import BertForSequenceClassification
    from bert_of.eval.glue import read_examples, task_spec

    rt = rt or Runtime.create(getattr(opts, "device", None))
    tmp = None
    if model is None:
        path, name, tmp = resolve_model(opts.model)
    else:
        path, name = os.path.abspath(opts.output_model), os.path.basename(os.path.abspath(opts.output_model))
    try:
        train_args = read_train_args(path)
        task = _glue_task(opts, train_args)
        spec = task_spec(task)
        trained = train_args.get("task")
        if trained and trained != spec.name.lower() and not str(trained).startswith("squad"):
            note(rt, f"warning: {name} was fine-tuned for {trained}, predicting {spec.name}")
        examples = read_examples(task, opts.data, language=getattr(opts, "language", None))
        labels, num_labels = _classifier_labels(task)
        lower = opts.do_lower_case if opts.do_lower_case is not None else train_args.get("do_lower_case", True)
        tok = make_tokenizer(path, lower, getattr(opts, "vocab", None), rt)
        max_seq = _glue_seq_len(opts, train_args)
        new_head = False
        if model is None:
            _check_head(path, num_labels, spec.name, name)
            model, missing = load_model(BertForSequenceClassification, path, seed=COMMON_DEFAULTS["seed"],
                                        num_labels=num_labels)
            new_head = bool(missing)
            if new_head:
                note(rt, f"warning: {name} has no trained classifier head: predictions come from a random "
                         "(newly initialised) head")
            rt.place(model)
        _check_seq_len(model.config, max_seq, path)
        inputs, _ = _glue_arrays(examples, labels, max_seq, tok)
        mode = getattr(opts, "mode", None) or COMMON_DEFAULTS["mode"]
        bs = getattr(opts, "predict_batch_size", None) or SQUAD_PREDICT_DEFAULTS["predict_batch_size"]
        (logits,) = infer(model, inputs, ("logits",), int(bs), mode, rt)
        if labels is None:
            preds = [float(v) for v in logits.reshape(-1)]
        else:
            preds = [labels[i] for i in logits.argmax(axis=-1)]
        settings = {"max_seq_length": max_seq, "do_lower_case": tok.do_lower_case, "predict_mode": mode}
        if getattr(opts, "language", None):
            settings["language"] = opts.language
        if not rt.is_main:
            return None
        out = opts.output
        with atomic_open(out) as f:
            f.write("index\tprediction\n")
            for i, p in enumerate(preds):
                f.write(f"{i}\t{p!r}\n" if labels is None else f"{i}\t{p}\n")
        note(rt, f"predicted {len(examples)} {spec.name} examples; wrote {out}")
        ident = os.path.abspath(opts.model) if tmp is not None else path
        return GlueRun(examples, preds, out, settings, path, name, ident, train_args, new_head)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def eval_glue(opts, model=None, rt: Runtime | None = None) -> dict | None:
    """Predict + score (eval.glue metrics, percent) + record; prints the scores as JSON."""
    from bert_of.eval.cli import _glue_task_name
    from bert_of.eval.glue import compute_metrics

    rt = rt or Runtime.create(getattr(opts, "device", None))
    if not getattr(opts, "output", None):
        train_args = read_train_args(opts.model) if os.path.isdir(opts.model) else {}
        task = _glue_task(opts, train_args)
        name = os.path.basename(os.path.abspath(opts.model).rstrip(os.sep)) if os.path.isdir(opts.model) else opts.model
        d = default_eval_dir(name, opts.data, task)
        opts.output = os.path.join(d, "predictions.tsv")
    run = predict_glue(opts, model=model, rt=rt)
    if run is None:
        return None
    task = _glue_task(opts, run.train_args)
    if any(e.label is None for e in run.examples):
        raise EvalDataError(f"{opts.data}: has no labels (a test file?); `bert-of predict glue` writes predictions "
                            "for it")
    metrics = {}
    for k, v in compute_metrics(task, [e.label for e in run.examples], run.predictions).items():
        if math.isnan(v):
            note(rt, f"note: {k} is undefined for these predictions (constant values); reported as null")
            metrics[k] = None
        else:
            metrics[k] = 100.0 * v
    name = _glue_task_name(task, opts.data)
    if name == "xnli" and getattr(opts, "language", None):
        name = f"xnli-{opts.language}"
    print(json.dumps({"task": name, "examples": len(run.examples), **metrics}, indent=2), flush=True)
    _record(opts, rt, name, metrics, data_path=opts.data, pred_path=run.path, model_path=run.identity_path,
            model_name=run.model_name, train_args=run.train_args, settings=run.settings, tool="bert-of eval glue",
            new_head=run.new_head)
    return metrics
