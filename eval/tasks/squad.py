"""SQuAD v1.1 / v2.0 fine-tuning, prediction and evaluation (run_squad.py semantics)."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass

from bert_of._flow import flow
from bert_of.errors import ConfigError
from bert_of.eval.errors import EvalDataError
from bert_of.eval.tasks.common import (COMMON_DEFAULTS, SQUAD_PREDICT_DEFAULTS, Runtime, _base_args, _check_output,
                                       _check_seq_len, _eval_opts, _hyper, _record, default_eval_dir, infer,
                                       load_model, make_tokenizer, note, read_train_args, resolve_model,
                                       save_finetuned, train_loop)

SQUAD_TRAIN_DEFAULTS = dict(lr=5e-5, batch_size=32, epochs=3.0, epochs_v2=2.0, warmup_proportion=0.1,
                            max_seq_length=384, doc_stride=128, max_query_length=64)


class SquadLoss(flow.nn.Module):
    """(CE(start) + CE(end)) / 2, as run_squad's compute_loss."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, segment_ids, input_mask, start_positions, end_positions):
        out = self.model(input_ids, segment_ids, input_mask)
        ce = flow.nn.functional.cross_entropy
        return (ce(out.start_logits, start_positions) + ce(out.end_logits, end_positions)) / 2.0


def _squad_lengths(opts, train_args: dict) -> dict:
    """max_seq_length / doc_stride / max_query_length: the option, else what training used, else Google's."""
    saved = train_args.get("hparams", {}) if train_args.get("task", "").startswith("squad") else {}
    out = {}
    for k in ("max_seq_length", "doc_stride", "max_query_length"):
        v = getattr(opts, k, None)
        out[k] = int(v if v is not None else saved.get(k, SQUAD_TRAIN_DEFAULTS[k]))
    if out["doc_stride"] < 1 or out["max_query_length"] < 1:
        raise ConfigError("--doc-stride and --max-query-length must be positive")
    return out


def _squad_version(opts, sd) -> bool:
    v = getattr(opts, "version", None)
    if v is None:
        return sd.is_v2
    if v not in ("1.1", "2.0"):
        raise ConfigError(f"--version {v!r}: expected 1.1 or 2.0")
    return v == "2.0"


def finetune_squad(opts) -> dict:
    from bert_of.modeling import BertForQuestionAnswering
    from bert_of.eval.squad_data import (convert_examples_to_features, features_to_arrays, load_squad,
                                 read_squad_examples)

    rt = Runtime.create(getattr(opts, "device", None))
    _check_output(opts.output, opts.overwrite)
    sd = load_squad(opts.train)
    v2 = _squad_version(opts, sd)
    examples = read_squad_examples(sd, is_training=True, version_2_with_negative=v2,
                                   warn=lambda m: note(rt, f"warning: {opts.train}: {m}"))
    if not examples:
        raise EvalDataError(f"{opts.train}: no usable training questions")
    h = _hyper(opts, SQUAD_TRAIN_DEFAULTS, SQUAD_TRAIN_DEFAULTS["epochs_v2" if v2 else "epochs"])
    lengths = _squad_lengths(opts, {})
    path, name, tmp = resolve_model(opts.model)
    try:
        tok = make_tokenizer(path, opts.do_lower_case, getattr(opts, "vocab", None), rt)
        model, _ = load_model(BertForQuestionAnswering, path, seed=h.seed)
        _check_seq_len(model.config, lengths["max_seq_length"], path)
        if getattr(opts, "vocab", None):
            model.vocab_file = opts.vocab  # saved with the fine-tuned checkpoint
        features = convert_examples_to_features(examples, tok, is_training=True, **lengths)
        arr = features_to_arrays(features, is_training=True)
        n_features = len(features)
        del features  # the arrays are all training needs (the real train set makes ~88k windows)
        rt.place(model)
        inputs = [arr[k] for k in ("input_ids", "segment_ids", "input_mask", "start_positions", "end_positions")]
        task = f"squad-v{'2.0' if v2 else '1.1'}"
        summary = train_loop(SquadLoss(model), model, inputs, len(examples), h, rt,
                             opts.log_every or COMMON_DEFAULTS["log_every"], f"finetune {task}")
        args = _base_args(task, h, rt, path, name, None if tmp is None else
                          os.path.abspath(opts.model), opts.train, tok.do_lower_case)
        args["hparams"].update(lengths, steps=h.steps, warmup_steps=h.warmup_steps)
        args.update(train_examples=len(examples), train_features=n_features, **summary)
        save_finetuned(model, opts.output, args, opts.overwrite, rt)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    note(rt, f"wrote {opts.output} (loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f}, "
             f"{summary['train_seconds']:.1f} s)")
    for data in getattr(opts, "eval_data", None) or []:
        eval_squad(_eval_opts(opts, data), model=model, rt=rt)
    return args


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


def predict_squad(opts, model=None, rt: Runtime | None = None) -> SquadRun | None:
    """Predictions for a SQuAD file; rank 0 writes them into ``opts.output`` and returns them."""
    from bert_of.modeling import BertForQuestionAnswering
    from bert_of.eval.squad_data import (convert_examples_to_features, features_to_arrays, load_squad,
                                 postprocess_predictions, read_squad_examples, write_prediction_files)

    rt = rt or Runtime.create(getattr(opts, "device", None))
    sd = load_squad(opts.data, check_spans=False)
    v2 = _squad_version(opts, sd)
    tmp = None
    if model is None:
        path, name, tmp = resolve_model(opts.model)
    else:
        path, name = os.path.abspath(opts.output_model), os.path.basename(os.path.abspath(opts.output_model))
    try:
        train_args = read_train_args(path)
        lower = opts.do_lower_case if opts.do_lower_case is not None else train_args.get("do_lower_case", True)
        tok = make_tokenizer(path, lower, getattr(opts, "vocab", None), rt)
        lengths = _squad_lengths(opts, train_args)
        new_head = False
        if model is None:
            model, missing = load_model(BertForQuestionAnswering, path, seed=COMMON_DEFAULTS["seed"])
            new_head = bool(missing)
            if new_head:
                note(rt, f"warning: {name} has no trained SQuAD head: predictions come from a random "
                         "(newly initialised) head")
            rt.place(model)
        _check_seq_len(model.config, lengths["max_seq_length"], path)
        examples = read_squad_examples(sd, is_training=False, version_2_with_negative=v2)
        features = convert_examples_to_features(examples, tok, is_training=False, **lengths)
        arr = features_to_arrays(features)
        pick = {k: getattr(opts, k, None) for k in SQUAD_PREDICT_DEFAULTS}
        s = {k: (SQUAD_PREDICT_DEFAULTS[k] if v is None else v) for k, v in pick.items()}
        mode = getattr(opts, "mode", None) or COMMON_DEFAULTS["mode"]
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
        ident = os.path.abspath(opts.model) if tmp is not None else path
        return SquadRun(sd, preds, paths, settings, path, name, ident, train_args, new_head)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def eval_squad(opts, model=None, rt: Runtime | None = None) -> dict | None:
    """Predict + score (official-equivalent) + record; prints the official script's JSON."""
    from bert_of.eval.squad_metrics import squad_score

    rt = rt or Runtime.create(getattr(opts, "device", None))
    if not getattr(opts, "output", None):
        name = os.path.basename(os.path.abspath(opts.model).rstrip(os.sep)) if os.path.isdir(opts.model) else opts.model
        opts.output = default_eval_dir(name, opts.data, "squad")
    run = predict_squad(opts, model=model, rt=rt)
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
    _record(opts, rt, f"squad-v{score.version}", dict(score.result), data_path=opts.data,
            pred_path=run.paths["predictions"], model_path=run.identity_path, model_name=run.model_name,
            train_args=run.train_args, settings=dict(run.settings, output_dir=os.path.abspath(opts.output)),
            tool="bert-of eval squad", new_head=run.new_head)
    return dict(score.result)
