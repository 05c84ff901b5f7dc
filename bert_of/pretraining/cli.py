"""``bert-of pretrain`` and ``bert-of plot``: their command lines. Importing this is cheap (no
OneFlow); ``pretrain`` imports :mod:`bert_of.pretraining.run` when it runs."""

from __future__ import annotations

import glob
import os
import sys
import types
from dataclasses import dataclass

import bert_of.runtime.process as process
from bert_of.cli_grammar import add_command
from bert_of.data.layout import dataset_vocab
from bert_of.errors import BertOfError, ConfigError
from bert_of.files.atomic import atomic_open, read_jsonl
from bert_of.files.locks import check_unlocked, LOCK_NAME
from bert_of.files.reading import read_json
from bert_of.launch import in_rank, maybe_relaunch, topology
from bert_of.options import TrainConfig, arg, from_args, resume_from_record
from bert_of.plots import FONT, draw, pyplot, styles
from bert_of.pretraining.options import PretrainOptions, check_vocab, with_data_lengths

def options(args) -> PretrainOptions:
    """The options of a parsed ``bert-of pretrain``; a ``--resume`` takes the run's record and lays
    what this command line gives on top (refusing a change a resume cannot make)."""
    quiet = getattr(args, "quiet", False)
    opts = from_args(PretrainOptions, args, quiet=quiet)
    if not opts.resume:
        return opts
    return resume_from_record(PretrainOptions, opts.output, args, what="bert-of pretrain", quiet=quiet, resume=True)


def _set_blas(opts) -> None:
    if opts.blas and "oneflow" not in sys.modules:  # read when OneFlow loads; inherited by relaunched ranks
        process.set_environ({"BERT_OF_BLAS": opts.blas})


def preflight(opts: PretrainOptions, world: int) -> PretrainOptions:
    """The refusals of a run, made once before it starts (no OneFlow; before the ranks start when
    there are several), and the options with the data's sequence lengths."""
    if opts.batch_size < 1 or opts.batch_size % world:
        raise ConfigError(f"global batch {opts.batch_size} is not divisible by {world} ranks")
    TrainConfig.of(opts).check()
    if not os.path.isdir(opts.data) and not glob.glob(opts.data):
        raise ConfigError(f"--data {opts.data}: no such directory, and no files match it as a pattern")
    check_unlocked(os.path.join(opts.output, LOCK_NAME), os.path.abspath(opts.output))  # a run's one writer
    opts = with_data_lengths(opts)
    if opts.resume:  # the run directory says what it holds (RunDir.open, in the run)
        return opts
    if opts.vocab and not os.path.isfile(opts.vocab):
        raise ConfigError(f"--vocab {opts.vocab}: no such file")
    if opts.init_checkpoint:
        return opts  # the resolver (zoo names, downloads) runs where the model loads
    if not opts.config:
        raise ConfigError("pass --config (a new model), --init-checkpoint (continue one) or --resume")
    vocab = opts.vocab or dataset_vocab(opts.data)
    if not vocab:
        raise ConfigError(f"no vocab.txt: {opts.data} does not record the one it was made with; pass --vocab")
    check_vocab(vocab, read_json(opts.config, "model config").get("vocab_size"))
    return opts


def cmd_pretrain(args) -> int:
    opts = options(args)
    _set_blas(opts)
    topo = topology(opts.ranks)
    opts = preflight(opts, topo.world) if not in_rank() else with_data_lengths(opts)  # once, not once per rank
    code = maybe_relaunch(types.SimpleNamespace(argv=args.argv, **vars(opts.ranks)))
    if code is not None:
        return code
    from bert_of.pretraining.run import run

    return run(opts)


PLOT_NAME = "curves.png"


def _metrics_path(run: str) -> str:
    return run if run.endswith(".jsonl") else os.path.join(run, "metrics.jsonl")


@dataclass(kw_only=True)
class PlotOptions:
    """``bert-of plot``."""

    runs: list = arg(positional=True, metavar="RUN", help="run directories (or metrics.jsonl files)")
    output: str | None = arg(None, short="-o", metavar="FILE",
                             help=f"the PNG (unset: {PLOT_NAME} in the first run's directory)")


def cmd_plot(args) -> int:
    """Loss / accuracy / lr curves of one or more runs (their metrics.jsonl) as a PNG."""
    args = from_args(PlotOptions, args)
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
    plt = pyplot()

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
    add_command(sub, "pretrain", cmd_pretrain, PretrainOptions,
                help="pretrain BERT on OFRecord data (graph/eager, 1+ ranks)",
                description="OFRecord pretraining data -> a trained bert_of checkpoint in OUTPUT/final "
                            "(-> the zoo with --zoo-name); graph or eager, 1+ ranks, exact resume. Sequence "
                            "lengths and the vocabulary default to the data's.",
                example_lines=(
                    "bert-of pretrain --data data/ --config bert_config.json -o run/ --steps 1000",
                    "bert-of pretrain --data data/ --config bert_config.json -o run/ --nproc 2 --batch-size 64",
                    "bert-of pretrain --data data/ --init-checkpoint bert-base-uncased -o run/ --lr 2e-5",
                    "bert-of pretrain --data data/ -o run/ --resume        # continue exactly where it stopped",
                    "bert-of pretrain --data data/ -o run/ --resume --steps 2000   # ... and train longer",
                    "bert-of plot run/                                   # -> run/curves.png"))
    add_command(sub, "plot", cmd_plot, PlotOptions, help="PNG loss/accuracy/lr curves of training runs",
                description="Loss, accuracy and learning-rate curves of one or more runs (their "
                            "metrics.jsonl) in one PNG.",
                example_lines=("bert-of plot run/                      # writes run/curves.png",
                               "bert-of plot run-a/ run-b/ -o compare.png"))
