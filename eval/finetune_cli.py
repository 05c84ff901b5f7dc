"""``bert-of finetune squad|glue`` and ``bert-of predict squad|glue`` (and the options that
``bert-of eval squad|glue`` share with them).

    bert-of finetune squad --model NAME_OR_DIR --train train-v1.1.json -o DIR [--eval-data dev-v1.1.json]
    bert-of predict squad  --model DIR --data dev-v1.1.json -o DIR
    bert-of finetune glue  --task mrpc --model NAME_OR_DIR --train train.tsv -o DIR [--eval-data dev.tsv]
    bert-of predict glue   --model DIR [--task mrpc] --data test.tsv -o DIR

Defaults are google-research/bert's run_squad.py / run_classifier.py hyper-parameters (see
:mod:`bert_of.eval.tasks`). ``--nproc N`` runs N ranks on this machine (global tensors;
``--batch-size`` is the global batch).

Importing this module is cheap (no OneFlow). Each command converts its options into the task's
option dataclass and imports its task module (:mod:`bert_of.eval.tasks.squad`,
:mod:`bert_of.eval.tasks.glue`) when it runs.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, fields

from bert_of.cli_grammar import examples, option, output_option
from bert_of.errors import ConfigError
from bert_of.fs import LOCK_NAME, check_unlocked
from bert_of.eval.glue import TASK_CHOICES
from bert_of.launch import add_arguments as add_rank_arguments
from bert_of.launch import in_rank, maybe_relaunch, topology

FINETUNE_NOTE = ("Defaults are google-research/bert's (AdamW without bias correction, eps 1e-6, weight decay "
                 "0.01 not on LayerNorm/bias, linear warmup then linear decay to 0, clip 1.0); steps = "
                 "int(examples / batch * epochs). --nproc N: N ranks on this machine; --nnodes M --node-rank R "
                 "--master-addr A --master-port P: across machines (--batch-size is the global batch).")


# --------------------------------------------------------------------------- option groups


def add_model_options(p, predict: bool = True) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", required=True, metavar="NAME_OR_DIR",
                   help="bert_of checkpoint folder (Google TF / HF folders are converted on the fly) or zoo name")
    g.add_argument("--vocab", metavar="FILE", help="vocab.txt if the checkpoint has none")
    case = g.add_mutually_exclusive_group()
    case.add_argument("--do-lower-case", dest="do_lower_case", action="store_true", default=None,
                      help="lower-case and strip accents (default for training; prediction follows the model's "
                           "train_args.json)")
    case.add_argument("--no-lower-case", dest="do_lower_case", action="store_false",
                      help="keep case (cased models)")
    g.add_argument("--mode", choices=("graph", "eager"), default=None, help="nn.Graph (default) or eager execution")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                   help="default: cuda when OneFlow sees a GPU, else cpu")
    if predict:
        g.add_argument("--predict-batch-size", type=int, metavar="N", help="prediction batch (default 32)")
    add_rank_arguments(p)


def add_train_options(p, defaults: dict) -> None:
    g = p.add_argument_group("training (defaults: google-research/bert)")
    g.add_argument("--train", required=True, metavar="FILE", help="training data")
    output_option(g, "fine-tuned bert_of checkpoint + train_args.json (written atomically)", required=True,
                  metavar="DIR")
    g.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    g.add_argument("--lr", type=float, metavar="LR", help=f"peak learning rate (default {defaults['lr']:g})")
    g.add_argument("--batch-size", type=int, metavar="N",
                   help=f"global train batch (default {defaults['batch_size']})")
    g.add_argument("--epochs", type=float, metavar="E", help=f"epochs (default {defaults['epochs_help']})")
    option(g, "--steps", old=("--max-steps",), dest="max_steps", type=int, metavar="N",
           help="train exactly N optimizer steps (default: from --epochs)")
    g.add_argument("--warmup-proportion", type=float, metavar="P", help="warmup fraction of the steps (default 0.1)")
    g.add_argument("--weight-decay", type=float, metavar="W", help="decoupled weight decay (default 0.01)")
    g.add_argument("--clip-grad-norm", type=float, metavar="C", help="global-norm clip, 0 = off (default 1.0)")
    g.add_argument("--adam-eps", type=float, metavar="EPS", help="AdamW epsilon (default 1e-6)")
    g.add_argument("--seed", type=int, help="shuffling, dropout and new-head init (default 42)")
    g.add_argument("--grad-accum-steps", type=int, metavar="K",
                   help="micro-batches per optimizer step: split each batch into K (default 1)")
    g.add_argument("--amp", action="store_true",
                   help="mixed precision: fp16 on GPU with loss scaling (graph: OneFlow's GradScaler; eager: "
                        "bert_of's dynamic loss scaler)")
    g.add_argument("--log-every", type=int, metavar="N", help="print the loss every N steps (default 50)")
    g.add_argument("--eval-data", action="append", metavar="FILE",
                   help="after training, evaluate on this labeled file and record the result (repeatable)")
    g.add_argument("--run-dir", metavar="DIR",
                   help="keep metrics.jsonl and (with --save-every) resumable checkpoints here")
    g.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="a resumable checkpoint in --run-dir every N steps; 0 = none")
    g.add_argument("--resume", action="store_true", help="continue the run in --run-dir exactly where it stopped")
    g.add_argument("--stop-after", type=int, default=0, help=argparse.SUPPRESS)


def add_record_options(p) -> None:
    g = p.add_argument_group("results store")
    g.add_argument("--results", metavar="FILE",
                   help="results store (default: results.jsonl in $BERT_OF_HOME, else ~/.cache/bert_of)")
    g.add_argument("--no-record", action="store_true", help="do not append the evaluation to the results store")
    g.add_argument("--name", metavar="NAME", help="model name in the table (default: folder or zoo name)")
    g.add_argument("--hparam", action="append", metavar="KEY=VALUE",
                   help="extra hyper-parameter to record (repeatable)")


def add_squad_options(p, train: bool) -> None:
    g = p.add_argument_group("SQuAD features" + ("" if train else " (default: as the model was trained)"))
    g.add_argument("--max-seq-length", type=int, metavar="N", help="window length in WordPieces (default 384)")
    g.add_argument("--doc-stride", type=int, metavar="N", help="distance between windows (default 128)")
    g.add_argument("--max-query-length", type=int, metavar="N", help="question WordPieces kept (default 64)")
    option(g, "--squad-version", old=("--version",), dest="version", choices=("1.1", "2.0"),
           help="treat the data as SQuAD 1.1 or 2.0 (default: the file's version / is_impossible)")
    g = p.add_argument_group("SQuAD predictions")
    g.add_argument("--n-best-size", type=int, metavar="N", help="n-best list length (default 20)")
    g.add_argument("--max-answer-length", type=int, metavar="N", help="longest answer in WordPieces (default 30)")
    g.add_argument("--null-score-diff-threshold", type=float, metavar="T",
                   help='v2.0: predict "" when null score - best span score > T (default 0.0)')


def add_glue_options(p, task_required: bool) -> None:
    g = p.add_argument_group("GLUE / XNLI")
    g.add_argument("--task", required=task_required, metavar="T",
                   help=f"one of {', '.join(TASK_CHOICES)}" + ("" if task_required else
                                                               " (default: the task the model was fine-tuned for)"))
    g.add_argument("--language", metavar="LANG", help="XNLI: only this language's rows (e.g. de)")
    g.add_argument("--max-seq-length", type=int, metavar="N",
                   help="default 128 (prediction: as the model was trained)")


# --------------------------------------------------------------------------- commands


def _positive(args, *names):
    for n in names:
        v = getattr(args, n, None)
        if v is not None and v < 1:
            raise ConfigError(f"--{n.replace('_', '-')} must be at least 1, got {v}")


def _fast_blas():
    """Fine-tuning and prediction need speed, not bit-parity with TF: OneFlow's bundled OpenBLAS
    gets its AVX2/FMA kernels (bert_of/_flow.py) unless BERT_OF_BLAS=exact says otherwise."""
    os.environ.setdefault("BERT_OF_BLAS", "fast")


def options(cls, args):
    """The command's option dataclass from its parsed arguments (same names)."""
    kw = {}
    for f in fields(cls):
        v = getattr(args, f.name, None)
        if v is None and f.default_factory is not MISSING:
            continue  # an unused repeatable option: the empty list
        if hasattr(args, f.name):
            kw[f.name] = v
    return cls(**kw)


def _ranks(args):
    """--nproc N (--nnodes ...): this command line again as ranks; None when this process is to do
    the work. What can be refused without OneFlow is refused here first, once, before ranks start
    (one process refuses as it always did)."""
    _positive(args, "nproc")
    if topology(args).world > 1 and not in_rank():
        if getattr(args, "run_dir", None):  # a run's one writer: say so once, before any rank starts
            check_unlocked(os.path.join(args.run_dir, LOCK_NAME), os.path.abspath(args.run_dir))
        for name in ("train", "data", "eval_data"):
            value = getattr(args, name, None)
            for path in value if isinstance(value, list) else [value] if value else []:  # --eval-data repeats
                if not os.path.exists(path):
                    raise ConfigError(f"--{name.replace('_', '-')} {path}: no such file")
        if getattr(args, "vocab", None) and not os.path.isfile(args.vocab):
            raise ConfigError(f"--vocab {args.vocab}: no such file")
    return maybe_relaunch(args)


TRAIN_CHECKS = ("batch_size", "max_steps", "grad_accum_steps", "log_every", "max_seq_length", "predict_batch_size")


def cmd_finetune_squad(args) -> int:
    _fast_blas()
    _positive(args, *TRAIN_CHECKS)
    code = _ranks(args)
    if code is not None:
        return code
    from bert_of.eval.tasks import squad

    squad.finetune_squad(options(squad.SquadTrainOptions, args))
    return 0


def cmd_finetune_glue(args) -> int:
    _fast_blas()
    _positive(args, *TRAIN_CHECKS)
    code = _ranks(args)
    if code is not None:
        return code
    from bert_of.eval.tasks import glue

    glue.finetune_glue(options(glue.GlueTrainOptions, args))
    return 0


def cmd_predict_squad(args) -> int:
    _fast_blas()
    _positive(args, "max_seq_length", "predict_batch_size", "n_best_size", "max_answer_length")
    code = _ranks(args)
    if code is not None:
        return code
    from bert_of.eval.tasks import squad

    squad.predict_squad(options(squad.SquadPredictOptions, args))
    return 0


def cmd_predict_glue(args) -> int:
    _fast_blas()
    _positive(args, "max_seq_length", "predict_batch_size")
    code = _ranks(args)
    if code is not None:
        return code
    from bert_of.eval.tasks import glue

    glue.predict_glue(options(glue.GluePredictOptions, args))
    return 0


def cmd_eval_squad(args) -> int:
    _fast_blas()
    _positive(args, "max_seq_length", "predict_batch_size", "n_best_size", "max_answer_length")
    code = _ranks(args)
    if code is not None:
        return code
    from bert_of.eval.tasks import squad

    squad.eval_squad(options(squad.SquadEvalOptions, args))
    return 0


def cmd_eval_glue(args) -> int:
    _fast_blas()
    _positive(args, "max_seq_length", "predict_batch_size")
    code = _ranks(args)
    if code is not None:
        return code
    from bert_of.eval.tasks import glue

    glue.eval_glue(options(glue.GlueEvalOptions, args))
    return 0


# --------------------------------------------------------------------------- parsers


def add_eval_commands(esub) -> None:
    """``eval squad`` and ``eval glue`` on the ``eval`` command's subparsers."""
    s = esub.add_parser("squad", help="predict a SQuAD file with a model, score it (official) and record it",
                        description="Run the model over DATA (run_squad.py features and post-processing), write "
                                    "predictions.json / nbest_predictions.json (/ null_odds.json), score them as "
                                    "the official evaluate script of the file's version does, print that JSON, "
                                    "and append the result to the results store.",
                        epilog=examples("bert-of eval squad --model squad-model/ --data dev-v1.1.json",
                                        "bert-of eval squad --model squad-model/ --data dev-v2.0.json -o preds/ "
                                        "--name my-bert-v2"))
    add_model_options(s)
    s.add_argument("--data", required=True, metavar="dev.json", help="labeled SQuAD v1.1 / v2.0 file")
    output_option(s, "folder for the prediction files (default: $BERT_OF_HOME/eval/MODEL/squad-DATA-TIME/)",
                  metavar="DIR")
    add_squad_options(s, train=False)
    add_record_options(s)
    s.set_defaults(fn=cmd_eval_squad)

    g = esub.add_parser("glue", help="predict a labeled GLUE / XNLI file with a model, score it and record it",
                        description="Classify DATA, write the predictions (GLUE submission format), score them "
                                    "(CoLA Matthews; MRPC/QQP F1 + accuracy; STS-B Pearson/Spearman; accuracy) "
                                    "and append the result to the results store.",
                        epilog=examples("bert-of eval glue --model mrpc-model/ --data MRPC/dev.tsv",
                                        "bert-of eval glue --model xnli-model/ --task xnli --language de "
                                        "--data xnli.dev.tsv"))
    add_model_options(g)
    add_glue_options(g, task_required=False)
    g.add_argument("--data", required=True, metavar="dev.tsv", help="labeled TSV in the task's official layout")
    output_option(g, "folder for predictions.tsv (default: $BERT_OF_HOME/eval/MODEL/TASK-DATA-TIME/)",
                  metavar="DIR")
    add_record_options(g)
    g.set_defaults(fn=cmd_eval_glue)


def add_parser(subparsers):
    """Add the top-level ``finetune`` and ``predict`` commands to ``bert-of``."""
    f = subparsers.add_parser("finetune", help="fine-tune a checkpoint on SQuAD or GLUE / XNLI",
                              description="Fine-tune a BERT checkpoint; writes a bert_of checkpoint + "
                                          "train_args.json. " + FINETUNE_NOTE,
                              epilog=examples("bert-of finetune squad --model bert-base-uncased --train "
                                              "train-v1.1.json -o squad-model/ --eval-data dev-v1.1.json",
                                              "bert-of finetune glue --task mrpc --model bert-base-uncased --train "
                                              "MRPC/train.tsv -o mrpc-model/"))
    fsub = f.add_subparsers(dest="finetune_command", required=True, metavar="TASK")

    s = fsub.add_parser("squad", help="SQuAD v1.1 / v2.0 (run_squad.py)",
                        description="Fine-tune a span-prediction head on a SQuAD train file (v2.0 when the file "
                                    "says so): lr 5e-5, batch 32, 3 epochs (2 for v2.0), warmup 0.1, max_seq 384, "
                                    "doc_stride 128, max_query 64 unless told otherwise. " + FINETUNE_NOTE,
                        epilog=examples(
                            "bert-of finetune squad --model bert-base-uncased --train train-v1.1.json -o squad-model/ "
                            "--eval-data dev-v1.1.json",
                            "bert-of finetune squad --model cased_L-12_H-768_A-12/ --no-lower-case --train "
                            "train-v2.0.json -o sq2/ --nproc 2",
                            "bert-of finetune squad --model mini/ --train small.json -o m/ --steps 100 --run-dir run/ "
                            "--save-every 50"))
    add_model_options(s)
    add_train_options(s, dict(lr=5e-5, batch_size=32, epochs_help="3.0; 2.0 for v2.0"))
    add_squad_options(s, train=True)
    add_record_options(s)
    s.set_defaults(fn=cmd_finetune_squad)

    g = fsub.add_parser("glue", help="GLUE / XNLI classification (run_classifier.py)",
                        description="Fine-tune a classifier on a GLUE / XNLI train file: lr 2e-5, batch 32, "
                                    "3 epochs, warmup 0.1, max_seq 128 unless told otherwise. STS-B trains a "
                                    "one-output regression head (MSE). " + FINETUNE_NOTE,
                        epilog=examples("bert-of finetune glue --task mrpc --model bert-base-uncased --train "
                                        "MRPC/train.tsv -o mrpc-model/ --eval-data MRPC/dev.tsv",
                                        "bert-of finetune glue --task sts-b --model bert-base-uncased --train "
                                        "STS-B/train.tsv -o stsb/ --epochs 5"))
    add_model_options(g)
    add_glue_options(g, task_required=True)
    add_train_options(g, dict(lr=2e-5, batch_size=32, epochs_help="3.0"))
    g.add_argument("--skip-malformed", action="store_true",
                   help="skip training lines with too few columns (QQP's train file has a few)")
    add_record_options(g)
    g.set_defaults(fn=cmd_finetune_glue)

    p = subparsers.add_parser("predict", help="predictions files for SQuAD or GLUE / XNLI",
                              description="Run a fine-tuned checkpoint over a data file and write predictions "
                                          "into the --output folder.",
                              epilog=examples("bert-of predict squad --model squad-model/ --data dev-v1.1.json "
                                              "-o preds/",
                                              "bert-of predict glue --model mrpc-model/ --data MRPC/test.tsv -o preds/"))
    psub = p.add_subparsers(dest="predict_command", required=True, metavar="TASK")

    s = psub.add_parser("squad", help="predictions.json, nbest_predictions.json (+ null_odds.json for v2.0)",
                        description="run_squad.py prediction: windows with doc_stride, max-context tokens, n-best "
                                    "20, max answer length 30, v2.0 null score threshold; official file formats.",
                        epilog=examples("bert-of predict squad --model squad-model/ --data dev-v1.1.json -o preds/",
                                        "bert-of eval squad-score --data dev-v1.1.json --predictions "
                                        "preds/predictions.json"))
    add_model_options(s)
    s.add_argument("--data", required=True, metavar="FILE", help="SQuAD v1.1 / v2.0 json (answers not needed)")
    output_option(s, "folder for the prediction files", required=True, metavar="DIR")
    add_squad_options(s, train=False)
    s.set_defaults(fn=cmd_predict_squad)

    g = psub.add_parser("glue", help="GLUE submission file (index<TAB>prediction)",
                        description="Classify every row of a GLUE / XNLI TSV (train, dev or test layout) into "
                                    "OUTPUT/predictions.tsv (index<TAB>prediction).",
                        epilog=examples("bert-of predict glue --model mrpc-model/ --data MRPC/test.tsv -o preds/",
                                        "bert-of eval glue-score --task mrpc --data MRPC/dev.tsv --predictions "
                                        "preds/predictions.tsv"))
    add_model_options(g)
    add_glue_options(g, task_required=False)
    g.add_argument("--data", required=True, metavar="FILE", help="TSV in the task's official layout")
    output_option(g, "folder for predictions.tsv (a path ending in .tsv is taken as the file itself: deprecated)",
                  required=True, metavar="DIR")
    g.set_defaults(fn=cmd_predict_glue)
    return fsub, psub


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bert-of", description="bert_of fine-tuning commands")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_parser(sub)
    return p
