"""``bert-of``: one command, subcommands for every job.

    bert-of convert tf2of SRC -o DST [--verify] [--with-optimizer]
    bert-of verify A B [-o REPORT]
    bert-of inspect PATH [--json]

The grammar every subcommand follows (flags, help, common options) is :mod:`bert_of.cli_grammar`.

Errors in the user's input print one line and exit 1; nothing half-written is
left behind (writers go through temp paths and renames). Anything unexpected is a
bug: it prints one line saying so; ``--debug`` (or ``BERT_OF_DEBUG=1``) shows the
traceback. Ctrl-C and SIGTERM remove what the command was writing, print one line
and end the process by that signal (the shell sees 130 / 143).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

import bert_of.runtime.process as process

if __name__ == "__main__":  # python -m bert_of.cli: set up before the imports below load native libraries
    process.setup()

from bert_of.cli_grammar import HelpFormatter, Parser, configure, examples, finish  # noqa: E402
from bert_of.errors import BertOfError, NeedsOneFlow
from bert_of.version import __version__


def _err(msg: str) -> int:
    print(f"bert-of: error: {msg}", file=sys.stderr)
    return 1


# --------------------------------------------------------------------------- main


TOP_EXAMPLES = examples(
    "bert-of convert tf2of uncased_L-12_H-768_A-12/ -o bert-base-of/ --verify   # Google TF1 -> bert_of, checked",
    "bert-of zoo download bert-base-uncased                                     # a released checkpoint, verified",
    "bert-of data create-pretraining --input corpus.txt --vocab vocab.txt -o data/",
    "bert-of pretrain --data data/ --config bert_config.json -o run/ --nproc 2   # vocab: the data's",
    "bert-of finetune squad --model bert-base-uncased --train train-v1.1.json -o squad-model/",
    "bert-of eval squad --model squad-model/ --data dev-v1.1.json               # predict, score, record",
    "bert-of results",
    "",
    "Every command: -q (errors only), -v (debug), --no-progress, --debug; `bert-of COMMAND --help` for more.")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="bert-of", formatter_class=HelpFormatter, epilog=TOP_EXAMPLES,
                                description="BERT checkpoints across TF1, OneFlow, HuggingFace and Keras, moved "
                                            "without changing a number; pretraining, fine-tuning and SQuAD/GLUE "
                                            "scores on OneFlow.")
    p.add_argument("--version", action="version", version=f"bert-of {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    importlib.import_module("bert_of.converters.cli").add_parser(sub)  # convert, verify, inspect

    # Subcommands owned by other packages (zoo, eval, ...) register themselves.
    # Their parsers are cheap to import (no OneFlow); a command imports its implementation when it runs.
    for mod in ("bert_of.zoo.cli", "bert_of.eval.cli", "bert_of.data.cli", "bert_of.pretraining.cli",
                "bert_of.finetuning.cli", "bert_of.align.cli", "bert_of.selftest.cli"):
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod).add_parser(sub)
    return finish(p)


DEBUG_ENV = "BERT_OF_DEBUG"


def _debug(args) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def dispatch(args) -> int:
    """Run a parsed subcommand. bert_of's errors and I/O errors become one line on stderr and exit
    status 1; Ctrl-C / SIGTERM one line and 130 / 143 (see :mod:`bert_of.runtime.process`); a
    reader leaving the pipe (`bert-of ... | head`) is not an error. Anything else is a bug in
    bert_of: one line says so and how to see the traceback (``--debug`` or ``BERT_OF_DEBUG=1``,
    which re-raise)."""
    process.setup()
    try:
        with process.command():
            configure(args)
            return args.fn(args)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated); the with-blocks have cleaned up
        return process.stopped(e, getattr(args, "interrupt_note", ""))
    except NeedsOneFlow:  # the oneflow extra is not installed: say which command needs it
        return _err(str(NeedsOneFlow(_command_name(args))))
    except BertOfError as e:
        return _err(" ".join(str(e).split("\n")))
    except BrokenPipeError:
        return 0
    except OSError as e:  # unreadable input, unwritable output, disk full
        if _debug(args):
            raise
        what = (e.strerror or str(e) or type(e).__name__).splitlines()[0]
        if e.filename:
            return _err(f"{e.filename}: {what}")
        return _err(f"I/O error: {what} (run with --debug or {DEBUG_ENV}=1 to see where)")
    except MemoryError:
        if _debug(args):
            raise
        return _err("out of memory (run with --debug or BERT_OF_DEBUG=1 to see where)")
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, never a traceback
        if _debug(args):
            raise
        return _internal(e)


def _command_name(args) -> str:
    """``finetune squad`` for ``bert-of finetune squad ...`` (the parser's prog, set by add_command)."""
    prog = getattr(args, "command_prog", None) or getattr(args, "command", None) or "this command"
    return prog.split(" ", 1)[1] if prog.startswith("bert-of ") else prog


def run_command(parser: argparse.ArgumentParser, argv=None, debug: bool = False) -> int:
    """A command line's whole life: signals handled from the start, parse, :func:`dispatch`; a
    command stopped by a signal ends the process by that signal (it does not return)."""
    process.setup()
    args = parse(parser, argv)
    if debug:
        args.debug = True
    return process.end_if_stopped(dispatch(args))


def _internal(e: Exception) -> int:
    what = (str(e).splitlines() or [""])[0][:200]
    return _err(f"internal error (a bug in bert_of, please report it): {type(e).__name__}"
                f"{': ' + what if what else ''}; run with --debug or {DEBUG_ENV}=1 to see the traceback")


def _take_debug(argv):
    """``--debug`` is accepted anywhere on the command line (before or after the subcommand)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    return [a for a in argv if a != "--debug"], debug


def repeated_list_flags_append(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make every list flag (``nargs`` + or *) of ``parser`` and its subcommands add up when
    repeated: ``--input a --input b`` means both files. argparse's plain "store" keeps only the
    last list, silently. (Flags with a default list keep "store": extending would add to it.)"""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                repeated_list_flags_append(sub)
        elif type(action) is argparse._StoreAction and action.option_strings and action.nargs in ("+", "*") \
                and action.default is None:
            action.__class__ = argparse._ExtendAction  # same fields; __call__ extends the list
    return parser


def parse(parser: argparse.ArgumentParser, argv=None):
    """Parsed arguments; ``args.argv`` keeps the command line (``--nproc`` runs it again as ranks)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = finish(repeated_list_flags_append(parser)).parse_args(argv)
    args.argv = argv
    return args


def main(argv=None) -> int:
    """``bert-of``: the process is set up for a command (bert_of.runtime.process), then the command line runs."""
    process.setup()
    argv, debug = _take_debug(argv)
    try:
        parser = build_parser()
    except Exception as e:  # noqa: BLE001 - e.g. a broken optional dependency of a subcommand
        if debug or _debug(None):
            raise
        return _internal(e)
    return run_command(parser, argv, debug)


if __name__ == "__main__":  # python -m bert_of.cli: run the imported module, whose state the sub-CLIs share
    from bert_of.cli import main as _main

    sys.exit(_main())
