"""``bert-of finetune TASK``, ``bert-of predict TASK`` and ``bert-of eval TASK`` for every task of
:mod:`bert_of.finetuning.task` (squad, glue, classify, tag).

    bert-of finetune squad --model NAME_OR_DIR --train train-v1.1.json -o DIR [--eval-data dev-v1.1.json]
    bert-of predict squad  --model DIR --data dev-v1.1.json -o DIR
    bert-of finetune glue  --task mrpc --model NAME_OR_DIR --train train.tsv -o DIR [--eval-data dev.tsv]
    bert-of predict glue   --model DIR [--task mrpc] --data test.tsv -o DIR

Each command's parser is generated from its task's options dataclass and help (the task's
module; google-research/bert's run_squad.py / run_classifier.py defaults); the parsed options go
to the task's method. ``--nproc N`` runs N ranks on this
machine (global tensors; ``--batch-size`` is the global batch).

Importing this module is cheap (no OneFlow): a task's methods load the model when they run.
"""

from __future__ import annotations

import dataclasses
import os
import types

from bert_of.cli_grammar import add_command, examples
from bert_of.errors import ConfigError, OutputError
from bert_of.files.locks import check_unlocked, LOCK_NAME
from bert_of.files.reading import is_stream
from bert_of.finetuning.options import EVAL, PREDICT, TRAIN, check_engine
from bert_of.finetuning.task import TASKS
from bert_of.launch import in_rank, maybe_relaunch, topology
from bert_of.options import from_args, resume_from_record

FINETUNE_NOTE = ("Defaults are google-research/bert's (AdamW without bias correction unless "
                 "--adam-bias-correction, weight decay not on "
                 "LayerNorm/bias, linear warmup then linear decay to 0, global-norm clipping); steps = "
                 "int(examples / batch * epochs). --nproc N: N ranks on this machine; --nnodes M --node-rank R "
                 "--master-addr A --master-port P: across machines (--batch-size is the global batch).")
OPTIONS = {name: task.options for name, task in TASKS.items()}
POSITIVE = {TRAIN: ("batch_size", "steps", "grad_accum_steps", "log_every", "max_seq_length", "predict_batch_size"),
            PREDICT: ("max_seq_length", "predict_batch_size", "n_best_size", "max_answer_length"),
            EVAL: ("max_seq_length", "predict_batch_size", "n_best_size", "max_answer_length")}


def _positive(opts, *names):
    for n in names:
        v = getattr(opts, n, None)
        if v is not None and v < 1:
            raise ConfigError(f"--{n.replace('_', '-')} must be at least 1, got {v}")


def _ranks(args, opts):
    """--nproc N (--nnodes ...): this command line again as ranks; None when this process is to do
    the work. What can be refused without OneFlow is refused here first, once, before ranks start
    (one process refuses as it always did)."""
    _positive(opts.ranks, "nproc")
    topo = topology(opts.ranks)
    if topo.world > 1 and not in_rank():
        if getattr(opts, "train", None) and opts.output:  # a run's one writer: say so once, before any rank starts
            check_unlocked(os.path.join(opts.output, LOCK_NAME), os.path.abspath(opts.output))
        for name in ("train", "data", "eval_data"):
            value = getattr(opts, name, None)
            for path in value if isinstance(value, list) else [value] if value else []:  # --eval-data repeats
                if path == "-" or is_stream(path):  # each rank reads its data: a pipe gives its rows once
                    raise ConfigError(f"--{name.replace('_', '-')} {path}: standard input or a pipe is read once, "
                                      f"by one process; {topo.world} ranks each read the data: give a file")
                if not os.path.exists(path):
                    raise ConfigError(f"--{name.replace('_', '-')} {path}: no such file")
        if opts.vocab and not os.path.isfile(opts.vocab):
            raise ConfigError(f"--vocab {opts.vocab}: no such file")
    return maybe_relaunch(types.SimpleNamespace(argv=args.argv, **vars(opts.ranks)))


def predict_output(task: str, opts):
    """``predict -o``, one meaning for every task: a folder the prediction files go into (as ``eval``
    writes them, and ``predict squad|glue`` always did); classify and tag also take the file itself,
    a name with an extension (their older spelling). Prediction files that exist are replaced only
    with --overwrite. Returns the options with classify's and tag's ``output`` the file to write."""
    out = opts.output
    kinds = TASKS[task].file_kinds
    predictions_file = TASKS[task].predictions_file
    if kinds is not None and os.path.splitext(os.path.basename(out.rstrip(os.sep)))[1] and not os.path.isdir(out):
        if kinds and not out.lower().endswith(kinds):
            raise ConfigError(f"-o {out}: a predictions file ends {' or '.join(kinds)}")
        target = out
    else:
        if os.path.exists(out) and not os.path.isdir(out):
            raise OutputError(f"-o {out}: not a folder (predict {task} writes {predictions_file} into a "
                              "folder)")
        target = os.path.join(out, predictions_file)
        if kinds is not None:  # classify and tag write the file they are given
            opts = dataclasses.replace(opts, output=target)
    if os.path.lexists(target) and not opts.overwrite:
        raise OutputError(f"{target}: exists (pass --overwrite to replace it)")
    return opts


def cmd_task(args) -> int:
    """``bert-of finetune|predict|eval TASK``: the task's options from the command line, then the
    task's method for the command (:meth:`bert_of.finetuning.task.Task.run`)."""
    command, task = args.task_command
    opts = from_args(OPTIONS[task], args, command)
    if command == TRAIN and opts.resume and opts.output:  # the run's record gives what is not given again
        opts = resume_from_record(OPTIONS[task], opts.output, args, command, what=f"bert-of finetune {task}",
                                  output=opts.output, resume=True)
    if command == TRAIN:
        missing = [flag for flag, v in (("--model", opts.model), ("--train", opts.train), ("-o", opts.output)) if not v]
        if missing:
            raise ConfigError(f"finetune {task}: {', '.join(missing)} required (a --resume takes all but -o from "
                              "the run's record)")
    _positive(opts, *POSITIVE[command])
    check_engine(opts)
    if command == PREDICT:
        opts = predict_output(task, opts)
    code = _ranks(args, opts)
    if code is not None:
        return code
    TASKS[task].run(command, opts)
    return 0


def _task_parsers(sub, command: str) -> None:
    """``bert-of COMMAND TASK`` for every task, from its options and its help (bert_of/finetuning/task.py)."""
    for name, task in TASKS.items():
        h = task.helps[command]
        description = f"{h.description} {FINETUNE_NOTE}" if command == TRAIN else h.description
        add_command(sub, name, cmd_task, task.options, command=command, task_command=(command, name),
                    help=h.help, description=description, example_lines=h.examples)


# --------------------------------------------------------------------------- parsers


def add_eval_commands(esub) -> None:
    """``eval TASK`` for every task on the ``eval`` command's subparsers."""
    _task_parsers(esub, EVAL)


def add_parser(subparsers):
    """Add the top-level ``finetune`` and ``predict`` commands to ``bert-of``."""
    f = subparsers.add_parser("finetune", help="fine-tune a checkpoint on SQuAD or GLUE / XNLI",
                              description="Fine-tune a BERT checkpoint in a run folder (-o, as pretrain's): "
                                          "run.json, metrics.jsonl, checkpoints/ (--save-every) and final/ (the "
                                          "bert_of checkpoint + train_args.json; `--model RUN` uses it). "
                                          + FINETUNE_NOTE,
                              epilog=examples("bert-of finetune squad --model bert-base-uncased --train "
                                              "train-v1.1.json -o squad-model/ --eval-data dev-v1.1.json",
                                              "bert-of finetune glue --task mrpc --model bert-base-uncased --train "
                                              "MRPC/train.tsv -o mrpc-model/"))
    fsub = f.add_subparsers(dest="finetune_command", required=True, metavar="TASK")
    _task_parsers(fsub, TRAIN)

    p = subparsers.add_parser("predict", help="predictions files for SQuAD or GLUE / XNLI",
                              description="Run a fine-tuned checkpoint over a data file and write predictions "
                                          "into the --output folder.",
                              epilog=examples("bert-of predict squad --model squad-model/ --data dev-v1.1.json "
                                              "-o preds/",
                                              "bert-of predict glue --model mrpc-model/ --data MRPC/test.tsv -o preds/"))
    psub = p.add_subparsers(dest="predict_command", required=True, metavar="TASK")
    _task_parsers(psub, PREDICT)
    return fsub, psub
