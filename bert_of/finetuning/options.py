"""The options of ``bert-of finetune|predict|eval squad|glue``: one dataclass per task, whose
fields each of the three commands shows its share of (``commands=``); the parsers are generated
from them (:mod:`bert_of.finetuning.cli`) and the same object goes down to the task and, as
:class:`~bert_of.options.TrainConfig`, to the trainer. Defaults are google-research/bert's
(run_squad.py, run_classifier.py). Importing this is cheap (no OneFlow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bert_of.eval.glue_data import TASK_CHOICES
from bert_of.eval.user_data import LABEL_SEPARATOR
from bert_of.options import RUN, TRAINING, Ranks, RunOptions, arg

TRAIN, PREDICT, EVAL = "finetune", "predict", "eval"
RUNS = (PREDICT, EVAL)  # the commands that run a model over a data file (fine-tuning too, on --eval-data)
RECORDING = (TRAIN, EVAL)  # the commands that append to the results store
MODEL, RESULTS = "model", "results store"
SQUAD_EPOCHS, SQUAD_V2_EPOCHS = 3.0, 2.0  # run_squad.py's default; Google's README trains SQuAD 2.0 for 2
SQUAD_LENGTHS = {"max_seq_length": 384, "doc_stride": 128, "max_query_length": 64}  # run_squad.py's
GLUE_MAX_SEQ_LENGTH = 128  # run_classifier.py's
RUN_FOLDER = ("run folder, as pretrain's: run.json, metrics.jsonl, checkpoints/ (--save-every), final/ (the "
              "fine-tuned checkpoint + train_args.json, published atomically; `--model RUN` uses it)")


@dataclass(kw_only=True)
class TaskOptions(RunOptions):
    """What fine-tuning, prediction and evaluation share (the trainer's fields are TrainConfig's, the
    run control RunOptions', as pretraining's: one flag, one default, one meaning)."""

    model: str | None = arg(None, metavar="NAME_OR_DIR", group=MODEL, required=RUNS,  # fine-tuning: unless resumed
                            help="bert_of checkpoint folder (Google TF / HF folders are converted on the fly) or zoo "
                                 "name")
    vocab: str | None = arg(None, help="vocab.txt if the checkpoint has none", metavar="FILE", group=MODEL, path=True)
    do_lower_case: bool | None = arg(None, group=MODEL, off=("--no-lower-case", "keep case (cased models)"),
                                     help="lower-case and strip accents (unset: yes for training; prediction "
                                          "follows the model's train_args.json)")
    device: str = arg("auto", choices=("auto", "cpu", "cuda"), group=MODEL,
                      help="auto: cuda when OneFlow sees a GPU, else cpu")
    predict_batch_size: int = arg(32, help="prediction batch", metavar="N", group=MODEL)
    ranks: Ranks = field(default_factory=Ranks)
    # fine-tuning
    train: str | None = arg(None, help="training data", metavar="FILE", group=TRAINING, commands=(TRAIN,), path=True)
    output: str | None = arg(None, short="-o", metavar="DIR", required=(PREDICT,), path=True,
                             help="folder for the prediction files (GLUE: predictions.tsv)",
                             helps={TRAIN: RUN_FOLDER,
                                    EVAL: "folder for the prediction files (unset: $BERT_OF_HOME/eval/MODEL/"
                                          "TASK-DATA-TIME/)"})
    overwrite: bool = arg(False, help="replace --output if it exists", commands=(TRAIN, PREDICT),
                          on_resume="not kept", helps={PREDICT: "replace prediction files that exist"})
    steps: int | None = arg(None, help="train exactly N optimizer steps (unset: from --epochs)", metavar="N",
                            group=TRAINING, commands=(TRAIN,), on_resume="may grow")
    warmup_proportion: float = arg(0.1, help="warmup fraction of the steps", metavar="P", group=TRAINING,
                                   commands=(TRAIN,))
    warmup_steps: int = 0  # from warmup_proportion
    eval_data: list = arg(default_factory=list, metavar="FILE", group=TRAINING, commands=(TRAIN,),
                          help="after training, evaluate on this labeled file and record the result (repeatable)")
    run_dir: str | None = arg(None, metavar="DIR", group=RUN, commands=(TRAIN,), path=True, on_resume="not kept",
                              help="deprecated: the older spelling of -o (the run folder)")
    # the results store
    results: str | None = arg(None, metavar="FILE", group=RESULTS, commands=RECORDING, on_resume="may change",
                              help="results store (unset: results.jsonl in $BERT_OF_HOME, else ~/.cache/bert_of)")
    no_record: bool = arg(False, help="do not append the evaluation to the results store", group=RESULTS,
                          commands=RECORDING, on_resume="may change")
    name: str | None = arg(None, help="model name in the table (unset: folder or zoo name)", metavar="NAME",
                           group=RESULTS, commands=RECORDING, on_resume="may change")
    hparam: list = arg(default_factory=list, metavar="KEY=VALUE", group=RESULTS, commands=RECORDING,
                       on_resume="may change", help="extra hyper-parameter to record (repeatable)")

    # the trainer's fields and the run control only fine-tuning shows (a prediction does not train; --mode
    # serves all)
    FIELD_COMMANDS = {n: (TRAIN,) for n in ("optimizer", "batch_size", "weight_decay", "clip_grad_norm", "adam_eps",
                                            "grad_accum_steps", "amp", "seed", "log_every", "save_every", "keep",
                                            "resume", "stop_after")}


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


GLUE = "GLUE / XNLI"


@dataclass(kw_only=True)
class GlueOptions(TaskOptions):
    """``bert-of finetune glue`` / ``predict glue`` / ``eval glue`` (run_classifier.py's defaults)."""

    data: str | None = arg(None, metavar="FILE", commands=RUNS, required=True,
                           help="TSV in the task's official layout (train, dev or test)",
                           helps={EVAL: "labeled TSV in the task's official layout"})
    lr: float = arg(2e-5, help="peak learning rate", metavar="LR", group=TRAINING, commands=(TRAIN,))
    epochs: float = arg(3.0, help="epochs", metavar="E", group=TRAINING, commands=(TRAIN,))
    task: str | None = arg(None, metavar="T", group=GLUE,  # fine-tuning: required (finetune_glue says so)
                           help=f"one of {', '.join(TASK_CHOICES)} (unset: the task the model was fine-tuned for)",
                           helps={TRAIN: f"one of {', '.join(TASK_CHOICES)}"})
    language: str | None = arg(None, help="XNLI: only this language's rows (e.g. de)", metavar="LANG", group=GLUE)
    max_seq_length: int | None = arg(None, metavar="N", group=GLUE,
                                     help=f"tokens per example (unset: {GLUE_MAX_SEQ_LENGTH}; prediction: as the "
                                          "model was trained)")
    skip_malformed: bool = arg(False, help="skip training lines with too few columns (QQP's train file has a few)",
                               group=GLUE, commands=(TRAIN,))


YOUR_DATA = "your data"
CLASSIFY_PROBLEMS = ("auto", "single_label", "regression", "multi_label")


@dataclass(kw_only=True)
class ClassifyOptions(TaskOptions):
    """``bert-of finetune classify`` / ``predict classify`` / ``eval classify``: a user's CSV, TSV or
    JSON Lines file with named columns (run_classifier.py's defaults, transformers' run_glue columns)."""

    data: str | None = arg(None, metavar="FILE", commands=RUNS, required=True, path=True,
                           help="CSV, TSV or JSON Lines with a text column (labels not needed)",
                           helps={EVAL: "labeled CSV, TSV or JSON Lines"})
    output: str | None = arg(None, short="-o", metavar="PATH", required=(PREDICT,), path=True,
                             help="folder for predictions.csv, or the predictions file itself: CSV when it ends "
                                  ".csv, JSON Lines when .jsonl",
                             helps={TRAIN: RUN_FOLDER,
                                    EVAL: "folder for predictions.csv (unset: $BERT_OF_HOME/eval/MODEL/"
                                          "classify-DATA-TIME/)"})
    lr: float = arg(2e-5, help="peak learning rate", metavar="LR", group=TRAINING, commands=(TRAIN,))
    epochs: float = arg(3.0, help="epochs", metavar="E", group=TRAINING, commands=(TRAIN,))
    text_column: str | None = arg(None, metavar="NAME", group=YOUR_DATA,
                                  help="the text (unset: text, sentence, sentence1, premise, question, review or "
                                       "content)")
    text_pair_column: str | None = arg(None, metavar="NAME", group=YOUR_DATA,
                                       help="the second text of a pair (unset: text_pair, sentence2, hypothesis or "
                                            "passage when present)")
    label_column: str | None = arg(None, metavar="NAME", group=YOUR_DATA, commands=(TRAIN, EVAL),
                                   help="the label (unset: label, labels, target, or the only other column)")
    problem: str = arg("auto", choices=CLASSIFY_PROBLEMS, group=YOUR_DATA, commands=(TRAIN,),
                       help="auto: regression when the labels are real numbers, else classes; multi_label: "
                            "each row holds a set of classes (sigmoid per class, binary cross-entropy)")
    label_separator: str = arg(LABEL_SEPARATOR, metavar="SEP", group=YOUR_DATA,
                               help="multi_label: what separates a row's classes in a CSV/TSV cell (JSON Lines "
                                    "may hold a list); the predictions file joins them with it")
    max_seq_length: int | None = arg(None, metavar="N", group=YOUR_DATA,
                                     help=f"tokens per example (unset: {GLUE_MAX_SEQ_LENGTH}; prediction: as the "
                                          "model was trained)")


TAGGING = "tagging"


@dataclass(kw_only=True)
class TagOptions(TaskOptions):
    """``bert-of finetune tag`` / ``predict tag`` / ``eval tag``: CoNLL-2003-style files or JSON Lines
    with ``tokens`` and ``tags`` (a tag on each word's first WordPiece, as transformers' NER example)."""

    data: str | None = arg(None, metavar="FILE", commands=RUNS, required=True, path=True,
                           help="CoNLL file (token first, tag last) or JSON Lines with tokens (tags not needed)",
                           helps={EVAL: "tagged CoNLL file or JSON Lines with tokens and tags"})
    output: str | None = arg(None, short="-o", metavar="PATH", required=(PREDICT,), path=True,
                             help="folder for predictions.jsonl (tokens, tags), or the predictions file itself: "
                                  "JSON Lines when it ends .jsonl, CoNLL (token TAB tag) when .conll, .txt or .tsv",
                             helps={TRAIN: RUN_FOLDER,
                                    EVAL: "folder for predictions.jsonl (unset: $BERT_OF_HOME/eval/MODEL/"
                                          "tag-DATA-TIME/)"})
    lr: float = arg(5e-5, help="peak learning rate", metavar="LR", group=TRAINING, commands=(TRAIN,))
    epochs: float = arg(3.0, help="epochs", metavar="E", group=TRAINING, commands=(TRAIN,))
    max_seq_length: int | None = arg(None, metavar="N", group=TAGGING,
                                     help=f"WordPieces per sentence (unset: {GLUE_MAX_SEQ_LENGTH}; prediction: as "
                                          "the model was trained); words past it are tagged O")


__all__ = ["ClassifyOptions", "TagOptions", "EVAL", "GLUE_MAX_SEQ_LENGTH", "GlueOptions", "PREDICT", "SQUAD_EPOCHS", "SQUAD_LENGTHS", "SQUAD_V2_EPOCHS",
           "SquadOptions", "TRAIN", "TaskOptions"]
