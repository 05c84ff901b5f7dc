"""SQuAD v1.1 / v2.0: fine-tuning, prediction and evaluation (run_squad.py semantics).

    finetune_squad(SquadOptions(...)) / predict_squad(SquadOptions(...)) / eval_squad(SquadOptions(...))

The model is :class:`~bert_of.heads.BertForQuestionAnswering`; its forward computes run_squad's
loss from ``start_positions`` / ``end_positions`` (an answer outside a window, and a v2.0
impossible question, point at [CLS]).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bert_of.errors import ConfigError
from bert_of.eval.errors import EvalDataError
from bert_of.eval.squad_data import convert_examples_to_features, features_to_arrays, load_squad, read_squad_examples
from bert_of.eval.squad_metrics import squad_score
from bert_of.eval.squad_predictions import postprocess_predictions, write_prediction_files
from bert_of.finetuning.task import Help, ModelRun, Task
from bert_of.options import TRAINING, arg
from bert_of.progress import note
from bert_of.finetuning.options import EVAL, PREDICT, RUNS, TRAIN, TaskOptions

if TYPE_CHECKING:  # annotations only: the shared steps bring it when a task runs
    from bert_of.training.runtime import Runtime


SQUAD_EPOCHS, SQUAD_V2_EPOCHS = 3.0, 2.0  # run_squad.py's default; Google's README trains SQuAD 2.0 for 2
SQUAD_LENGTHS = {"max_seq_length": 384, "doc_stride": 128, "max_query_length": 64}  # run_squad.py's

SQUAD_FEATURES, SQUAD_ANSWERS = "SQuAD features", "SQuAD predictions"


@dataclass(kw_only=True)
class SquadOptions(TaskOptions):
    """``bert-of finetune squad`` / ``predict squad`` / ``eval squad`` (run_squad.py's defaults)."""

    data: str | None = arg(None, metavar="FILE", commands=RUNS, required=True,
                           help="SQuAD v1.1 / v2.0 json (answers not needed)",
                           helps={EVAL: "labeled SQuAD v1.1 / v2.0 file"})
    lr: float = arg(5e-5, help="peak learning rate", metavar="LR", group=TRAINING, commands=(TRAIN,))
    epochs: float | None = arg(None, metavar="E", group=TRAINING, commands=(TRAIN,),
                               help=f"epochs (unset: {SQUAD_EPOCHS:g}, or {SQUAD_V2_EPOCHS:g} for SQuAD 2.0)")
    max_seq_length: int | None = arg(None, metavar="N", group=SQUAD_FEATURES,
                                     help=f"window length in WordPieces (unset: {SQUAD_LENGTHS['max_seq_length']} "
                                          "for training; prediction: as the model was trained)")
    doc_stride: int | None = arg(None, metavar="N", group=SQUAD_FEATURES,
                                 help=f"distance between windows (unset: {SQUAD_LENGTHS['doc_stride']}, or as the "
                                      "model was trained)")
    max_query_length: int | None = arg(None, metavar="N", group=SQUAD_FEATURES,
                                       help=f"question WordPieces kept (unset: {SQUAD_LENGTHS['max_query_length']}, "
                                            "or as the model was trained)")
    squad_version: str | None = arg(None, choices=("1.1", "2.0"), group=SQUAD_FEATURES,
                                    help="treat the data as SQuAD 1.1 or 2.0 (unset: the file's version / "
                                         "is_impossible)")
    n_best_size: int = arg(20, help="n-best list length", metavar="N", group=SQUAD_ANSWERS)
    max_answer_length: int = arg(30, help="longest answer in WordPieces", metavar="N", group=SQUAD_ANSWERS)
    null_score_diff_threshold: float = arg(0.0, metavar="T", group=SQUAD_ANSWERS,
                                           help='v2.0: predict "" when null score - best span score > T')


@dataclass
class SquadRun(ModelRun):
    """What predict_squad produced."""

    squad: object  # SquadData
    predictions: object  # SquadPredictions
    paths: dict


def _squad_lengths(opts: SquadOptions, train_args: dict) -> dict:
    """max_seq_length / doc_stride / max_query_length: the option, else what training used, else Google's."""
    saved = train_args.get("hparams", {}) if train_args.get("task", "").startswith("squad") else {}
    out = {}
    for k in ("max_seq_length", "doc_stride", "max_query_length"):
        v = getattr(opts, k)
        out[k] = int(v if v is not None else saved.get(k, SQUAD_LENGTHS[k]))
    if out["doc_stride"] < 1 or out["max_query_length"] < 1:
        raise ConfigError("--doc-stride and --max-query-length must be positive")
    return out


def _squad_version(opts: SquadOptions, sd) -> bool:
    v = opts.squad_version
    if v is None:
        return sd.is_v2
    if v not in ("1.1", "2.0"):
        raise ConfigError(f"--squad-version {v!r}: expected 1.1 or 2.0")
    return v == "2.0"


def finetune_squad(opts: SquadOptions) -> dict:
    """Fine-tune in the run folder ``opts.output``, publish its final/ (checkpoint + train_args.json),
    evaluate ``opts.eval_data``."""
    from bert_of.finetuning.driver import (Runtime, base_args, check_eval_data, check_output, finish_finetuning,
                                            train)  # loads OneFlow: only when the task runs
    from bert_of.finetuning.steps import check_seq_len, load_model, make_tokenizer, model_folder
    from bert_of.heads import BertForQuestionAnswering
    rt = Runtime.create(opts.device)
    check_output(opts)
    sd = load_squad(opts.train)
    v2 = _squad_version(opts, sd)
    examples = read_squad_examples(sd, is_training=True, version_2_with_negative=v2,
                                   warn=lambda m: note(rt, f"warning: {opts.train}: {m}"))
    if not examples:
        raise EvalDataError(f"{opts.train}: no usable training questions")
    check_eval_data(opts, lambda d: read_squad_examples(load_squad(d, check_spans=False), is_training=False,
                                                        version_2_with_negative=v2))
    epochs = opts.epochs if opts.epochs is not None else SQUAD_V2_EPOCHS if v2 else SQUAD_EPOCHS
    lengths = _squad_lengths(opts, {})
    with model_folder(opts) as (path, name, ident):
        tok = make_tokenizer(path, opts.do_lower_case, opts.vocab, rt, ident)
        model, _ = load_model(BertForQuestionAnswering, path, seed=opts.seed)
        lengths["max_seq_length"] = check_seq_len(model.config, lengths["max_seq_length"], path, rt,
                                                  given=opts.max_seq_length is not None)
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
        cfg, summary, finished = train(model, arrays, len(examples), opts, epochs, rt, f"finetune {task}", unit="windows",
                                       pad_to_batch=False)  # run_squad's loss: a softmax over every position
        args = base_args(task, opts, cfg, epochs, rt, ident, name, tok)
        args["hparams"].update(lengths)
        args.update(train_examples=len(examples), train_features=n_features)
        return finish_finetuning(model, opts, rt, args, summary, finished, path, eval_squad)


def predict_squad(opts: SquadOptions, trained: str | None = None, model=None,
                  rt: Runtime | None = None) -> SquadRun | None:
    """Predictions for a SQuAD file; rank 0 writes them into ``opts.output`` and returns them.
    ``trained``/``model``: the folder just written by fine-tuning and its model in memory."""
    from bert_of.finetuning.steps import (check_seq_len, load_predictor, make_tokenizer, model_folder, predict_mode,
                                          predict_runtime, read_train_args)
    from bert_of.training.inference import infer
    rt = rt or predict_runtime(opts)
    if not opts.output:
        raise ConfigError("predict squad: no --output folder")
    sd = load_squad(opts.data, check_spans=False)
    v2 = _squad_version(opts, sd)
    with model_folder(opts, trained) as (path, name, ident):
        train_args = read_train_args(path)
        tok = make_tokenizer(path, opts.do_lower_case, opts.vocab, rt, ident)  # train_args.json's, unless given
        lengths = _squad_lengths(opts, train_args)
        new_head = False
        if model is None:
            model, missing = load_predictor("BertForQuestionAnswering", path, name, opts, rt, seed=opts.seed)
            new_head = bool(missing)
            if new_head:
                note(rt, f"warning: {name} has no trained SQuAD head: predictions come from a random "
                         "(newly initialised) head")
        lengths["max_seq_length"] = check_seq_len(model.config, lengths["max_seq_length"], path, rt,
                                                  given=opts.max_seq_length is not None)
        examples = read_squad_examples(sd, is_training=False, version_2_with_negative=v2)
        features = convert_examples_to_features(examples, tok, is_training=False, **lengths)
        arr = features_to_arrays(features)
        t0 = time.perf_counter()
        # a short window runs at its batch's longest row, not max_seq_length: the positions past it are
        # padding, not computed, and rank last in the n-best (-inf); run_squad ranks padding positions'
        # logits with the real ones, so where they crowded a window's top n_best_size the n-best can
        # differ from --pad-to-max-length's (answers equal on the fixtures: tests/test_finetune.py)
        start, end = infer(model, [arr["input_ids"], arr["segment_ids"], arr["input_mask"]],
                           ("start_logits", "end_logits"), opts.predict_batch_size, mode := predict_mode(opts, rt), rt,
                           pad_to_batch=not opts.pad_to_max_length, positions=("start_logits", "end_logits"),
                           fill=float("-inf"))
        secs = time.perf_counter() - t0
        settings = dict(lengths, n_best_size=opts.n_best_size, max_answer_length=opts.max_answer_length,
                        null_score_diff_threshold=float(opts.null_score_diff_threshold),
                        do_lower_case=tok.do_lower_case, version_2_with_negative=v2, predict_mode=mode, engine=opts.engine)
        if not rt.is_main:
            return None
        preds = postprocess_predictions(examples, features, start, end, n_best_size=settings["n_best_size"],
                                        max_answer_length=settings["max_answer_length"],
                                        do_lower_case=tok.do_lower_case, version_2_with_negative=v2,
                                        null_score_diff_threshold=settings["null_score_diff_threshold"])
        paths = write_prediction_files(opts.output, preds)
        note(rt, f"predicted {len(examples)} questions ({len(features)} windows, {secs:.1f} s); wrote "
                 + ", ".join(paths[k] for k in paths))
        return SquadRun(squad=sd, predictions=preds, paths=paths, model_path=path, model_name=name,
                        identity_path=ident, train_args=train_args, new_head=new_head, settings=settings)


def eval_squad(opts: SquadOptions, trained: str | None = None, model=None,
               rt: Runtime | None = None) -> dict | None:
    """Predict + score (official-equivalent) + record; prints the official script's JSON."""
    from bert_of.finetuning.steps import default_eval_dir, model_display_name, predict_runtime, record
    rt = rt or predict_runtime(opts)
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
    record(opts, rt, f"squad-v{score.version}", dict(score.result), run, pred_path=run.paths["predictions"],
           tool="bert-of eval squad", settings=dict(run.settings, output_dir=os.path.abspath(opts.output)))
    return dict(score.result)


class SquadTask(Task):
    name = "squad"
    options = SquadOptions
    predictions_file = "predictions.json"
    helps = {
        TRAIN: Help(
            'SQuAD v1.1 / v2.0 (run_squad.py)',
            'Fine-tune a span-prediction head on a SQuAD train file (v2.0 when the file says so), with '
            "run_squad.py's defaults (each option shows its own).",
            ('bert-of finetune squad --model bert-base-uncased --train train-v1.1.json -o squad-model/ '
             '--eval-data dev-v1.1.json',
             'bert-of finetune squad --model cased_L-12_H-768_A-12/ --no-lower-case --train train-v2.0.json '
             '-o sq2/ --nproc 2',
             'bert-of finetune squad --model mini/ --train small.json -o run/ --steps 100 --save-every 50',
             'bert-of finetune squad -o run/ --resume')),
        PREDICT: Help(
            'predictions.json, nbest_predictions.json (+ null_odds.json for v2.0)',
            'run_squad.py prediction: windows with doc_stride, max-context tokens, n-best list, longest '
            'answer, v2.0 null score threshold; official file formats.',
            ('bert-of predict squad --model squad-model/ --data dev-v1.1.json -o preds/',
             'bert-of eval squad-score --data dev-v1.1.json --predictions preds/predictions.json')),
        EVAL: Help(
            'predict a SQuAD file with a model, score it (official) and record it',
            'Run the model over DATA (run_squad.py features and post-processing), write predictions.json / '
            'nbest_predictions.json (/ null_odds.json), score them as the official evaluate script of the '
            "file's version does, print that JSON, and append the result to the results store.",
            ('bert-of eval squad --model squad-model/ --data dev-v1.1.json',
             'bert-of eval squad --model squad-model/ --data dev-v2.0.json -o preds/ --name my-bert-v2')),
    }

    def finetune(self, opts):
        return finetune_squad(opts)

    def predict(self, opts, trained=None, model=None, rt=None):
        return predict_squad(opts, trained, model, rt)

    def evaluate(self, opts, trained=None, model=None, rt=None):
        return eval_squad(opts, trained, model, rt)


TASK = SquadTask()
