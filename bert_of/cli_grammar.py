"""One grammar for every ``bert-of`` command line: the same flag for the same concept, help with
defaults and examples, and the options every command takes (-q, -v, --no-progress, --debug).

A command's parser is generated from its options dataclass (:func:`add_options`, fields made
with :func:`bert_of.options.arg`); :class:`HelpFormatter` shows the defaults and :func:`examples`
writes the epilog. :func:`finish` walks the finished parser tree and adds the common options to every
command; :func:`configure` applies them before a command runs. ``GRAMMAR`` is the table the
README shows and ``tests/test_cli.py`` enforces.
"""

from __future__ import annotations

import argparse
import textwrap
import typing
from dataclasses import MISSING, fields

from bert_of.options import flag_of, help_of, nested, required_in, shown_in
from bert_of.progress import DISABLE_ENV, allow_bars, bars_enabled, setup_logging

# (flag, meaning, where): one spelling per concept, the same wherever it appears.
GRAMMAR = [
    ("-o, --output", "where the command writes: a folder (checkpoint, run, dataset, predictions) or a file "
                     "(plot, JSON report, scores)",
     "convert, verify, pretrain, plot, finetune, predict, eval, align, data create-pretraining"),
    ("--model", "the checkpoint to run or score: a folder in any format or a zoo name", "finetune, predict, eval"),
    ("--name", "the model's label: results table (finetune, eval), registry entry (zoo add)", "finetune, eval, zoo add"),
    ("--data", "input data: pretraining records, OFRecord / TFRecord / HDF5 folder or glob (pretrain, align), "
               "labeled or unlabeled file (predict, eval)",
     "pretrain, align, predict, eval"),
    ("--predictions", "a predictions file to score", "eval squad-score, eval glue-score"),
    ("--max-seq-length", "tokens per sequence, [CLS]/[SEP] included", "data, pretrain, finetune, predict, eval, verify"),
    ("--max-predictions-per-seq", "masked positions per sequence", "data, pretrain"),
    ("--grad-accum-steps", "micro-batches per optimizer step", "pretrain, finetune"),
    ("--steps", "optimizer steps to train", "pretrain, finetune, align"),
    ("--batch-size", "the global batch (all ranks together)", "pretrain, finetune"),
    ("--lr --seed --log-every --save-every --resume --mode --amp --nproc --vocab --config --task --json",
     "one meaning wherever they appear", "pretrain, finetune, predict, eval, align, convert, inspect, zoo"),
    ("--overwrite", "replace an existing output", "every command that writes"),
    ("--squad-version", "read / score SQuAD as 1.1 or 2.0", "eval squad-score, finetune/predict/eval squad"),
    ("-q, --quiet", "errors only: no notes, no progress", "every command"),
    ("-v, --verbose", "debug messages too (convert: every tensor in the report)", "every command"),
    ("--no-progress", "no progress bars (as BERT_OF_DISABLE_PROGRESS_BARS=1); bars show only on a terminal, "
                      "logs get a plain line every BERT_OF_PROGRESS_EVERY seconds (10)", "every command"),
    ("--debug", "the traceback of an unexpected error (as BERT_OF_DEBUG=1)", "every command"),
    ("--version", "print bert-of's version", "bert-of"),
]


def grammar_markdown() -> str:
    """GRAMMAR as the README's table."""
    rows = ["| flag | meaning | commands |", "|---|---|---|"]
    for flag, meaning, where in GRAMMAR:
        rows.append(f"| `{flag}` | {meaning} | {where} |")
    return "\n".join(rows)


DEBUG_HELP = "show the traceback of an unexpected error (also: BERT_OF_DEBUG=1)"


class HelpFormatter(argparse.HelpFormatter):
    """Prose paragraphs wrapped, indented blocks (examples, tables) kept as written; every option's
    default shown (an option made from a field (:func:`add_options`) shows its field's)."""

    def _fill_text(self, text, width, indent):
        out = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if len(lines) > 1 and all(ln.startswith("  ") or ln.endswith(":") for ln in lines):
                out.append("\n".join(indent + ln for ln in lines))  # a block: examples, environment
            else:
                out.append(textwrap.fill(" ".join(para.split()), width, initial_indent=indent,
                                         subsequent_indent=indent, break_on_hyphens=False))
        return "\n\n".join(out)

    def _get_help_string(self, action):
        text = action.help or ""
        d = getattr(action, "field_default", action.default)
        if not action.option_strings or "default" in text.lower() or d is None or isinstance(d, bool) \
                or d is argparse.SUPPRESS or d == [] or isinstance(action, (argparse._StoreConstAction,
                                                                            argparse._HelpAction)):
            return text
        shown = str(d).replace("%", "%%")  # the help is a %-format
        return f"{text} (default: {shown})"

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _kind(hint) -> tuple:
    """(element type, repeatable) of a field's annotation: ``int | None`` -> (int, False), ``list`` -> (str, True)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = args[0]
    if base is list or typing.get_origin(base) is list:
        inner = typing.get_args(base)
        return (inner[0] if inner else str), True
    return base, False


def _group(p, title):
    if not title:
        return p
    for g in p._action_groups:
        if g.title == title:
            return g
    return p.add_argument_group(title)


def add_options(p, cls, command: str | None = None, _group_of=None) -> None:
    """The options of dataclass ``cls`` (fields made with :func:`bert_of.options.arg`) that ``command``
    shows, on parser ``p``. An option not given is absent from the parsed namespace (argparse's
    ``SUPPRESS``): :func:`bert_of.options.from_args` takes the field's default and a command can tell
    what the user said (``--resume`` compares only those). The help shows the field's default."""
    if _group_of is None:
        p.options = (cls, command)  # what the parser was made from (tests/test_cli.py checks the two agree)
    hints = typing.get_type_hints(cls)
    own = cls.__dict__.get("__annotations__", {})  # a command's own options first, then what it extends
    for f in sorted(fields(cls), key=lambda f: f.name not in own):
        if nested(f) is not None:
            add_options(p, nested(f), command, _group_of=cls)
            continue
        if not shown_in(f, command, cls):
            continue
        md = f.metadata
        g = _group(p, md.get("group"))
        base, many = _kind(hints[f.name])
        required = required_in(f, command)
        kw = {"help": help_of(f, command)}
        for k in ("metavar", "choices"):
            if md.get(k) is not None:
                kw[k] = md[k]
        if md.get("positional"):  # a list: one or more
            a = g.add_argument(f.name, type=base if base is not str else None, **({"nargs": "+"} if many else {}),
                               **kw)
            a.field_default = None
            continue
        flags = [s for s in (md.get("short"), flag_of(f)) if s]
        if base is bool:
            off = md.get("off")
            if off:  # a tri-state: on, off, or unset (None: the command decides)
                ex = g.add_mutually_exclusive_group()
                a = ex.add_argument(*flags, dest=f.name, action="store_true", default=argparse.SUPPRESS, **kw)
                ex.add_argument(off[0], dest=f.name, action="store_false", default=argparse.SUPPRESS, help=off[1])
            else:
                a = g.add_argument(*flags, dest=f.name, action="store_true", default=argparse.SUPPRESS, **kw)
        elif many:  # repeatable; with nargs "+" in the field also several values after one flag
            a = g.add_argument(*flags, dest=f.name, action="extend" if md.get("nargs") else "append",
                               type=base if base is not str else None, default=argparse.SUPPRESS, required=required,
                               **({"nargs": md["nargs"]} if md.get("nargs") else {}), **kw)
        else:
            a = g.add_argument(*flags, dest=f.name, type=base if base is not str else None, required=required,
                               default=argparse.SUPPRESS, **kw)
        a.field_default = None if f.default is MISSING else f.default


def add_command(sub, name: str, fn, options, *, help: str, description: str | None = None,
                example_lines: tuple = (), command: str | None = None, **defaults):
    """Sub-command ``name`` on subparsers ``sub``: its help line, description and :func:`examples`,
    the options of dataclass ``options`` that ``command`` shows (see :func:`add_options`), and ``fn``
    (plus ``defaults``) set on what it parses. Returns the parser."""
    if isinstance(example_lines, str):  # one example: ("bert-of ...") is a string, not a tuple
        example_lines = (example_lines,)
    p = sub.add_parser(name, help=help, description=description,
                       epilog=examples(*example_lines) if example_lines else None)
    add_options(p, options, command)
    p.set_defaults(fn=fn, command_prog=p.prog, **defaults)
    return p


def examples(*lines: str) -> str:
    """An epilog: ``examples:`` and one command per line (``#`` starts a comment)."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)



def subparsers(p):
    """The subparsers action of a parser, or None."""
    return next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)


def walk(p, path=()):
    """(command path, parser) for ``p`` and every parser below it."""
    yield path, p
    sub = subparsers(p)
    if sub is not None:
        seen = set()
        for name, child in sub.choices.items():
            if id(child) not in seen:  # aliases share a parser
                seen.add(id(child))
                yield from walk(child, path + (name,))


def _add_common(p, top: bool) -> None:
    """-q / -v / --no-progress / --debug on ``p`` (below the top level they default to "not given",
    so ``bert-of -q convert ...`` and ``bert-of convert ... -q`` mean the same)."""
    unset = {} if top else {"default": argparse.SUPPRESS}
    have = p._option_string_actions
    g = p.add_argument_group("output control") if not top else p
    if "-q" not in have and "--quiet" not in have:
        g.add_argument("-q", "--quiet", action="store_true", help="errors only: no notes, no progress", **unset)
    if "-v" not in have and "--verbose" not in have:
        g.add_argument("-v", "--verbose", action="store_true", help="debug messages too", **unset)
    if "--no-progress" not in have:
        g.add_argument("--no-progress", action="store_true", help=f"no progress bars (as {DISABLE_ENV}=1; "
                       "bars show only on a terminal)", **unset)
    if "--debug" not in have:
        g.add_argument("--debug", action="store_true", help=DEBUG_HELP, **unset)


def finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The common options and the help formatter on ``parser`` and every command below it."""
    if getattr(parser, "_bert_of_finished", False):
        return parser
    for path, p in walk(parser):
        p.formatter_class = HelpFormatter
        p.allow_abbrev = False  # one spelling per option: no prefix of it stands for it
        _add_common(p, top=not path)
    parser._bert_of_finished = True
    return parser


def configure(args) -> None:
    """Apply the common options of a parsed command line: logging level, progress bars."""
    quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", False)
    setup_logging(-1 if quiet else 1 if verbose else 0)
    allow_bars(not getattr(args, "no_progress", False))
    if not bars_enabled():
        args.no_progress = True  # commands drawing a bar of their own draw none either


__all__ = ["GRAMMAR", "HelpFormatter", "add_options", "configure", "examples", "finish", "grammar_markdown", "walk"]
