"""``bert-of align``: the command line (``python -m bert_of.align`` runs it alone). Cheap to import
(no OneFlow): the runs import :mod:`bert_of.align.runner` when they start."""

from __future__ import annotations

import argparse
import os

from bert_of.align.plans import CONTROL_STEPS, EXPERIMENTS, SIZES, TF_STEPS
from bert_of.align.report import format_summary
from bert_of.cli import run_command

_DOC = ("bert-of align: prove that eager, graph, multi-rank, accumulation and converted checkpoints "
        "train the same.")


def _add_arguments(p):
    p.add_argument("experiments", nargs="+", metavar="EXPERIMENT",
                   help="all, list, or names / numbers: " + ", ".join(f"{n} {m}" for n, m, _, _ in EXPERIMENTS))
    p.add_argument("--steps", type=int, default=1000, help="training steps per run (default 1000); controls run "
                   f"min(steps, {CONTROL_STEPS}), experiment 7 min(steps, {TF_STEPS})")
    p.add_argument("--out", default="align-out", help="report directory (default align-out/)")
    p.add_argument("--size", choices=tuple(SIZES), default="small",
                   help="model/data preset: tiny (tests), small (default: 2 layers, hidden 32, seq 32), mini "
                        "(4 layers, hidden 256, seq 128: for real hardware)")
    p.add_argument("--jobs", type=int, default=1, help="1-process runs in J worker processes (default 1: in this "
                   "process); multi-rank runs always launch their own processes")
    p.add_argument("--data-dir", help="dataset cache (default OUT/data)")
    p.add_argument("--corpus", nargs="+", help="text files for the pretraining data (default: the repository's "
                   "tests/data/text/sample_text.txt and classics.txt)")
    p.add_argument("--vocab", help="vocab.txt for --corpus (default tests/data/text/vocab.txt)")
    p.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    p.add_argument("--perturb-lr", type=float, default=0.0, metavar="REL",
                   help="self-test: train the compared side of every equal comparison with lr x (1 + REL); the "
                        "experiments should then fail")
    p.add_argument("--fresh", action="store_true", help="re-run everything (default: runs finished by an earlier "
                   "invocation with the same spec and code are reused from DATA_DIR/runs/)")
    p.add_argument("--quiet", action="store_true", help="only the summary table")
    p.set_defaults(fn=cmd_align)


def cmd_align(args) -> int:
    if [e.lower() for e in args.experiments] == ["list"]:
        for num, name, title, _ in EXPERIMENTS:
            print(f"{num} {name:<15} {title}")
        return 0
    from bert_of.align.runner import run_experiments

    summary = run_experiments(args.experiments, steps=args.steps, out=args.out, size=args.size, jobs=args.jobs,
                              data_dir=args.data_dir, corpus=args.corpus, vocab=args.vocab, seed=args.seed,
                              perturb_lr=args.perturb_lr, quiet=args.quiet, fresh=args.fresh)
    print(format_summary(summary))
    print(f"reports: {os.path.join(args.out, 'summary.json')}")
    return 0 if summary["passed"] else 1


def add_parser(subparsers):
    """Register ``bert-of align`` on the main command line."""
    p = subparsers.add_parser("align", help="alignment suite: eager/graph/multi-rank/accumulation/TF train the same",
                              description=_DOC + " Writes OUT/EXPERIMENT.json + .png and "
                              "OUT/summary.json; exit 1 if an experiment fails its tolerance.")
    _add_arguments(p)
    return p


def build_parser():
    p = argparse.ArgumentParser(prog="bert-of align", description=_DOC)
    _add_arguments(p)
    return p


def main(argv=None) -> int:
    return run_command(build_parser(), argv)
