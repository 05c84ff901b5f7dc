"""What every task (SQuAD, GLUE, classify, tag) shares: models and tokenizers,
training on the shared :class:`~bert_of.training.Trainer`, prediction batches, publishing the
fine-tuned checkpoint, and records in the results store.

This is the tasks' one door to the model layer (it loads OneFlow): a task's methods import what
they run with from here when they run (:mod:`bert_of.finetuning.task`), so building the command
line needs no OneFlow. The head classes, ``infer``, ``note`` and ``Runtime`` are named here for
that reason."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import sys
from dataclasses import replace


from bert_of._flow import flow
from bert_of.checkpoint import CONFIG_NAME, RUN_FINAL, WEIGHTS_NAME, run_final, SafetensorsFile, write_checkpoint_files
from bert_of.vocab import check_vocab_fits, lower_case_for, vocab_looks_cased
from bert_of.converters.convert import detect
from bert_of.errors import BertOfError, CheckpointError, ConfigError, OutputError
from bert_of.eval.errors import EvalDataError
from bert_of.eval.results import append_result, checkpoint_identity, file_identity, hardware_info, make_record
from bert_of.files.atomic import read_jsonl, write_json
from bert_of.files.home import bert_of_home, utc_now
from bert_of.files.owned import check_destination, check_sources
from bert_of.files.publish import publishing
from bert_of.files.reading import STDIN, is_stream, read_json
from bert_of.finetuning.options import GLUE_MAX_SEQ_LENGTH, ONNXRUNTIME, TaskOptions, check_engine
from bert_of.finetuning.task import ModelRun
from bert_of.heads import (BertForQuestionAnswering, BertForSequenceClassification,  # noqa: F401 - the tasks'
                           BertForTokenClassification)  # heads, imported from here when a task runs
from bert_of.files.owned import register_own_files
from bert_of.config import BertConfig
from bert_of.inputs import check_inputs
from bert_of.options import RUN_RECORD, TrainConfig
from bert_of.options import record as options_record
from bert_of.zoo import resolve_for
from bert_of.tokenization import FullTokenizer
from bert_of.training.inference import graph_accum_steps, infer  # noqa: F401 - infer: the tasks'
from bert_of.training.onnxruntime_engine import OnnxModel
from bert_of.training.loop import ShuffledRows, StopAfter, fit, note
from bert_of.training.padding import cut, padded_width, row_lengths
from bert_of.training.runtime import Runtime
from bert_of.training.state import RunDir, check_finite
from bert_of.training.trainer import Trainer
from bert_of.version import __version__

TRAIN_ARGS = "train_args.json"
EVAL_DIR = "eval"  # a run folder's --eval-data results: eval/DATA-STEM/ (predictions + SCORES_FILE)
SCORES_FILE = "scores.json"
register_own_files((TRAIN_ARGS, RUN_RECORD))  # a fine-tuning's run folder: --overwrite may replace it


def check_train(opts: TaskOptions, epochs: float) -> None:
    """The fine-tuning values the trainer's own check (:meth:`TrainConfig.check`) does not cover."""
    if opts.batch_size < 1 or epochs <= 0 or not 0 <= opts.warmup_proportion < 1:
        raise ConfigError("need --batch-size >= 1, --epochs > 0, 0 <= --warmup-proportion < 1")


# --------------------------------------------------------------------------- models and tokenizers


_SHOWN: dict = {}  # bert_of folder -> the name or path the user gave (a converted copy lives in the cache)


def shown(path: str) -> str:
    """``path`` as the user knows it: under a converted copy's cache folder, the model they named."""
    for folder, given in _SHOWN.items():
        if path == folder or path.startswith(folder + os.sep):
            return given + path[len(folder):] if path != folder else given
    return path


@contextlib.contextmanager
def model_folder(opts: TaskOptions, trained: str | None = None):
    """(bert_of folder, display name, identity path) of the model to run: ``trained`` (a folder just
    written), else ``opts.model`` resolved by the zoo's resolver (another format is converted once
    into the cache; the identity path names the original files)."""
    if trained is not None:
        path = os.path.abspath(trained)
        run = os.path.dirname(path) if os.path.basename(path) == RUN_FINAL else path  # named as its run folder
        yield path, os.path.basename(run), path
        return
    r = resolve_for("--model", opts.model)
    if r.path != os.path.abspath(opts.model):
        _SHOWN[r.path] = f"{opts.model} (converted copy)" if r.conversion else opts.model
    yield r.path, r.name, r.source_path


def checkpoint_head_labels(path: str):
    """Number of classes of a checkpoint's classifier head (from the safetensors header), or None."""
    with SafetensorsFile(os.path.join(path, WEIGHTS_NAME)) as f:
        if "classifier.weight" in f.entries:
            return int(f.shape("classifier.weight")[0])
    return None


def load_model(cls, path: str, seed: int = 0, **overrides):
    """``cls.from_pretrained(path)`` with Google's init for newly created heads.

    A new ``num_labels`` drops the checkpoint's class names and problem type (``id2label``,
    ``problem_type``: another task's) unless given too. Returns (model, newly initialised tensor names)."""
    if "num_labels" in overrides:
        overrides.setdefault("id2label", None)
        overrides.setdefault("problem_type", None)
    model = cls.from_pretrained(path, **overrides)
    missing = list(model.loading_info["missing"])
    if missing:
        model.init_weights(seed, names=missing)
    return model, missing


# the output a task's head gives, by the head class the task runs
HEAD_OUTPUTS = {BertForSequenceClassification: ("logits", "sequence classifier"),
                BertForTokenClassification: ("logits", "token classifier"),
                BertForQuestionAnswering: ("start_logits", "SQuAD (qa_outputs)")}


def load_predictor(cls, path: str, name: str, opts: TaskOptions, rt: Runtime, **overrides):
    """The model ``predict``/``eval`` run, as ``opts.engine`` says: OneFlow's ``cls`` (``load_model``,
    placed on the runtime), or onnxruntime's session over the checkpoint's ONNX graph
    (:class:`~bert_of.training.onnxruntime_engine.OnnxModel`), which :func:`infer` runs the same way.
    Returns (model, newly initialised tensor names). onnxruntime runs the checkpoint's own head
    only: a checkpoint without it (which OneFlow would initialise at random) is refused."""
    if opts.engine != ONNXRUNTIME:
        model, missing = load_model(cls, path, **overrides)
        rt.place(model)
        return model, missing
    check_engine(opts)  # the command line checked it before any work; the Python API here
    model = OnnxModel(path)
    output, head = HEAD_OUTPUTS[cls]
    kind = "token" if cls is BertForTokenClassification else "sequence"
    if output not in model.outputs or (output == "logits" and model.config.classifier_kind != kind):
        raise CheckpointError(f"{name}: no trained {head} head; --engine onnxruntime runs the checkpoint's own head "
                              "(--engine oneflow would initialise one at random)")
    for line in model.notes:
        note(rt, line)
    note(rt, f"predict: engine onnxruntime {model.version} (CPU, {model.threads} threads; the ONNX graph of "
             f"{name} built in memory in {model.build_seconds:.1f} s)")
    return model, []


def predict_mode(opts: TaskOptions, rt: Runtime) -> str:
    """How prediction runs, as recorded in the settings: OneFlow's mode (``--mode auto`` made
    concrete), or ``onnxruntime``."""
    return ONNXRUNTIME if opts.engine == ONNXRUNTIME else rt.mode(opts.mode, "predict")


def read_train_args(path: str) -> dict:
    """A model's train_args.json ({} when it has none); ``path`` may be a run folder (its final/)."""
    p = os.path.join(run_final(path), TRAIN_ARGS)
    if not os.path.isfile(p):
        return {}
    return read_json(p, "train_args.json", error=CheckpointError)


def make_tokenizer(path: str, do_lower_case: bool | None, vocab_file: str | None = None, rt: Runtime | None = None,
                   source: str | None = None):
    """The tokenizer of the checkpoint folder ``path``: its vocab.txt, or ``vocab_file`` (--vocab),
    which must then define as many ids as the model's vocab_size."""
    if vocab_file:
        if not os.path.isfile(vocab_file):
            raise ConfigError(f"--vocab {vocab_file}: no such file")
        check_vocab_fits(vocab_file, BertConfig.from_json_file(os.path.join(path, CONFIG_NAME)).vocab_size)
    vocab_file = vocab_file or os.path.join(path, "vocab.txt")
    if not os.path.isfile(vocab_file):
        raise CheckpointError(f"{shown(path)}: no vocab.txt in the checkpoint (pass --vocab FILE)")
    # the rule BertTokenizer.from_pretrained follows: a flag, else what the checkpoint records
    # (tokenizer_config.json, train_args.json, config.json), else its vocabulary's case
    sources = (source,) if source and source != path else ()  # a converted copy: the files it came from
    lower, origin = lower_case_for(path, vocab_file, do_lower_case, CheckpointError, sources)
    recorded, recorded_from = lower_case_for(path, None, None, CheckpointError, sources)
    if origin == "given" and recorded_from == "checkpoint" and recorded != lower:
        note(rt, f"note: {'--do-lower-case' if lower else '--no-lower-case'} overrides the checkpoint's "
                 f"do_lower_case {str(recorded).lower()} ({shown(path)})")
    tok = FullTokenizer(vocab_file, do_lower_case=lower)
    tok.lower_case_from = origin  # recorded in train_args.json
    cased = vocab_looks_cased(tok.vocab)
    if cased and lower:
        note(rt, f"warning: {shown(vocab_file)} looks like a CASED vocabulary but the text is lower-cased "
                 "(pass --no-lower-case for cased models)")
    elif not cased and not lower:
        note(rt, f"warning: {shown(vocab_file)} looks like an uncased vocabulary but --no-lower-case keeps capitals "
                 "(most words will become [UNK])")
    return tok


def check_seq_len(model_config, max_seq_length: int, path: str, rt: Runtime | None = None,
                  given: bool = True) -> int:
    """The sequence length to run: ``max_seq_length``; a default (not ``given``) longer than the
    model's max_position_embeddings is capped to it with a note (as transformers' examples cap theirs
    to model_max_length), a --max-seq-length given is refused."""
    if max_seq_length < 8:
        raise ConfigError(f"--max-seq-length {max_seq_length}: too short")
    limit = model_config.max_position_embeddings
    if max_seq_length > limit and given:
        raise ConfigError(f"--max-seq-length {max_seq_length} exceeds the model's max_position_embeddings "
                          f"{limit} ({shown(path)})")
    if max_seq_length > limit:
        note(rt, f"note: max_seq_length {max_seq_length} capped to {limit}, the model's max_position_embeddings "
                 f"({shown(path)})")
        return limit
    return max_seq_length


def glue_seq_len(opts: TaskOptions, train_args: dict) -> int:
    v = opts.max_seq_length
    glue_trained = train_args.get("task") and not str(train_args["task"]).startswith("squad")
    saved = (train_args.get("hparams") or {}).get("max_seq_length") if glue_trained else None
    return int(v if v is not None else (saved or GLUE_MAX_SEQ_LENGTH))


def check_head(path: str, num_labels: int, task: str, name: str) -> None:
    have = checkpoint_head_labels(path)
    if have is not None and have != num_labels:
        raise CheckpointError(f"{name}: its classifier head has {have} output(s) but {task} needs {num_labels} "
                              "(a checkpoint fine-tuned for another task?)")


# --------------------------------------------------------------------------- training and prediction


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


# --------------------------------------------------------------------------- saving and records


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


def identity(path: str, name: str) -> dict:
    ident = checkpoint_identity(path, name=name)
    if ident.get("format") == "bert_of":  # an HF folder also holds a model.safetensors
        try:
            fmt = detect(path)
        except BertOfError:
            fmt = "of"
        if fmt != "of":
            ident["format"] = fmt
    return ident


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


def percent(scores: dict, rt: Runtime, keep=()) -> dict:
    """Scores (fractions) as percent, as the results store keeps them (``keep``: names left as they
    are, e.g. an MSE); an undefined score (NaN) is null, with a note."""
    out = {}
    for k, v in scores.items():
        if math.isnan(v):
            note(rt, f"note: {k} is undefined for these predictions (constant values); reported as null")
            out[k] = None
        else:
            out[k] = v if k in keep else 100.0 * v
    return out


def _command_line() -> str | None:
    """The bert-of command line, when this process is one (not an embedding program or test)."""
    prog = sys.argv[0] if sys.argv else ""
    if os.path.basename(prog) == "bert-of" or prog.endswith(os.path.join("bert_of", "cli.py")):
        return " ".join(["bert-of", *map(shlex.quote, sys.argv[1:])])
    return None


def default_eval_dir(model_name: str, data_path: str, task: str) -> str:
    stem = os.path.splitext(os.path.basename(data_path))[0]
    stamp = utc_now().replace("-", "").replace(":", "").rstrip("Z").replace("T", "-")
    return os.path.join(bert_of_home(), "eval", f"{model_name}", f"{task}-{stem}-{stamp}")


def model_display_name(model: str) -> str:
    return os.path.basename(os.path.abspath(model).rstrip(os.sep)) if os.path.isdir(model) else model


def record(opts: TaskOptions, rt: Runtime, task: str, metrics: dict, run: ModelRun, *, pred_path: str, tool: str,
           settings: dict | None = None) -> None:
    """Append the scores of ``run`` (predictions of ``opts.data`` in ``pred_path``) to the results store;
    ``settings``: what to record of how it ran (default ``run.settings``)."""
    if opts.no_record or not rt.is_main:
        return
    data_path, train_args, new_head = opts.data, run.train_args, run.new_head
    settings = run.settings if settings is None else settings
    hp = dict((train_args.get("hparams") or {}))
    hp.update({k: v for k, v in settings.items() if k not in hp})
    for item in opts.hparam or []:
        if "=" not in item:
            raise ConfigError(f"--hparam {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            hp[k.strip()] = json.loads(v)
        except ValueError:
            hp[k.strip()] = v
    extra = {"settings": settings, "head_trained": not new_head}
    base = train_args.get("base_checkpoint")
    if base:
        extra["base_checkpoint"] = base
        extra["note"] = f"fine-tuned from {base.get('name')}"
    if new_head:
        extra["note"] = "task head not trained (newly initialised)"
    ident = identity(run.identity_path, opts.name or run.model_name)
    rec = make_record(task, metrics, split=os.path.basename(data_path), checkpoint=ident, hparams=hp,
                      data=file_identity(data_path), predictions=file_identity(pred_path), tool=tool, **extra)
    note(rt, f"recorded in {append_result(rec, opts.results)}")
