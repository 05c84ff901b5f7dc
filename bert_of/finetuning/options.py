"""What the options of ``bert-of finetune|predict|eval TASK`` share: :class:`TaskOptions`, which each
task's own dataclass extends in its module (``SquadOptions`` in squad.py, ...), and the command
names. Each field says which of the three commands shows it (``commands=``); the parsers are
generated from the dataclass (:mod:`bert_of.finetuning.cli`) and the same object goes down to the
task and, as :class:`~bert_of.options.TrainConfig`, to the trainer. Defaults are google-research/bert's
(run_squad.py, run_classifier.py). Importing this is cheap (no OneFlow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bert_of.converters.formats.onnx import ONNX_EXTRA, NeedsOnnxRuntime, import_onnxruntime
from bert_of.errors import ConfigError
from bert_of.launch import in_rank, topology
from bert_of.options import TRAINING, Ranks, RunOptions, arg

TRAIN, PREDICT, EVAL = "finetune", "predict", "eval"
RUNS = (PREDICT, EVAL)  # the commands that run a model over a data file (fine-tuning too, on --eval-data)
RECORDING = (TRAIN, EVAL)  # the commands that append to the results store
MODEL, RESULTS = "model", "results store"
ONEFLOW, ONNXRUNTIME = "oneflow", "onnxruntime"
ENGINES = (ONEFLOW, ONNXRUNTIME)  # --engine: what runs the model in predict / eval (fine-tuning: OneFlow)
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
    engine: str = arg(ONEFLOW, choices=ENGINES, group=MODEL, commands=RUNS,
                      help="what runs the model: oneflow, or onnxruntime (the onnx extra: the checkpoint's ONNX graph, "
                           "as `convert of2onnx` writes it, built in memory; CPU, one process; the same predictions "
                           "within 1e-5)")
    predict_batch_size: int = arg(32, help="prediction batch", metavar="N", group=MODEL)
    pad_to_max_length: bool = arg(False, group=MODEL,
                                  help="pad every row to --max-seq-length, as run_classifier.py / run_squad.py do "
                                       "(unset: rows grouped by length, each batch padded to its longest row: the "
                                       "same results to float rounding, far less work on short rows; SQuAD "
                                       "fine-tuning always pads, its loss spans every position)")
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


def check_engine(opts) -> None:
    """``--engine onnxruntime``: onnxruntime installed, and none of the options only OneFlow honours
    (each refused in its own line, before any work: never accepted and ignored)."""
    if getattr(opts, "engine", ONEFLOW) != ONNXRUNTIME:
        return
    try:
        import_onnxruntime()
    except NeedsOnnxRuntime:
        raise ConfigError(f"--engine onnxruntime needs onnxruntime: {ONNX_EXTRA}") from None
    if opts.mode != "auto":
        raise ConfigError(f"--mode {opts.mode} is OneFlow's execution mode; --engine onnxruntime runs "
                          "onnxruntime's own session (leave --mode unset)")
    if opts.device == "cuda":
        raise ConfigError("--device cuda: --engine onnxruntime runs on the CPU (onnxruntime's CPU provider); "
                          "use --engine oneflow for a GPU")
    if topology(opts.ranks).world > 1 or in_rank():
        raise ConfigError("--engine onnxruntime runs in one process: --nproc / --nnodes (ranks) are OneFlow's; "
                          "use --engine oneflow for several ranks")


__all__ = ["check_engine", "ENGINES", "ONEFLOW", "ONNXRUNTIME", "EVAL", "GLUE_MAX_SEQ_LENGTH", "PREDICT", "RUN_FOLDER", "RUNS", "TRAIN", "TaskOptions"]
