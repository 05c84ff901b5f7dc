"""``bert-of align``: the command line. Cheap to import
(no OneFlow): the runs import :mod:`bert_of.align.runner` when they start."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bert_of.align.plans import CONTROL_STEPS, EXPERIMENTS, SIZES, TF_STEPS
from bert_of.align.report import format_summary, plot_report, plot_skipped
from bert_of.cli_grammar import add_options, examples
from bert_of.errors import BertOfError
from bert_of.files.reading import read_json
from bert_of.launch import topology
from bert_of.options import Nodes, arg, from_args

_DOC = ("bert-of align: prove that eager, graph, multi-rank, accumulation and converted checkpoints "
        "train the same.")


EXAMPLES = examples("bert-of align list                              # the experiments",
                    "bert-of align all --steps 1000 -o docs/align      # everything (~25 min on 2 cores)",
                    "bert-of align eager-graph data-parallel --steps 30 --size tiny -o align-out",
                    "bert-of align 3 5 --jobs 2",
                    "bert-of align all -o docs/align --replot          # redraw the plots from the reports")


@dataclass(kw_only=True)
class AlignOptions:
    """``bert-of align``."""

    experiments: list = arg(positional=True, metavar="EXPERIMENT",
                            help="all, list, or names / numbers: " + ", ".join(f"{n} {m}" for n, m, _, _ in EXPERIMENTS))
    steps: int = arg(1000, metavar="N", help=f"training steps per run; controls run min(steps, {CONTROL_STEPS}), "
                                             f"experiment 7 min(steps, {TF_STEPS})")
    output: str = arg("align-out", short="-o", metavar="DIR",
                      help="report directory: EXPERIMENT.json + .png, summary.json, README.md")
    size: str = arg("small", choices=tuple(SIZES),
                    help="model/data preset: tiny (tests), small (2 layers, hidden 32, seq 32), mini (4 layers, "
                         "hidden 256, seq 128: for real hardware)")
    jobs: int = arg(1, metavar="J", help="1-process runs in J worker processes (1: in this process); multi-rank runs "
                                         "always launch their own processes")
    data_dir: str | None = arg(None, metavar="DIR", help="dataset and finished-run cache (unset: OUTPUT/data)")
    corpus: list = arg(default_factory=list, nargs="+", metavar="FILE",
                       help="text files for the pretraining data (unset: the small corpus the "
                            "package ships beside bert_of/align)")
    vocab: str | None = arg(None, metavar="FILE", help="vocab.txt for --corpus (unset: the one of the package's corpus)")
    data: str | None = arg(None, metavar="DIR_OR_GLOB", help="existing pretraining records instead of --corpus: "
                                                              "OFRecord, TFRecord or HDF5 (docs/data.md), of the "
                                                              "--size's lengths; --vocab is theirs")
    seed: int = arg(0, metavar="S", help="initialisation seed")
    perturb_lr: float = arg(0.0, metavar="REL", help="self-test: train the compared side of every equal comparison "
                                                     "with lr x (1 + REL); the experiments should then fail")
    replot: bool = arg(False, help="only redraw OUTPUT/EXPERIMENT.png from the reports already in OUTPUT (no "
                                   "training)")
    fresh: bool = arg(False, help="re-run everything (unset: runs finished by an earlier invocation with the same "
                                  "spec and code are reused from DATA_DIR/runs/)")
    nodes: Nodes = field(default_factory=Nodes)  # multi-rank runs over several machines: same OUTPUT on each
    quiet: bool = False  # the common -q


def _add_arguments(p):
    add_options(p, AlignOptions)
    p.set_defaults(fn=cmd_align)


def cmd_align(args) -> int:
    args = from_args(AlignOptions, args, quiet=getattr(args, "quiet", False))
    if [e.lower() for e in args.experiments] == ["list"]:
        for num, name, title, _ in EXPERIMENTS:
            print(f"{num} {name:<15} {title}")
        return 0
    if args.replot:
        return replot(args.output, args.experiments)
    from bert_of.align.runner import follow, run_experiments

    nodes = topology(args.nodes, nproc=1)
    if nodes.node_rank > 0:  # node 0 runs the suite; this node lends its ranks to the multi-rank runs
        return follow(args.output, nodes, quiet=args.quiet)
    summary = run_experiments(args.experiments, steps=args.steps, out=args.output, size=args.size, jobs=args.jobs,
                              data_dir=args.data_dir, corpus=args.corpus or None, vocab=args.vocab, seed=args.seed,
                              perturb_lr=args.perturb_lr, quiet=args.quiet, fresh=args.fresh,
                              nodes=nodes if nodes.nnodes > 1 else None, data=args.data)
    print(format_summary(summary))
    print(f"reports: {os.path.join(args.output, 'summary.json')}")
    return 0 if summary["passed"] else 1


def replot(out: str, experiments: list) -> int:
    """Redraw the plots of the reports in ``out`` (all, or the named experiments)."""
    wanted = {e.lower() for e in experiments} - {"all"}
    done = 0
    for num, name, _, _ in EXPERIMENTS:
        path = os.path.join(out, f"{name}.json")
        if (wanted and name not in wanted and str(num) not in wanted) or not os.path.isfile(path):
            continue
        rep = read_json(path, "align report")
        (plot_skipped if rep.get("status") in ("skipped", "error") else plot_report)(rep, path[:-5] + ".png")
        print(f"wrote {path[:-5]}.png")
        done += 1
    if not done:
        raise BertOfError(f"{out}: no reports to replot")
    return 0


def add_parser(subparsers):
    """Register ``bert-of align`` on the main command line."""
    p = subparsers.add_parser("align", help="alignment suite: eager/graph/multi-rank/accumulation/TF train the same",
                              description=_DOC + " Writes OUTPUT/EXPERIMENT.json + .png and "
                              "OUTPUT/summary.json; exit 1 if an experiment fails its tolerance. -q: only the "
                              "summary table.", epilog=EXAMPLES)
    _add_arguments(p)
    return p
