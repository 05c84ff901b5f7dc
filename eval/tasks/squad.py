"""SQuAD v1.1 / v2.0: fine-tuning, prediction and evaluation (run_squad.py semantics).

    finetune_squad(SquadTrainOptions(...)) / predict_squad(SquadPredictOptions(...)) / eval_squad(SquadEvalOptions(...))

The model is :class:`~bert_of.modeling.BertForQuestionAnswering`; its forward computes run_squad's
loss from ``start_positions`` / ``end_positions`` (an answer outside a window, and a v2.0
impossible question, point at [CLS]).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from bert_of.errors import ConfigError
from bert_of.eval.errors import EvalDataError
from bert_of.eval.squad_data import (convert_examples_to_features, features_to_arrays, load_squad,
                                     postprocess_predictions, read_squad_examples, write_prediction_files)
from bert_of.eval.squad_metrics import squad_score
from bert_of.eval.tasks.common import (COMMON_DEFAULTS, ModelOptions, RecordOptions, TrainOptions, base_args,
                                       check_output, check_seq_len, default_eval_dir, hyper, infer, load_model,
                                       make_tokenizer, model_display_name, model_folder, read_train_args, record,
                                       save_finetuned, train, train_sources)
from bert_of.modeling import BertForQuestionAnswering
from bert_of.training.loop import note
from bert_of.training.runtime import Runtime

SQUAD_TRAIN_DEFAULTS = dict(lr=5e-5, batch_size=32, epochs=3.0, epochs_v2=2.0, warmup_proportion=0.1,
                            max_seq_length=384, doc_stride=128, max_query_length=64)
SQUAD_PREDICT_DEFAULTS = dict(n_best_size=20, max_answer_length=30, null_score_diff_threshold=0.0,
                              predict_batch_size=COMMON_DEFAULTS["predict_batch_size"])


@dataclass(kw_only=True)
class SquadFeatureOptions:
    """Windows (None: as the model was trained, else Google's 384 / 128 / 64) and the data's version."""

    max_seq_length: int | None = None
    doc_stride: int | None = None
    max_query_length: int | None = None
    version: str | None = None  # "1.1" | "2.0"; None: the file's own


@dataclass(kw_only=True)
class SquadAnswerOptions:
    """Post-processing (None: n-best 20, max answer length 30, null threshold 0.0)."""

    n_best_size: int | None = None
    max_answer_length: int | None = None
    null_score_diff_threshold: float | None = None


@dataclass(kw_only=True)
class SquadTrainOptions(TrainOptions, SquadFeatureOptions, SquadAnswerOptions):
    """``bert-of finetune squad`` (the answer options serve the evaluations of ``eval_data``)."""


@dataclass(kw_only=True)
class SquadPredictOptions(ModelOptions, SquadFeatureOptions, SquadAnswerOptions):
    """``bert-of predict squad``."""

    data: str
    output: str | None = None  # the folder for the prediction files


@dataclass(kw_only=True)
class SquadEvalOptions(SquadPredictOptions, RecordOptions):
    """``bert-of eval squad``: output None = $BERT_OF_HOME/eval/MODEL/squad-DATA-TIME/."""


@dataclass
class SquadRun:
    """What predict_squad produced."""

    squad: object  # SquadData
    predictions: object  # SquadPredictions
    paths: dict
    settings: dict
    model_path: str
    model_name: str
    identity_path: str
    train_args: dict
    new_head: bool


def _squad_lengths(opts: SquadFeatureOptions, train_args: dict) -> dict:
    """max_seq_length / doc_stride / max_query_length: the option, else what training used, else Google's."""
    saved = train_args.get("hparams", {}) if train_args.get("task", "").startswith("squad") else {}
    out = {}
    for k in ("max_seq_length", "doc_stride", "max_query_length"):
        v = getattr(opts, k)
        out[k] = int(v if v is not None else saved.get(k, SQUAD_TRAIN_DEFAULTS[k]))
    if out["doc_stride"] < 1 or out["max_query_length"] < 1:
        raise ConfigError("--doc-stride and --max-query-length must be positive")
    return out


def _squad_version(opts: SquadFeatureOptions, sd) -> bool:
    v = opts.version
    if v is None:
        return sd.is_v2
    if v not in ("1.1", "2.0"):
        raise ConfigError(f"--version {v!r}: expected 1.1 or 2.0")
    return v == "2.0"


def finetune_squad(opts: SquadTrainOptions) -> dict:
    """Fine-tune, publish ``opts.output`` (checkpoint + train_args.json), evaluate ``opts.eval_data``."""
    rt = Runtime.create(opts.device)
    check_output(opts)
    sd = load_squad(opts.train)
    v2 = _squad_version(opts, sd)
    examples = read_squad_examples(sd, is_training=True, version_2_with_negative=v2,
                                   warn=lambda m: note(rt, f"warning: {opts.train}: {m}"))
    if not examples:
        raise EvalDataError(f"{opts.train}: no usable training questions")
    h = hyper(opts, SQUAD_TRAIN_DEFAULTS, SQUAD_TRAIN_DEFAULTS["epochs_v2" if v2 else "epochs"])
    lengths = _squad_lengths(opts, {})
    with model_folder(opts) as (path, name, ident):
        tok = make_tokenizer(path, opts.do_lower_case, opts.vocab, rt)
        model, _ = load_model(BertForQuestionAnswering, path, seed=h.seed)
        check_seq_len(model.config, lengths["max_seq_length"], path)
        if opts.vocab:
            model.vocab_file = opts.vocab  # saved with the fine-tuned checkpoint
        features = convert_examples_to_features(examples, tok, is_training=True, **lengths)
        arr = features_to_arrays(features, is_training=True)
        n_features = len(features)
        del features  # the arrays are all training needs (the real train set makes ~88k windows)
        arrays = {"input_ids": arr["input_ids"], "token_type_ids": arr["segment_ids"],
                  "attention_mask": arr["input_mask"], "start_positions": arr["start_positions"],
                  "end_positions": arr["end_positions"]}
        task = f"squad-v{'2.0' if v2 else '1.1'}"
        summary, finished = train(model, arrays, len(examples), h, rt, opts, f"finetune {task}", unit="windows")
        args = base_args(task, h, rt, ident, name, opts.train, tok.do_lower_case)
        args["hparams"].update(lengths, steps=h.steps, warmup_steps=h.warmup_steps)
        args.update(train_examples=len(examples), train_features=n_features, **summary)
        if not finished:
            return args
        save_finetuned(model, opts.output, args, opts.overwrite, rt, train_sources(opts, path))
    note(rt, f"wrote {opts.output} (loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f}, "
             f"{summary['train_seconds']:.1f} s)")
    for data in opts.eval_data:
        eval_squad(_after_training(opts, data), trained=opts.output, model=model, rt=rt)
    return args


def _after_training(opts: SquadTrainOptions, data: str) -> SquadEvalOptions:
    """The options of the evaluation of the checkpoint just written."""
    keep = {k: getattr(opts, k) for k in SquadEvalOptions.__dataclass_fields__ if hasattr(opts, k)}
    return SquadEvalOptions(**dict(keep, data=data, output=None, model=opts.output, name=None))


def predict_squad(opts: SquadPredictOptions, trained: str | None = None, model=None,
                  rt: Runtime | None = None) -> SquadRun | None:
    """Predictions for a SQuAD file; rank 0 writes them into ``opts.output`` and returns them.
    ``trained``/``model``: the folder just written by fine-tuning and its model in memory."""
    rt = rt or Runtime.create(opts.device)
    if not opts.output:
        raise ConfigError("predict squad: no --output folder")
    sd = load_squad(opts.data, check_spans=False)
    v2 = _squad_version(opts, sd)
    with model_folder(opts, trained) as (path, name, ident):
        train_args = read_train_args(path)
        lower = opts.do_lower_case if opts.do_lower_case is not None else train_args.get("do_lower_case", True)
        tok = make_tokenizer(path, lower, opts.vocab, rt)
        lengths = _squad_lengths(opts, train_args)
        new_head = False
        if model is None:
            model, missing = load_model(BertForQuestionAnswering, path, seed=COMMON_DEFAULTS["seed"])
            new_head = bool(missing)
            if new_head:
                note(rt, f"warning: {name} has no trained SQuAD head: predictions come from a random "
                         "(newly initialised) head")
            rt.place(model)
        check_seq_len(model.config, lengths["max_seq_length"], path)
        examples = read_squad_examples(sd, is_training=False, version_2_with_negative=v2)
        features = convert_examples_to_features(examples, tok, is_training=False, **lengths)
        arr = features_to_arrays(features)
        pick = {k: getattr(opts, k) for k in SQUAD_PREDICT_DEFAULTS}
        s = {k: (SQUAD_PREDICT_DEFAULTS[k] if v is None else v) for k, v in pick.items()}
        mode = opts.mode or COMMON_DEFAULTS["mode"]
        t0 = time.perf_counter()
        start, end = infer(model, [arr["input_ids"], arr["segment_ids"], arr["input_mask"]],
                           ("start_logits", "end_logits"), int(s["predict_batch_size"]), mode, rt)
        secs = time.perf_counter() - t0
        settings = dict(lengths, n_best_size=int(s["n_best_size"]), max_answer_length=int(s["max_answer_length"]),
                        null_score_diff_threshold=float(s["null_score_diff_threshold"]),
                        do_lower_case=tok.do_lower_case, version_2_with_negative=v2, predict_mode=mode)
        if not rt.is_main:
            return None
        preds = postprocess_predictions(examples, features, start, end, n_best_size=settings["n_best_size"],
                                        max_answer_length=settings["max_answer_length"],
                                        do_lower_case=tok.do_lower_case, version_2_with_negative=v2,
                                        null_score_diff_threshold=settings["null_score_diff_threshold"])
        paths = write_prediction_files(opts.output, preds)
        note(rt, f"predicted {len(examples)} questions ({len(features)} windows, {secs:.1f} s); wrote "
                 + ", ".join(paths[k] for k in paths))
        return SquadRun(sd, preds, paths, settings, path, name, ident, train_args, new_head)


def eval_squad(opts: SquadEvalOptions, trained: str | None = None, model=None,
               rt: Runtime | None = None) -> dict | None:
    """Predict + score (official-equivalent) + record; prints the official script's JSON."""
    rt = rt or Runtime.create(opts.device)
    if not opts.output:
        opts.output = default_eval_dir(model_display_name(opts.model), opts.data, "squad")
    run = predict_squad(opts, trained=trained, model=model, rt=rt)
    if run is None:
        return None
    v2 = run.settings["version_2_with_negative"]
    na = run.paths.get("null_odds")
    score = squad_score(opts.data, run.paths["predictions"], na_prob_file=na,
                        na_prob_thresh=run.settings["null_score_diff_threshold"] if na else 1.0,
                        version="2.0" if v2 else "1.1")
    for line in score.notes:
        note(rt, line)
    print(json.dumps(score.result) if score.version == "1.1" else json.dumps(score.result, indent=2), flush=True)
    record(opts, rt, f"squad-v{score.version}", dict(score.result), data_path=opts.data,
           pred_path=run.paths["predictions"], model_path=run.identity_path, model_name=run.model_name,
           train_args=run.train_args, settings=dict(run.settings, output_dir=os.path.abspath(opts.output)),
           tool="bert-of eval squad", new_head=run.new_head)
    return dict(score.result)
