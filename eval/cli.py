"""``bert-of eval ...`` and ``bert-of results``.

    bert-of eval squad-score --data DATA.json --predictions PREDICTIONS.json [--na-prob-file F] [-t T]
    bert-of eval glue-score --task T --data dev.tsv --predictions preds.tsv
    bert-of eval squad --model NAME_OR_DIR --data dev.json      (predict + score + record)
    bert-of eval glue --model NAME_OR_DIR --task T --data dev.tsv
    bert-of results [--format markdown|csv|json] [--task T] [--results FILE]

``bert_of.cli`` mounts these with :func:`add_parser`.
Each evaluation prints its scores on stdout (squad-score: exactly the official script's JSON)
and appends a record to the results store (``--no-record`` skips it); notes go to stderr.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from dataclasses import dataclass

from bert_of.cli_grammar import add_command, examples
from bert_of.errors import BertOfError
from bert_of.eval.errors import EvalDataError
from bert_of.eval.glue_data import TASK_CHOICES, read_examples, result_task_name, task_spec
from bert_of.eval.glue_metrics import compute_metrics, read_predictions
from bert_of.eval.results import (append_result, checkpoint_identity, file_identity, format_table, load_published,
                                  load_results, make_record, select)
from bert_of.eval.squad_metrics import squad_score
from bert_of.files.atomic import atomic_write
from bert_of.finetuning.cli import add_eval_commands
from bert_of.options import arg, from_args
from bert_of.progress import log


def _parse_hparams(items) -> dict:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise BertOfError(f"--hparam {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def _checkpoint(args):
    """The record's model: --model's folder (hashed) or name, labelled --name."""
    if args.model and os.path.exists(args.model):
        return checkpoint_identity(args.model, name=args.name)
    if args.model or args.name:
        return {"name": args.name or args.model, "path": None, "format": None, "sha256": None}
    return None


def _record(args, task: str, metrics: dict, *, split: str, data_path: str, pred_path: str, tool: str,
            **extra) -> None:
    if args.no_record:
        return
    rec = make_record(task, metrics, split=split, checkpoint=_checkpoint(args), hparams=_parse_hparams(args.hparam),
                      data=file_identity(data_path), predictions=file_identity(pred_path), tool=tool, **extra)
    path = append_result(rec, args.results)
    log.info(f"recorded in {path}")


# --------------------------------------------------------------------------- options

RESULTS = "results store"


@dataclass(kw_only=True)
class ScoreOptions:
    """What ``eval squad-score`` and ``eval glue-score`` share: the files, and the record."""

    data: str = arg(help="the labeled data file the predictions answer", metavar="DATA")
    predictions: str = arg(help="the predictions file to score", metavar="PREDICTIONS")
    results: str | None = arg(None, metavar="FILE", group=RESULTS,
                              help="results store (unset: results.jsonl in $BERT_OF_HOME, else ~/.cache/bert_of)")
    no_record: bool = arg(False, help="do not append this evaluation to the results store", group=RESULTS)
    model: str | None = arg(None, metavar="NAME_OR_DIR", group=RESULTS,
                            help="the checkpoint that produced the predictions: a folder is hashed into the record, "
                                 "anything else is recorded as a name")
    name: str | None = arg(None, metavar="NAME", group=RESULTS,
                           help="the model's name in the table (unset: --model's folder name)")
    hparam: list = arg(default_factory=list, metavar="KEY=VALUE", group=RESULTS,
                       help="hyper-parameter to record (repeatable; VALUE parsed as JSON when it is)")


@dataclass(kw_only=True)
class SquadScoreOptions(ScoreOptions):
    """``bert-of eval squad-score``: the official evaluate-v1.1.py / evaluate-v2.0.py."""

    na_prob_file: str | None = arg(None, short="-n", metavar="F",  # -n, -t: the official scripts' short flags
                                   help="v2.0: question id -> probability of no answer")
    na_prob_thresh: float = arg(1.0, short="-t", metavar="T", help='v2.0: predict "" if the no-answer probability exceeds this')
    output: str | None = arg(None, short="-o", metavar="FILE", help="write the JSON here instead of stdout")
    squad_version: str | None = arg(None, choices=("1.1", "2.0"),
                                    help="score as 1.1 or 2.0 regardless of the data file's version field")
    ignore_unknown_ids: bool = arg(False, help="ignore prediction ids that are not in the data (unset: an error)")
    skip_span_check: bool = arg(False, help="do not require answers to appear at their answer_start in the context")


@dataclass(kw_only=True)
class GlueScoreOptions(ScoreOptions):
    """``bert-of eval glue-score``."""

    task: str = arg(help=f"one of {', '.join(TASK_CHOICES)}", metavar="T")
    language: str | None = arg(None, metavar="LANG", help="XNLI: score only this language's rows (e.g. zh)")


@dataclass(kw_only=True)
class ResultsOptions:
    """``bert-of results``."""

    results: str | None = arg(None, metavar="FILE", help="results store (unset: $BERT_OF_HOME/results.jsonl)")
    format: str = arg("markdown", choices=("markdown", "csv", "json"), help="table format")
    task: str | None = arg(None, metavar="TASK", help="only this task (e.g. squad-v1.1, squad-v2.0, mrpc, mnli-m, "
                                                      "xnli-de)")
    measured_only: bool = arg(False, help="leave out the published reference rows")
    published_only: bool = arg(False, help="only the published reference rows")


# --------------------------------------------------------------------------- commands


def cmd_squad_score(args) -> int:
    args = from_args(SquadScoreOptions, args)
    score = squad_score(args.data, args.predictions, na_prob_file=args.na_prob_file,
                        na_prob_thresh=args.na_prob_thresh, version=args.squad_version,
                        ignore_unknown_ids=args.ignore_unknown_ids, check_spans=not args.skip_span_check)
    for note in score.notes:
        log.info(note)
    if score.version == "1.1":
        text = json.dumps(score.result)
    else:
        text = json.dumps(score.result, indent=2)
    if args.output:
        atomic_write(args.output, json.dumps(score.result))
    else:
        print(text)
    settings = {"missing_predictions": len(score.missing)}
    if score.version == "2.0":
        settings.update(na_prob_file=os.path.abspath(args.na_prob_file) if args.na_prob_file else None,
                        na_prob_thresh=args.na_prob_thresh)
    _record(args, f"squad-v{score.version}", dict(score.result), split=os.path.basename(args.data),
            data_path=args.data, pred_path=args.predictions, tool="bert-of eval squad-score", settings=settings)
    return 0


def cmd_glue_score(args) -> int:
    args = from_args(GlueScoreOptions, args)
    task_spec(args.task)
    examples = read_examples(args.task, args.data, language=args.language)
    if any(e.label is None for e in examples):
        raise EvalDataError(f"{args.data}: has no labels (a test file?); score a train/dev file")
    preds = read_predictions(args.predictions, args.task, len(examples))
    metrics = {}
    for k, v in compute_metrics(args.task, [e.label for e in examples], preds).items():
        if math.isnan(v):  # e.g. Pearson of constant predictions
            log.warning(f"note: {k} is undefined for these predictions (constant values); reported as null")
            metrics[k] = None
        else:
            metrics[k] = 100.0 * v
    task = result_task_name(args.task, args.data)
    if task == "xnli" and args.language:
        task = f"xnli-{args.language}"
    out = {"task": task, "examples": len(examples), **metrics}
    print(json.dumps(out, indent=2))
    _record(args, task, metrics, split=os.path.basename(args.data), data_path=args.data,
            pred_path=args.predictions, tool="bert-of eval glue-score",
            settings={"language": args.language} if args.language else {})
    return 0


def _check_task(task: str, records: list) -> None:
    """An unknown --task is an error (a typo would print an empty table)."""
    known = {"squad-v1.1", "squad-v2.0", *(result_task_name(t, "") for t in TASK_CHOICES), "mnli-m", "mnli-mm"}
    known |= {r.get("task") for r in records}
    if task in known or task.startswith("xnli-"):
        return
    close = difflib.get_close_matches(task, sorted(k for k in known if k), n=1)
    raise BertOfError(f"--task {task!r}: unknown task" + (f" (did you mean {close[0]}?)" if close else "")
                      + f"; known: {', '.join(sorted(k for k in known if k))}")


def cmd_results(args) -> int:
    args = from_args(ResultsOptions, args)
    if args.measured_only and args.published_only:
        raise BertOfError("--measured-only and --published-only: pass one of them")
    records = []
    if not args.published_only:
        records += load_results(args.results)
    if not args.measured_only:
        records += load_published()
    if args.task:
        _check_task(args.task, records)
    records = select(records, task=args.task)
    print(format_table(records, args.format))
    return 0


# --------------------------------------------------------------------------- parser


def add_parser(subparsers):
    """Add ``eval`` (squad-score, glue-score) and ``results`` to a ``bert-of`` subparsers object.

    Returns the ``eval`` command's own subparsers so later commands (``eval squad --model``)
    can join it.
    """
    e = subparsers.add_parser("eval", help="evaluate a model on SQuAD / GLUE, or score predictions (official "
                                           "metrics)",
                              description="Evaluate a model on a labeled file (eval squad / eval glue: predict, "
                                          "score, record) or score predictions made elsewhere (squad-score, "
                                          "glue-score). Every evaluation is appended to the results store.",
                              epilog=examples("bert-of eval squad --model squad-model/ --data dev-v1.1.json",
                                              "bert-of eval glue --model mrpc-model/ --data MRPC/dev.tsv",
                                              "bert-of eval squad-score --data dev-v1.1.json --predictions "
                                              "predictions.json",
                                              "bert-of results --task squad-v1.1"))
    esub = e.add_subparsers(dest="eval_command", required=True, metavar="EVAL_COMMAND")

    add_command(esub, "squad-score", cmd_squad_score, SquadScoreOptions,
                help="drop-in for the official SQuAD evaluate-v1.1.py / evaluate-v2.0.py",
                description="Score predictions.json like the official SQuAD script of the data file's "
                            "version; prints the same JSON object on stdout.",
                example_lines=(
                    "bert-of eval squad-score --data dev-v1.1.json --predictions predictions.json",
                    "bert-of eval squad-score --data dev-v2.0.json --predictions predictions.json "
                    "--na-prob-file null_odds.json",
                    "bert-of eval squad-score --data dev-v1.1.json --predictions p.json --model squad-model/ "
                    "--name my-bert"))

    add_command(esub, "glue-score", cmd_glue_score, GlueScoreOptions,
                help="score GLUE / XNLI predictions against a labeled TSV",
                description="Metrics: CoLA Matthews; MRPC/QQP F1 + accuracy; STS-B Pearson/Spearman; "
                            "accuracy elsewhere (percent). Predictions: one label per line, or a GLUE "
                            "submission file (header 'index<TAB>prediction').",
                example_lines=("bert-of eval glue-score --task mrpc --data MRPC/dev.tsv --predictions "
                               "preds/predictions.tsv",
                               "bert-of eval glue-score --task xnli --language de --data xnli.dev.tsv "
                               "--predictions p.tsv"))

    add_eval_commands(esub)  # eval squad / eval glue: run a model, then score and record

    add_command(subparsers, "results", cmd_results, ResultsOptions, help="the results table (measured and published)",
                description="Print the results store with the published reference numbers.",
                example_lines=("bert-of results", "bert-of results --task squad-v1.1 --format csv",
                               "bert-of results --measured-only --format json"))
    return esub
