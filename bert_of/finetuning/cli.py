"""``bert-of finetune squad|glue`` and ``bert-of predict squad|glue`` (and the options that
``bert-of eval squad|glue`` share with them).

    bert-of finetune squad --model NAME_OR_DIR --train train-v1.1.json -o DIR [--eval-data dev-v1.1.json]
    bert-of predict squad  --model DIR --data dev-v1.1.json -o DIR
    bert-of finetune glue  --task mrpc --model NAME_OR_DIR --train train.tsv -o DIR [--eval-data dev.tsv]
    bert-of predict glue   --model DIR [--task mrpc] --data test.tsv -o DIR

Each command's parser is generated from its task's options dataclass
(:mod:`bert_of.finetuning.options`: google-research/bert's run_squad.py / run_classifier.py
defaults); the parsed options go to the task's function. ``--nproc N`` runs N ranks on this
machine (global tensors; ``--batch-size`` is the global batch).

Importing this module is cheap (no OneFlow); the task modules (:mod:`bert_of.finetuning.squad`,
:mod:`bert_of.finetuning.glue`) load when a command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types

from bert_of.cli_grammar import add_command, examples
from bert_of.errors import ConfigError, OutputError
from bert_of.files.locks import check_unlocked, LOCK_NAME
from bert_of.finetuning.options import EVAL, PREDICT, TRAIN, ClassifyOptions, GlueOptions, SquadOptions, TagOptions
from bert_of.launch import in_rank, maybe_relaunch, topology
from bert_of.options import from_args, resume_from_record
from bert_of.progress import log

FINETUNE_NOTE = ("Defaults are google-research/bert's (AdamW without bias correction, weight decay not on "
                 "LayerNorm/bias, linear warmup then linear decay to 0, global-norm clipping); steps = "
                 "int(examples / batch * epochs). --nproc N: N ranks on this machine; --nnodes M --node-rank R "
                 "--master-addr A --master-port P: across machines (--batch-size is the global batch).")
OPTIONS = {"squad": SquadOptions, "glue": GlueOptions, "classify": ClassifyOptions, "tag": TagOptions}
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
                if not os.path.exists(path):
                    raise ConfigError(f"--{name.replace('_', '-')} {path}: no such file")
        if opts.vocab and not os.path.isfile(opts.vocab):
            raise ConfigError(f"--vocab {opts.vocab}: no such file")
    return maybe_relaunch(types.SimpleNamespace(argv=args.argv, **vars(opts.ranks)))


PREDICTION_FILES = {"squad": "predictions.json", "glue": "predictions.tsv", "classify": "predictions.csv",
                    "tag": "predictions.jsonl"}  # what `-o DIR` holds (eval writes the same names)
FILE_KINDS = {"classify": (".csv", ".jsonl"), "tag": ()}  # tag: .jsonl is JSON Lines, any other CoNLL


def predict_output(task: str, opts):
    """``predict -o``, one meaning for every task: a folder the prediction files go into (as ``eval``
    writes them, and ``predict squad|glue`` always did); classify and tag also take the file itself,
    a name with an extension (their older spelling). Prediction files that exist are replaced only
    with --overwrite. Returns the options with classify's and tag's ``output`` the file to write."""
    out = opts.output
    kinds = FILE_KINDS.get(task)
    if kinds is not None and os.path.splitext(os.path.basename(out.rstrip(os.sep)))[1] and not os.path.isdir(out):
        if kinds and not out.lower().endswith(kinds):
            raise ConfigError(f"-o {out}: a predictions file ends {' or '.join(kinds)}")
        target = out
    else:
        if os.path.exists(out) and not os.path.isdir(out):
            raise OutputError(f"-o {out}: not a folder (predict {task} writes {PREDICTION_FILES[task]} into a "
                              "folder)")
        target = os.path.join(out, PREDICTION_FILES[task])
        if kinds is not None:  # classify and tag write the file they are given
            opts = dataclasses.replace(opts, output=target)
    if os.path.lexists(target) and not opts.overwrite:
        raise OutputError(f"{target}: exists (pass --overwrite to replace it)")
    return opts


def cmd_task(args) -> int:
    """``bert-of finetune|predict|eval squad|glue``: the task's options from the command line, then
    the task's function of that name (``finetune_squad``, ``eval_glue``, ...)."""
    command, task = args.task_command
    opts = from_args(OPTIONS[task], args, command)
    if command == TRAIN and opts.run_dir:  # the older spelling of the run folder, which -o is now
        if opts.output and os.path.abspath(opts.output) != os.path.abspath(opts.run_dir):
            raise ConfigError(f"--run-dir {opts.run_dir} and -o {opts.output}: -o is the run folder now (the model "
                              "in its final/, as pretrain's); give one of them")
        log.info("note: --run-dir is deprecated: -o is the run folder")  # (-q: not said)
        opts = dataclasses.replace(opts, output=opts.run_dir, run_dir=None)
    if command == TRAIN and opts.resume and opts.output:  # the run's record gives what is not given again
        opts = resume_from_record(OPTIONS[task], opts.output, args, command, what=f"bert-of finetune {task}",
                                  output=opts.output, resume=True)
    if command == TRAIN:
        missing = [flag for flag, v in (("--model", opts.model), ("--train", opts.train), ("-o", opts.output)) if not v]
        if missing:
            raise ConfigError(f"finetune {task}: {', '.join(missing)} required (a --resume takes all but -o from "
                              "the run's record)")
    _positive(opts, *POSITIVE[command])
    if command == PREDICT:
        opts = predict_output(task, opts)
    code = _ranks(args, opts)
    if code is not None:
        return code
    from bert_of.finetuning import classify, glue, squad, tag

    getattr({"squad": squad, "glue": glue, "classify": classify, "tag": tag}[task], f"{command}_{task}")(opts)
    return 0


def _task_parser(sub, command: str, task: str, **kw):
    return add_command(sub, task, cmd_task, OPTIONS[task], command=command, task_command=(command, task), **kw)


# --------------------------------------------------------------------------- parsers


def add_eval_commands(esub) -> None:
    """``eval squad`` and ``eval glue`` on the ``eval`` command's subparsers."""
    _task_parser(esub, EVAL, "squad", help="predict a SQuAD file with a model, score it (official) and record it",
                 description="Run the model over DATA (run_squad.py features and post-processing), write "
                             "predictions.json / nbest_predictions.json (/ null_odds.json), score them as the "
                             "official evaluate script of the file's version does, print that JSON, and append the "
                             "result to the results store.",
                 example_lines=("bert-of eval squad --model squad-model/ --data dev-v1.1.json",
                                "bert-of eval squad --model squad-model/ --data dev-v2.0.json -o preds/ "
                                "--name my-bert-v2"))
    _task_parser(esub, EVAL, "glue", help="predict a labeled GLUE / XNLI file with a model, score it and record it",
                 description="Classify DATA, write the predictions (GLUE submission format), score them (CoLA "
                             "Matthews; MRPC/QQP F1 + accuracy; STS-B Pearson/Spearman; accuracy) and append the "
                             "result to the results store.",
                 example_lines=("bert-of eval glue --model mrpc-model/ --data MRPC/dev.tsv",
                                "bert-of eval glue --model xnli-model/ --task xnli --language de --data xnli.dev.tsv"))
    _task_parser(esub, EVAL, "classify", help="predict your own labeled CSV / TSV / JSON Lines file, score it and "
                                               "record it",
                 description="Classify DATA with a model from `bert-of finetune classify` (its classes, in its "
                             "order), write OUTPUT/predictions.csv, score it (accuracy, macro-F1, MCC; regression: "
                             "Pearson, Spearman, MSE), print that JSON and append it to the results store.",
                 example_lines=("bert-of eval classify --model sentiment-model/ --data dev.csv"))
    _task_parser(esub, EVAL, "tag", help="tag a labeled CoNLL / JSON Lines file with a model, score it (entities) "
                                          "and record it",
                 description="Tag DATA with a model from `bert-of finetune tag`, write OUTPUT/predictions.jsonl, score "
                             "it (entity-level precision, recall, F1 as conlleval / seqeval; token accuracy), print "
                             "that JSON and append it to the results store.",
                 example_lines=("bert-of eval tag --model ner-model/ --data dev.conll"))


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
    _task_parser(fsub, TRAIN, "squad", help="SQuAD v1.1 / v2.0 (run_squad.py)",
                 description="Fine-tune a span-prediction head on a SQuAD train file (v2.0 when the file says so), "
                             "with run_squad.py's defaults (each option shows its own). " + FINETUNE_NOTE,
                 example_lines=(
                     "bert-of finetune squad --model bert-base-uncased --train train-v1.1.json -o squad-model/ "
                     "--eval-data dev-v1.1.json",
                     "bert-of finetune squad --model cased_L-12_H-768_A-12/ --no-lower-case --train train-v2.0.json "
                     "-o sq2/ --nproc 2",
                     "bert-of finetune squad --model mini/ --train small.json -o run/ --steps 100 --save-every 50",
                     "bert-of finetune squad -o run/ --resume"))
    _task_parser(fsub, TRAIN, "glue", help="GLUE / XNLI classification (run_classifier.py)",
                 description="Fine-tune a classifier on a GLUE / XNLI train file, with run_classifier.py's defaults "
                             "(each option shows its own). STS-B trains a one-output regression head (MSE). "
                             + FINETUNE_NOTE,
                 example_lines=("bert-of finetune glue --task mrpc --model bert-base-uncased --train MRPC/train.tsv "
                                "-o mrpc-model/ --eval-data MRPC/dev.tsv",
                                "bert-of finetune glue --task sts-b --model bert-base-uncased --train STS-B/train.tsv "
                                "-o stsb/ --epochs 5"))
    _task_parser(fsub, TRAIN, "classify", help="your own CSV / TSV / JSON Lines: classes or a regression target",
                 description="Fine-tune a classifier on a file with named columns (a text, optionally a second text, "
                             "a label): string or integer labels are classes (sorted, recorded in the model), real "
                             "numbers a regression target (MSE). run_classifier.py's defaults. " + FINETUNE_NOTE,
                 example_lines=("bert-of finetune classify --model bert-base-uncased --train train.csv -o "
                                "sentiment-model/ --eval-data dev.csv",
                                "bert-of finetune classify --model bert-base-uncased --train pairs.jsonl "
                                "--text-column q1 --text-pair-column q2 --label-column same -o pairs-model/"))
    _task_parser(fsub, TRAIN, "tag", help="token tagging (NER) on CoNLL-2003-style or JSON Lines files",
                 description="Fine-tune a token classifier: each word's tag on its first WordPiece (transformers' "
                             "NER example); tags sorted (O first) and recorded in the model. " + FINETUNE_NOTE,
                 example_lines=("bert-of finetune tag --model bert-base-cased --no-lower-case --train train.conll "
                                "-o ner-model/ --eval-data dev.conll"))

    p = subparsers.add_parser("predict", help="predictions files for SQuAD or GLUE / XNLI",
                              description="Run a fine-tuned checkpoint over a data file and write predictions "
                                          "into the --output folder.",
                              epilog=examples("bert-of predict squad --model squad-model/ --data dev-v1.1.json "
                                              "-o preds/",
                                              "bert-of predict glue --model mrpc-model/ --data MRPC/test.tsv -o preds/"))
    psub = p.add_subparsers(dest="predict_command", required=True, metavar="TASK")
    _task_parser(psub, PREDICT, "squad", help="predictions.json, nbest_predictions.json (+ null_odds.json for v2.0)",
                 description="run_squad.py prediction: windows with doc_stride, max-context tokens, n-best list, "
                             "longest answer, v2.0 null score threshold; official file formats.",
                 example_lines=("bert-of predict squad --model squad-model/ --data dev-v1.1.json -o preds/",
                                "bert-of eval squad-score --data dev-v1.1.json --predictions preds/predictions.json"))
    _task_parser(psub, PREDICT, "glue", help="GLUE submission file (index<TAB>prediction)",
                 description="Classify every row of a GLUE / XNLI TSV (train, dev or test layout) into "
                             "OUTPUT/predictions.tsv (index<TAB>prediction).",
                 example_lines=("bert-of predict glue --model mrpc-model/ --data MRPC/test.tsv -o preds/",
                                "bert-of eval glue-score --task mrpc --data MRPC/dev.tsv --predictions "
                                "preds/predictions.tsv"))
    _task_parser(psub, PREDICT, "classify", help="per row: the label and every class's probability (CSV / JSON Lines)",
                 description="Run a model from `bert-of finetune classify` over every row of a CSV / TSV / JSON "
                             "Lines file (no labels needed); writes, in input order, each row's label and every "
                             "class's probability (regression: the value) to OUTPUT (.csv or .jsonl).",
                 example_lines=("bert-of predict classify --model sentiment-model/ --data new.csv -o preds.csv",
                                "bert-of predict classify --model sentiment-model/ --data new.jsonl -o preds.jsonl"))
    _task_parser(psub, PREDICT, "tag", help="a tag per word (CoNLL or JSON Lines)",
                 description="Tag every word of a CoNLL / JSON Lines file (tags not needed) with a model from "
                             "`bert-of finetune tag`; writes OUTPUT as JSON Lines (tokens, tags) when it ends .jsonl, "
                             "else CoNLL (token TAB tag, a blank line between sentences).",
                 example_lines=("bert-of predict tag --model ner-model/ --data new.conll -o tagged.conll"))
    return fsub, psub


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bert-of", description="bert_of fine-tuning commands")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_parser(sub)
    return p
