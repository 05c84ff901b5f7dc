"""``bert-of pretrain`` and ``bert-of plot``: their command lines. Importing this is cheap (no
OneFlow); ``pretrain`` imports :mod:`bert_of.pretrain` when it runs."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from bert_of.errors import BertOfError, ConfigError
from bert_of.fs import LOCK_NAME, atomic_open, check_unlocked, read_jsonl
from bert_of.launch import is_rank_of, relaunch


def _add_arguments(p):
    p.add_argument("--data", required=True, help="OFRecord pretraining data (bert-of data create-pretraining)")
    p.add_argument("--output", required=True, help="run directory (metrics, checkpoints, final)")
    p.add_argument("--config", help="bert_config.json / config.json for a new model")
    p.add_argument("--init-checkpoint", help="continue pretraining a checkpoint in any format (tf, lazy, hf, ...) "
                                             "or a zoo name")
    p.add_argument("--vocab", help="vocab.txt (default: the checkpoint's)")
    p.add_argument("--seq-length", type=int, help="default: from the data's bert_of_data.json")
    p.add_argument("--max-predictions", type=int, help="default: from the data's bert_of_data.json")
    p.add_argument("--mode", choices=("graph", "eager"), default="graph")
    p.add_argument("--blas", choices=("fast", "exact"), default="fast",
                   help="CPU GEMM kernels: fast = OpenBLAS's AVX2/FMA kernels (3x; OneFlow's bundled "
                        "OpenBLAS misdetects recent Xeons), exact = the detected ones (default: fast)")
    p.add_argument("--optimizer", choices=("adamw", "lamb", "sgd"), default="adamw")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--steps", type=int, default=1000, help="total optimizer steps (the decay horizon)")
    p.add_argument("--batch-size", type=int, default=32, help="GLOBAL batch (split over ranks)")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip-grad-norm", type=float, default=1.0, help="0 turns clipping off")
    p.add_argument("--amp", action="store_true", help="fp16 autocast + dynamic loss scaling (graph, GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--no-dropout", action="store_true")
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--keep", type=int, default=2, help="checkpoints to keep")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--nproc", type=int, default=1, help="ranks on this machine (relaunches itself)")
    p.add_argument("--ddp", action="store_true", help="eager DDP with local tensors instead of global tensors")
    p.add_argument("--zoo-name", help="register the final checkpoint in the local zoo under this name")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--stop-after", type=int, default=0, help=argparse.SUPPRESS)


def _set_blas(args) -> None:
    if "oneflow" not in sys.modules:  # read when OneFlow loads; inherited by relaunched ranks
        os.environ["BERT_OF_BLAS"] = args.blas


def cmd_pretrain(args) -> int:
    _set_blas(args)
    if args.nproc > 1 and not is_rank_of(args.nproc):
        if args.batch_size % args.nproc:  # say it once here, not once per rank
            raise ConfigError(f"global batch {args.batch_size} is not divisible by {args.nproc} ranks")
        check_unlocked(os.path.join(args.output, LOCK_NAME), os.path.abspath(args.output))  # a run's one writer
        return relaunch(args.argv, args.nproc)
    from bert_of.pretrain import PretrainOptions, run

    return run(PretrainOptions(**{f.name: getattr(args, f.name) for f in fields(PretrainOptions)}))


def cmd_plot(args) -> int:
    """Loss / accuracy / lr curves of one or more runs (their metrics.jsonl) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {}
    for run_dir in args.runs:
        path = run_dir if run_dir.endswith(".jsonl") else os.path.join(run_dir, "metrics.jsonl")
        if not os.path.isfile(path):
            raise BertOfError(f"{path}: no metrics (is {run_dir} a training run?)")
        rows = [r for r in read_jsonl(path, "metrics") if "loss" in r]
        if not rows:
            raise BertOfError(f"{path}: no metrics records")
        runs[os.path.basename(os.path.normpath(run_dir))] = rows
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, rows in runs.items():
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["loss"] for r in rows], label=name)
        if "mlm_acc" in rows[0]:  # pretraining runs; fine-tuning runs have no accuracies
            axes[1].plot(steps, [r["mlm_acc"] for r in rows], label=f"{name} MLM")
            axes[1].plot(steps, [r["nsp_acc"] for r in rows], "--", label=f"{name} NSP")
        axes[2].plot(steps, [r["lr"] for r in rows], label=name)
    for ax, title in zip(axes, ("loss", "accuracy", "learning rate")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_open(args.out, "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    print(f"wrote {args.out}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("pretrain", help="pretrain BERT on OFRecord data (graph/eager, 1+ ranks)",
                       description="OFRecord pretraining data -> a trained bert_of checkpoint (-> the zoo); "
                                   "graph or eager, 1+ ranks, exact resume.")
    _add_arguments(p)
    p.set_defaults(fn=cmd_pretrain)
    q = sub.add_parser("plot", help="PNG loss/accuracy/lr curves of pretraining runs")
    q.add_argument("runs", nargs="+", help="run directories (or metrics.jsonl files)")
    q.add_argument("--out", default="loss.png")
    q.set_defaults(fn=cmd_plot)
