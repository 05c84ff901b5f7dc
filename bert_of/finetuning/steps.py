"""The steps a task's ``predict`` and ``eval`` share with its fine-tuning: the runtime and the model to
run (resolved, converted once, loaded for the engine asked), its tokenizer, sequence lengths and
head checks, and the records of scores in the results store.

This module imports no OneFlow: with ``--engine onnxruntime`` a prediction runs without it (one CPU
process, :func:`predict_runtime`; the checkpoint's ONNX graph on onnxruntime, :func:`load_predictor`).
OneFlow's engine loads it when it loads the model. Training itself (the trainer, run folders,
publishing the fine-tuned checkpoint) is :mod:`bert_of.finetuning.driver`'s."""

from __future__ import annotations

import contextlib
import json
import math
import os

from bert_of.checkpoint import CONFIG_NAME, RUN_FINAL, WEIGHTS_NAME, run_final, SafetensorsFile
from bert_of.config import BertConfig
from bert_of.converters.convert import detect
from bert_of.errors import BertOfError, CheckpointError, ConfigError
from bert_of.eval.results import append_result, checkpoint_identity, file_identity, make_record
from bert_of.files.home import bert_of_home, utc_now
from bert_of.files.owned import register_own_files
from bert_of.files.reading import read_json
from bert_of.finetuning.options import GLUE_MAX_SEQ_LENGTH, ONNXRUNTIME, TaskOptions, check_engine
from bert_of.finetuning.task import ModelRun
from bert_of.options import RUN_RECORD
from bert_of.progress import note
from bert_of.tokenization import FullTokenizer
from bert_of.training.onnxruntime_engine import OnnxModel
from bert_of.training.runtime import Runtime
from bert_of.vocab import check_vocab_fits, lower_case_for, vocab_looks_cased
from bert_of.zoo import resolve_for

TRAIN_ARGS = "train_args.json"
register_own_files((TRAIN_ARGS, RUN_RECORD))  # a fine-tuning's run folder: --overwrite may replace it


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


# the heads the tasks predict with, by their class name in bert_of.heads (OneFlow's engine imports
# it; onnxruntime's runs the checkpoint's own graph): (the output the task reads, the head as
# messages name it)
HEAD_OUTPUTS = {"BertForSequenceClassification": ("logits", "sequence classifier"),
                "BertForTokenClassification": ("logits", "token classifier"),
                "BertForQuestionAnswering": ("start_logits", "SQuAD (qa_outputs)")}


def predict_runtime(opts: TaskOptions) -> Runtime:
    """The runtime a ``predict``/``eval`` runs on: OneFlow's (:meth:`Runtime.create`: ``--device``,
    the ranks launched), or for ``--engine onnxruntime`` one CPU process, rank 0 of 1, made without
    OneFlow (:func:`~bert_of.finetuning.options.check_engine` refuses a GPU and ranks for it)."""
    return Runtime() if opts.engine == ONNXRUNTIME else Runtime.create(opts.device)


def load_predictor(head: str, path: str, name: str, opts: TaskOptions, rt: Runtime, **overrides):
    """The model ``predict``/``eval`` run, as ``opts.engine`` says: OneFlow's ``head`` (a class of
    :mod:`bert_of.heads`, by name; ``load_model``, placed on the runtime), or onnxruntime's session
    over the checkpoint's ONNX graph (:class:`~bert_of.training.onnxruntime_engine.OnnxModel`),
    which :func:`~bert_of.training.inference.infer` runs the same way. Returns (model, newly
    initialised tensor names). onnxruntime runs the checkpoint's own head only: a checkpoint without
    it (which OneFlow would initialise at random) is refused."""
    if opts.engine != ONNXRUNTIME:
        import bert_of.heads as heads  # the model layer: OneFlow, for its engine only

        model, missing = load_model(getattr(heads, head), path, **overrides)
        rt.place(model)
        return model, missing
    check_engine(opts)  # the command line checked it before any work; the Python API here
    model = OnnxModel(path)
    output, what = HEAD_OUTPUTS[head]
    kind = "token" if head == "BertForTokenClassification" else "sequence"
    if output not in model.outputs or (output == "logits" and model.config.classifier_kind != kind):
        raise CheckpointError(f"{name}: no trained {what} head; --engine onnxruntime runs the checkpoint's own head "
                              "(--engine oneflow would initialise one at random)")
    for line in model.notes:
        note(rt, line)
    graph = "in onnxruntime's fused ops" if model.fused else "as of2onnx writes it"
    note(rt, f"predict: engine onnxruntime {model.version} (CPU, {model.threads} threads; the ONNX graph of "
             f"{name} {graph}, built in memory in {model.build_seconds:.1f} s)")
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


# --------------------------------------------------------------------------- records


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


def default_eval_dir(model_name: str, data_path: str, task: str) -> str:
    stem = os.path.splitext(os.path.basename(data_path))[0]
    stamp = utc_now().replace("-", "").replace(":", "").rstrip("Z").replace("T", "-")
    return os.path.join(bert_of_home(), "eval", f"{model_name}", f"{task}-{stem}-{stamp}")


def model_display_name(model: str) -> str:
    return os.path.basename(os.path.abspath(model).rstrip(os.sep)) if os.path.isdir(model) else model


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

