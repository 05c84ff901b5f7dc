"""Fine-tuning, the part every task (SQuAD, GLUE, classify, tag) shares: training on the shared
:class:`~bert_of.training.Trainer`, publishing the fine-tuned checkpoint, evaluating it after.

This module loads OneFlow (the trainer): a task's ``finetune`` imports it when it runs
(:mod:`bert_of.finetuning.task`), so building the command line needs no OneFlow. What prediction
and evaluation share with fine-tuning (models, tokenizers, records) is
:mod:`bert_of.finetuning.steps`'s."""

from __future__ import annotations

import math
import os
import shlex
import sys
from dataclasses import replace


from bert_of._flow import flow
from bert_of.checkpoint import RUN_FINAL, write_checkpoint_files
from bert_of.errors import ConfigError, OutputError
from bert_of.eval.errors import EvalDataError
from bert_of.eval.results import file_identity, hardware_info
from bert_of.files.atomic import read_jsonl, write_json
from bert_of.files.home import utc_now
from bert_of.files.owned import check_destination, check_sources
from bert_of.files.publish import publishing
from bert_of.files.reading import STDIN, is_stream
from bert_of.finetuning.options import TaskOptions
from bert_of.finetuning.steps import TRAIN_ARGS, identity
from bert_of.inputs import check_inputs
from bert_of.options import RUN_RECORD, TrainConfig
from bert_of.options import record as options_record
from bert_of.progress import note
from bert_of.training.oneflow_engine import graph_accum_steps
from bert_of.training.loop import ShuffledRows, StopAfter, fit
from bert_of.training.padding import cut, padded_width, row_lengths
from bert_of.training.runtime import Runtime
from bert_of.training.state import RunDir, check_finite
from bert_of.training.trainer import Trainer
from bert_of.version import __version__

EVAL_DIR = "eval"  # a run folder's --eval-data results: eval/DATA-STEM/ (predictions + SCORES_FILE)
SCORES_FILE = "scores.json"


def check_train(opts: TaskOptions, epochs: float) -> None:
    """The fine-tuning values the trainer's own check (:meth:`TrainConfig.check`) does not cover."""
    if opts.batch_size < 1 or epochs <= 0 or not 0 <= opts.warmup_proportion < 1:
        raise ConfigError("need --batch-size >= 1, --epochs > 0, 0 <= --warmup-proportion < 1")


# --------------------------------------------------------------------------- training


def train(model, arrays: dict, n_examples: int, opts: TaskOptions, epochs: float, rt: Runtime, what: str,
          unit: str = "examples", pad_to_batch: bool = True):
    """Google's schedule over the feature ``arrays`` (named like the model's forward arguments,
    labels included) on the shared trainer: ``opts.steps``, else ``epochs`` over ``n_examples``;
    ``unit`` names what a row is in the progress line ("windows": SQuAD's features). Returns (the
    trainer's config as run, summary for train_args.json, finished).

    ``pad_to_batch`` (unless ``--pad-to-max-length``): the arrays cut to the longest row of all, and
    in eager mode each batch to its own longest (bert_of.training.padding; a graph keeps one
    shape). False for a loss over every position (run_squad's spans: padding logits are in its
    softmax)."""
    n = len(next(iter(arrays.values())))
    if n == 0:
        raise EvalDataError(f"{what}: no training features")
    check_train(opts, epochs)
    check_inputs(model.config, arrays["input_ids"], arrays.get("token_type_ids"))
    steps = int(opts.steps) if opts.steps else int(n_examples / opts.batch_size * epochs)
    if steps < 1:
        raise ConfigError(f"{what}: {n_examples} examples / batch {opts.batch_size} * {epochs:g} epochs is less "
                          "than one step (lower --batch-size or set --steps)")
    cfg = TrainConfig.of(opts, steps=steps, warmup_steps=int(steps * opts.warmup_proportion)).check()
    cfg = replace(cfg, mode=rt.mode(cfg.mode, "finetune"))
    if opts.batch_size % rt.world or (opts.batch_size // rt.world) % cfg.grad_accum_steps:
        raise ConfigError(f"--batch-size {opts.batch_size} must split evenly over {rt.world} rank(s) and "
                          f"{cfg.grad_accum_steps} accumulation step(s)")
    rt.barrier()
    run = RunDir(opts.output, rt, outputs=(RUN_FINAL, EVAL_DIR), what=what, sources=train_sources(opts),
                 record=(RUN_RECORD, options_record(opts)))
    with run.open(opts.resume, opts.overwrite):
        flow.manual_seed(cfg.seed)
        if run.resume_from and opts.mode == "auto":  # auto was made concrete once, when the run began
            cfg = replace(cfg, mode=run.state["train_config"]["mode"])
        pad = pad_to_batch and not opts.pad_to_max_length
        if pad:  # no row needs more than the longest: one width for a graph, each batch's own in eager
            full = int(arrays["input_ids"].shape[1])
            arrays = cut(arrays, padded_width(row_lengths(arrays["attention_mask"]), full), full)
        if cfg.mode == "graph":  # CPU graph memory grows with the micro-batch (graph_rows): bound it
            rows = opts.batch_size // rt.world
            accum = graph_accum_steps(model.config, int(arrays["input_ids"].shape[1]), rows, rt.device,
                                      cfg.grad_accum_steps)
            if accum != cfg.grad_accum_steps:
                note(rt, f"{what}: graph steps of {accum} micro-batches x {rows // accum} rows (CPU graph memory "
                         "grows with the micro-batch; the step is the same to float rounding)")
                cfg = replace(cfg, grad_accum_steps=accum)
        trainer = Trainer(model, cfg, rt)
        data = ShuffledRows(arrays, opts.batch_size, cfg.seed, rt, pad_to_batch=pad and cfg.mode == "eager")
        # what an exact resume must find unchanged besides the train config
        run.start(trainer, data, {"batch_size": opts.batch_size, "examples": n_examples, "features": n,
                                  "config": {k: v for k, v in model.config.to_dict().items() if k != "provenance"}})
        if run.resume_from:
            note(rt, f"{what}: resuming {run.resume_from} at step {trainer.global_step}")
        note(rt, f"{what}: {n_examples} examples, {n} {unit if unit != 'examples' else 'features'}; {steps} steps "
                 f"(warmup {cfg.warmup_steps}) of batch {opts.batch_size} over {rt.world} rank(s) on {rt.device}, "
                 f"lr {cfg.lr:g}, {cfg.mode} mode")
        res = fit(trainer, data, steps, batch_size=opts.batch_size, run=run, log_every=opts.log_every,
                  save_every=opts.save_every, keep=opts.keep, vocab_file=getattr(model, "vocab_file", None), progress="lines",
                  what=what, callbacks=[StopAfter(opts.stop_after)] if opts.stop_after else [], unit=unit)
    model.eval()
    losses = [v for v in res.losses if math.isfinite(v)]  # AMP may have skipped a step
    first = losses[0] if losses else None
    if run.resume_from:  # the run's first step was logged by the first invocation
        logged = [r for r in read_jsonl(run.metrics, "metrics") if r.get("step") == 1]
        first = logged[0]["loss"] if logged else first
    return cfg, {"first_loss": first, "final_loss": losses[-1] if losses else None,
                 "train_seconds": round(res.seconds, 3)}, not res.stopped


# --------------------------------------------------------------------------- saving and evaluating


def save_finetuned(model, output: str, train_args: dict, overwrite: bool, rt: Runtime, sources=()) -> None:
    """The fine-tuned checkpoint + train_args.json, published in one rename (rank 0 writes); never
    over, into or around ``sources`` (the base model, the training data)."""
    state = model.canonical_state()  # every rank: gathers global tensors
    check_finite(state, output)  # every rank holds the same values: all stop, nothing is published
    try:
        if rt.is_main:
            meta = {"finetuned_task": train_args.get("task", ""),
                    "base_checkpoint": (train_args.get("base_checkpoint") or {}).get("name", "")}
            with publishing(output, overwrite=overwrite, sources=sources) as stage:
                write_checkpoint_files(stage, list(state.items()), model.config,
                                       vocab_file=getattr(model, "vocab_file", None), metadata=meta)
                write_json(os.path.join(stage, TRAIN_ARGS), train_args)
    finally:
        rt.barrier()  # the other ranks may read the folder next (evaluation after training)


def check_output(opts: TaskOptions) -> None:
    """Fail at once, before any work, on a run folder (``--output``) that could not be used: existing
    without ``--overwrite`` or ``--resume``, holding files bert_of did not write, or one of the inputs."""
    if opts.resume:
        check_sources(opts.output, train_sources(opts))  # the run folder itself is checked when it opens
    elif not opts.overwrite and os.path.isfile(os.path.join(opts.output, RUN_RECORD)):
        raise OutputError(f"{opts.output}: already holds a run; use --resume to continue it or --overwrite to "
                          "start again")
    else:
        check_destination(opts.output, opts.overwrite, train_sources(opts))


def train_sources(opts: TaskOptions, model_path: str | None = None) -> tuple:
    """The inputs of a fine-tuning, which its ``--output`` must not be, hold or lie inside."""
    return (model_path or opts.model, opts.train, opts.vocab, *(opts.eval_data or ()))


def base_args(task: str, opts: TaskOptions, cfg: TrainConfig, epochs: float, rt: Runtime, ident_path: str,
              model_name: str, lower) -> dict:
    """train_args.json: what was fine-tuned from what, how, where and when. ``lower``: the
    tokenizer (its do_lower_case and where that came from), or a bool."""
    origin = getattr(lower, "lower_case_from", None)
    lower = getattr(lower, "do_lower_case", lower)
    return {"task": task, "base_checkpoint": identity(ident_path, model_name),
            "train_data": file_identity(opts.train), "do_lower_case": lower,
            **({"do_lower_case_from": origin} if origin else {}),
            "hparams": {"lr": cfg.lr, "batch_size": opts.batch_size, "epochs": epochs, "steps": cfg.steps,
                        "warmup_proportion": opts.warmup_proportion, "warmup_steps": cfg.warmup_steps,
                        "weight_decay": cfg.weight_decay, "clip_grad_norm": cfg.clip_grad_norm or None,
                        "adam_eps": cfg.adam_eps, "bias_correction": cfg.bias_correction, "seed": cfg.seed,
                        "mode": cfg.mode, "amp": cfg.amp, "grad_accum_steps": cfg.grad_accum_steps,
                        "ranks": rt.world, "device": rt.device},
            "date": utc_now(), "hardware": hardware_info(), "bert_of_version": __version__,
            "command": _command_line()}


def check_eval_data(opts: TaskOptions, read) -> None:
    """Every ``--eval-data`` file read, and its labels checked against the training's, before training
    starts (a wrong column found after the training is the training lost): ``read(path)`` raises
    EvalDataError for what the evaluation would refuse."""
    for data in opts.eval_data or ():
        if data not in STDIN and not os.path.exists(data):
            raise EvalDataError(f"--eval-data {data}: no such file")
        if not os.path.isfile(data) and not is_stream(data):  # a pipe is read once, kept (read_input)
            raise EvalDataError(f"--eval-data {data}: not a regular file or a pipe")
        read(data)


def finish_finetuning(model, opts: TaskOptions, rt: Runtime, args: dict, summary: dict, finished: bool,
                      model_path: str, evaluate) -> dict:
    """The end of a fine-tuning: train_args.json and the checkpoint published in ``opts.output``
    (unless stopped early), then ``evaluate(eval options, trained=, model=, rt=)`` on each
    ``--eval-data`` file, with the options of the evaluation of the checkpoint just written."""
    args.update(summary)
    if not finished:
        return args
    final = os.path.join(opts.output, RUN_FINAL)  # as pretrain's: `--model RUN` finds it
    save_finetuned(model, final, args, True, rt, train_sources(opts, model_path))
    note(rt, f"wrote {final} (loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f}, "
             f"{summary['train_seconds']:.1f} s)")
    taken = set()
    for data in opts.eval_data:  # into the run folder, as run_squad.py's --output_dir holds its predictions
        out = eval_output(opts.output, data, taken)
        scores = evaluate(replace(opts, data=data, output=out, model=opts.output, name=None), trained=final,
                          model=model, rt=rt)
        if scores is not None and rt.is_main:
            write_json(os.path.join(out, SCORES_FILE), {"data": data, "scores": scores})
    return args


def eval_output(run: str, data: str, taken: set) -> str:
    """``RUN/eval/STEM/``: where a fine-tuning's evaluation of ``data`` goes (its predictions file and
    scores.json); ``STEM-2``... for a second file of the same stem (``taken``: the stems used)."""
    stem = "stdin" if data in ("-", "/dev/stdin") else os.path.splitext(os.path.basename(data))[0] or "data"
    name, k = stem, 1
    while name in taken:
        k += 1
        name = f"{stem}-{k}"
    taken.add(name)
    return os.path.join(run, EVAL_DIR, name)


def _command_line() -> str | None:
    """The bert-of command line, when this process is one (not an embedding program or test)."""
    prog = sys.argv[0] if sys.argv else ""
    if os.path.basename(prog) == "bert-of" or prog.endswith(os.path.join("bert_of", "cli.py")):
        return " ".join(["bert-of", *map(shlex.quote, sys.argv[1:])])
    return None


