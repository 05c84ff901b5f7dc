"""``bert-of selftest``: its command line. Cheap to import (no OneFlow); the checks are
:mod:`bert_of.selftest.checks`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from bert_of.cli_grammar import add_command
from bert_of.files.atomic import atomic_write
from bert_of.options import arg, from_args


@dataclass(kw_only=True)
class SelftestOptions:
    """``bert-of selftest``."""

    steps: int = arg(50, metavar="N", help="align amp steps")
    quick: bool = arg(False, help="skip the throughput measurements")
    output: str | None = arg(None, short="-o", metavar="FILE", help="also write the JSON summary to this file")


def cmd_selftest(args) -> int:
    from bert_of.selftest.checks import selftest

    args = from_args(SelftestOptions, args)
    summary = selftest(steps=args.steps, quick=args.quick)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.output:
        atomic_write(args.output, text + "\n")
    if not summary["cuda"]:
        print("selftest: CUDA is not available: ran the CPU parts only (verify, kernels, graph_launch, blas)", file=sys.stderr)
    if not summary["ok"]:
        failed = [k for k, c in summary["checks"].items() if c["status"] == "fail"]
        print(f"bert-of: error: selftest failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    add_command(sub, "selftest", cmd_selftest, SelftestOptions,
                help="check this machine in one command (every CUDA path on a GPU machine)",
                description="verify (cpu, cuda) vs the TF reference, fused CUDA kernels vs the CPU formulas, "
                            "align amp, BERT-base samples/s (fp32/AMP, eager/graph, 2-GPU global vs DDP). "
                            "One JSON summary on stdout; exit 1 if a check fails. Without CUDA: the CPU "
                            "parts, exit 0.",
                example_lines=("bert-of selftest", "bert-of selftest --quick -o selftest.json"))
