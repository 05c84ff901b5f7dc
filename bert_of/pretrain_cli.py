"""``bert-of pretrain`` and ``bert-of plot``: their command lines. Importing this is cheap (no
OneFlow); ``pretrain`` imports :mod:`bert_of.pretrain` when it runs."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from bert_of.cli_grammar import examples, option, output_option
from bert_of.data.reader import dataset_vocab, read_meta
from bert_of.errors import BertOfError, ConfigError
from bert_of.fs import LOCK_NAME, atomic_open, check_unlocked, read_json, read_jsonl
from bert_of.launch import add_arguments as add_rank_arguments
from bert_of.launch import in_rank, maybe_relaunch, topology
from bert_of.plots import FONT, draw, styles
from bert_of.tokenization import vocab_size


def _add_arguments(p):
    p.add_argument("--data", required=True, metavar="DIR",
                   help="OFRecord pretraining data (made by bert-of data create-pretraining)")
    output_option(p, "run directory: metrics.jsonl, checkpoints/, final/", required=True, metavar="DIR")
    p.add_argument("--config", metavar="FILE", help="bert_config.json / config.json of a new model")
    p.add_argument("--init-checkpoint", metavar="NAME_OR_DIR",
                   help="continue pretraining a checkpoint in any format (tf, lazy, hf, ...) or a zoo name")
    p.add_argument("--vocab", metavar="FILE",
                   help="vocab.txt (default: the one the data was made with, else the checkpoint's)")
    option(p, "--max-seq-length", old=("--seq-length",), dest="seq_length", type=int, metavar="N",
           help="tokens per sequence (default: the data's, from its bert_of_data.json)")
    option(p, "--max-predictions-per-seq", old=("--max-predictions",), dest="max_predictions", type=int, metavar="N",
           help="masked positions per sequence (default: the data's)")
    p.add_argument("--mode", choices=("graph", "eager"), default="graph",
                   help="nn.Graph (compiled) or eager execution")
    p.add_argument("--blas", choices=("fast", "exact"), default="fast",
                   help="CPU GEMM kernels: fast = OpenBLAS's AVX2/FMA kernels (3x; OneFlow's bundled "
                        "OpenBLAS misdetects recent Xeons), exact = the detected ones")
    p.add_argument("--optimizer", choices=("adamw", "lamb", "sgd"), default="adamw",
                   help="adamw: Google's AdamWeightDecay (no bias correction, eps 1e-6); lamb; sgd")
    p.add_argument("--lr", type=float, default=1e-4, metavar="LR", help="peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=0, metavar="N", help="linear warmup steps, then linear decay")
    p.add_argument("--steps", type=int, default=1000, metavar="N", help="total optimizer steps (the decay horizon)")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="GLOBAL batch (split over ranks)")
    option(p, "--grad-accum-steps", old=("--grad-accum",), dest="grad_accum", type=int, default=1, metavar="K",
           help="micro-batches per optimizer step")
    p.add_argument("--weight-decay", type=float, default=0.01, metavar="W",
                   help="decoupled weight decay (not on LayerNorm / bias)")
    p.add_argument("--clip-grad-norm", type=float, default=1.0, metavar="C", help="global-norm clip; 0 turns it off")
    p.add_argument("--amp", action="store_true", help="fp16 autocast + dynamic loss scaling (graph, GPU)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="initialisation, shuffling and dropout seed")
    p.add_argument("--no-shuffle", action="store_true", help="read the records in order")
    p.add_argument("--no-dropout", action="store_true", help="dropout off (e.g. to compare runs step by step)")
    p.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="a resumable checkpoint every N steps; 0 = only the final one")
    p.add_argument("--keep", type=int, default=2, metavar="N", help="intermediate checkpoints to keep")
    p.add_argument("--log-every", type=int, default=10, metavar="N", help="a metrics.jsonl record every N steps")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --output from its last checkpoint, exactly")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument("--ddp", action="store_true", help="eager DDP with local tensors instead of global tensors")
    p.add_argument("--zoo-name", metavar="NAME", help="register the final checkpoint in the local zoo under NAME")
    p.add_argument("--stop-after", type=int, default=0, help=argparse.SUPPRESS)
    add_rank_arguments(p)


def _set_blas(args) -> None:
    if "oneflow" not in sys.modules:  # read when OneFlow loads; inherited by relaunched ranks
        os.environ["BERT_OF_BLAS"] = args.blas


def _preflight(args, world: int) -> None:
    """The refusals ``run`` would make on every rank, made once here before ranks start (no OneFlow)."""
    if args.batch_size < 1 or args.batch_size % world:
        raise ConfigError(f"global batch {args.batch_size} is not divisible by {world} ranks")
    if not os.path.isdir(args.data):
        raise ConfigError(f"--data {args.data}: no such directory")
    check_unlocked(os.path.join(args.output, LOCK_NAME), os.path.abspath(args.output))  # a run's one writer
    options = (read_meta(args.data) or {}).get("options", {})
    if not (args.seq_length or options.get("max_seq_length")) or \
            not (args.max_predictions or options.get("max_predictions_per_seq")):
        raise ConfigError(f"{args.data}: no bert_of_data.json: pass --seq-length and --max-predictions")
    checkpoints = os.path.join(args.output, "checkpoints")
    if args.resume:
        if not os.path.isdir(checkpoints) or not any(n.startswith("step-") for n in os.listdir(checkpoints)):
            raise BertOfError(f"{args.output}: nothing to resume (no checkpoints/step-*/trainer_state.json)")
        return
    if os.path.isdir(checkpoints) and not args.overwrite:
        raise BertOfError(f"{args.output}: already holds a run (use --resume to continue or --overwrite)")
    if args.vocab and not os.path.isfile(args.vocab):
        raise ConfigError(f"--vocab {args.vocab}: no such file")
    if args.init_checkpoint:
        return  # the resolver (zoo names, downloads) runs in the ranks
    if not args.config:
        raise ConfigError("pass --config (a new model), --init-checkpoint (continue one) or --resume")
    vocab = args.vocab or dataset_vocab(args.data)
    if not vocab:
        raise ConfigError("no vocab.txt: pass --vocab (the data does not record the one it was made with)")
    limit = read_json(args.config, "model config").get("vocab_size")
    n_vocab = vocab_size(vocab)
    if isinstance(limit, int) and n_vocab > limit:
        raise ConfigError(f"{vocab} has {n_vocab} tokens but the config's vocab_size is {limit}")


def cmd_pretrain(args) -> int:
    _set_blas(args)
    topo = topology(args)
    if topo.world > 1 and not in_rank():
        _preflight(args, topo.world)  # once, here, not once per rank
    code = maybe_relaunch(args)
    if code is not None:
        return code
    from bert_of.pretrain import PretrainOptions, run

    return run(PretrainOptions(**{f.name: getattr(args, f.name) for f in fields(PretrainOptions)}))


PLOT_NAME = "curves.png"


def _metrics_path(run: str) -> str:
    return run if run.endswith(".jsonl") else os.path.join(run, "metrics.jsonl")


def cmd_plot(args) -> int:
    """Loss / accuracy / lr curves of one or more runs (their metrics.jsonl) as a PNG."""
    runs = {}
    for run_dir in args.runs:
        path = _metrics_path(run_dir)
        if not os.path.isfile(path):
            raise BertOfError(f"{path}: no metrics (is {run_dir} a training run?)")
        rows = [r for r in read_jsonl(path, "metrics") if "loss" in r]
        if not rows:
            raise BertOfError(f"{path}: no metrics records")
        name = os.path.basename(os.path.normpath(os.path.dirname(path) if run_dir.endswith(".jsonl") else run_dir))
        while name in runs:
            name += "'"
        runs[name] = rows
    out = args.output or os.path.join(os.path.dirname(_metrics_path(args.runs[0])), PLOT_NAME)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {}
    for name, rows in runs.items():
        curves[f"{name} loss"] = [r["loss"] for r in rows]
        if "mlm_acc" in rows[0]:  # pretraining runs; fine-tuning runs have no accuracies
            curves[f"{name} MLM"] = [r["mlm_acc"] for r in rows]
            curves[f"{name} NSP"] = [r["nsp_acc"] for r in rows]
        curves[f"{name} lr"] = [r["lr"] for r in rows]
    with plt.rc_context(FONT):
        fig, axes = plt.subplots(1, 3, figsize=(16, 5))
        panels = ((axes[0], "loss", ("loss",)), (axes[1], "accuracy", ("MLM", "NSP")), (axes[2], "learning rate", ("lr",)))
        for ax, title, kinds in panels:
            labels = [f"{n} {k}" for k in kinds for n in runs if f"{n} {k}" in curves]
            st = styles({k: curves[k] for k in labels})
            for label in labels:
                steps = [r["step"] for r in runs[label.rsplit(" ", 1)[0]]]
                draw(ax, steps, curves[label], st[label])
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if labels:
                ax.legend()
            else:
                ax.text(0.5, 0.5, "no accuracies (fine-tuning runs)", ha="center", va="center",
                        transform=ax.transAxes, color="0.4")
        fig.tight_layout()
        with atomic_open(out, "wb") as f:
            fig.savefig(f, dpi=110, format="png")
        plt.close(fig)
    print(f"wrote {out}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("pretrain", help="pretrain BERT on OFRecord data (graph/eager, 1+ ranks)",
                       description="OFRecord pretraining data -> a trained bert_of checkpoint in OUTPUT/final "
                                   "(-> the zoo with --zoo-name); graph or eager, 1+ ranks, exact resume. Sequence "
                                   "lengths and the vocabulary default to the data's.",
                       epilog=examples(
                           "bert-of pretrain --data data/ --config bert_config.json -o run/ --steps 1000",
                           "bert-of pretrain --data data/ --config bert_config.json -o run/ --nproc 2 --batch-size 64",
                           "bert-of pretrain --data data/ --init-checkpoint bert-base-uncased -o run/ --lr 2e-5",
                           "bert-of pretrain --data data/ -o run/ --resume        # continue exactly where it stopped",
                           "bert-of plot run/                                   # -> run/curves.png"))
    _add_arguments(p)
    p.set_defaults(fn=cmd_pretrain)
    q = sub.add_parser("plot", help="PNG loss/accuracy/lr curves of training runs",
                       description="Loss, accuracy and learning-rate curves of one or more runs (their "
                                   "metrics.jsonl) in one PNG.",
                       epilog=examples("bert-of plot run/                      # writes run/curves.png",
                                       "bert-of plot run-a/ run-b/ -o compare.png"))
    q.add_argument("runs", nargs="+", metavar="RUN", help="run directories (or metrics.jsonl files)")
    output_option(q, f"the PNG (default: {PLOT_NAME} in the first run's directory)", metavar="FILE",
                  old=("--out",))
    q.set_defaults(fn=cmd_plot)
