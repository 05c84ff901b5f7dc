"""One grammar for every ``bert-of`` command line: the same flag for the same concept, help with
defaults and examples, and the options every command takes (-q, -v, --no-progress, --debug).

A command's parser is generated from its options dataclass (:func:`add_options`, fields made
with :func:`bert_of.options.arg`); :class:`HelpFormatter` shows the defaults and :func:`examples`
writes the epilog. :func:`finish` walks the finished parser tree and adds the common options to every
command; :func:`configure` applies them before a command runs. ``GRAMMAR`` is the table the
docs/command-line.md shows and ``tests/integration/test_cli.py`` enforces.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
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
    ("--max-seq-length", "tokens per sequence, [CLS]/[SEP] included (finetune, predict, eval: the cap; each batch "
                         "is padded to its longest row unless `--pad-to-max-length`)",
     "data, pretrain, finetune, predict, eval, verify"),
    ("--engine", "what runs the model: `oneflow` (the default) or `onnxruntime` (the `onnx` extra: the checkpoint's "
                 "ONNX graph as `convert of2onnx` writes it, built in memory, nothing written; CPU, one process; the "
                 "same predictions within 1e-5, tested); `--mode`, `--device cuda` and ranks are OneFlow's and "
                 "refused with it ([evaluation.md](evaluation.md), \"Engines\")", "predict, eval"),
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
    """GRAMMAR as docs/command-line.md's table."""
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
        p.options = (cls, command)  # what the parser was made from (tests/integration/test_cli.py checks the two agree)
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


# The anchors' spellings (google-research/bert's run_*.py flags, NVIDIA's DeepLearningExamples BERT
# scripts, transformers' TrainingArguments and examples) -> ours, in order of preference; the first the command has is suggested. A spelling that
# is ours with "_" for "-" (--max_seq_length, --do_lower_case) needs no entry.
ANCHOR_FLAGS = {
    "--learning_rate": ("--lr",), "--num_train_epochs": ("--epochs",), "--output_dir": ("--output",),
    "--output_file": ("--output",), "--model_name_or_path": ("--model",), "--model_name": ("--model",),
    "--init_checkpoint": ("--init-checkpoint", "--model"), "--input_file": ("--input", "--data", "--train"),
    "--train_file": ("--train",), "--predict_file": ("--data", "--eval-data"),
    "--validation_file": ("--eval-data", "--data"), "--eval_file": ("--eval-data", "--data"),
    "--train_batch_size": ("--batch-size",), "--per_device_train_batch_size": ("--batch-size",),
    "--per_gpu_train_batch_size": ("--batch-size",), "--predict_batch_size": ("--predict-batch-size",),
    "--eval_batch_size": ("--predict-batch-size",), "--per_device_eval_batch_size": ("--predict-batch-size",),
    "--vocab_file": ("--vocab",), "--bert_config_file": ("--config", "--model"), "--config_name": ("--config",),
    "--config_file": ("--config",), "--num_train_steps": ("--steps",), "--max_steps": ("--steps",),
    "--num_warmup_steps": ("--warmup-steps", "--warmup-proportion"), "--warmup_ratio": ("--warmup-proportion",),
    "--warmup_steps": ("--warmup-steps", "--warmup-proportion"),
    "--save_checkpoints_steps": ("--save-every",), "--save_steps": ("--save-every",),
    "--logging_steps": ("--log-every",), "--iterations_per_loop": ("--log-every",),
    "--gradient_accumulation_steps": ("--grad-accum-steps",), "--overwrite_output_dir": ("--overwrite",),
    "--task_name": ("--task",), "--fp16": ("--amp",), "--use_fp16": ("--amp",), "--bf16": ("--amp",),
    "--version_2_with_negative": ("--squad-version",), "--random_seed": ("--random-seed", "--seed"),
    "--weight_decay_rate": ("--weight-decay",), "--adam_epsilon": ("--adam-eps",),
    "--max_grad_norm": ("--clip-grad-norm",), "--tokenizer_name": ("--vocab",),
    # run_classifier's task folder; NVIDIA's pretraining shards (its --input_dir too)
    "--data_dir": ("--data", "--train"), "--input_dir": ("--data", "--input"),
    "--num_steps_per_checkpoint": ("--save-every",), "--resume_from_checkpoint": ("--resume",),
    # NVIDIA's run_pretraining.py warms up by a proportion; pretrain counts steps
    "--warmup_proportion": ("--warmup-proportion", "--warmup-steps"),
}
# Google's and transformers' "what to do" switches: here the command says it.
ANCHOR_SWITCHES = {"--do_train": "bert-of finetune trains", "--do_eval": "bert-of eval evaluates",
                   "--do_predict": "bert-of predict predicts", "--do_export": "bert-of convert exports"}


def anchors_markdown() -> str:
    """ANCHOR_FLAGS as the table docs/command-line.md shows."""
    rows = ["| google-research/bert, NVIDIA, transformers | bert-of |", "|---|---|"]
    for flag, ours in sorted(ANCHOR_FLAGS.items()):
        rows.append(f"| `{flag}` | {' or '.join(f'`{o}`' for o in ours)} |")
    for flag, what in sorted(ANCHOR_SWITCHES.items()):
        rows.append(f"| `{flag}` | {what} |")
    return "\n".join(rows)


def suggest_flag(token: str, known) -> str | None:
    """The flag of ``known`` (a command's option strings) an unknown ``token`` most likely means:
    ours with "-" for "_", the anchors' table, then the closest spelling."""
    name = token.split("=", 1)[0]
    low = name.lower()
    for cand in (low.replace("_", "-"), *ANCHOR_FLAGS.get(low, ()), *ANCHOR_FLAGS.get(low.replace("-", "_"), ())):
        if cand in known and cand != name:
            return cand
    close = difflib.get_close_matches(low.replace("_", "-"), [k for k in known if k.startswith("--")], n=1, cutoff=0.7)
    return close[0] if close else None


def _choices_of(p) -> dict:
    sub = subparsers(p)
    return sub.choices if sub is not None else {}


def unknown_flags(parser, argv) -> tuple:
    """(the parser of the command ``argv`` runs, [(unknown flag, suggestion or None)]): a flag none
    of the parsers on the command's path has. Values after ``--`` are not looked at."""
    p, known = parser, set(parser._option_string_actions)
    for tok in argv:
        if tok == "--":
            break
        nxt = _choices_of(p).get(tok)
        if nxt is not None:
            p = nxt
            known |= set(p._option_string_actions)
    found = []
    for tok in argv:
        if tok == "--":
            break
        if tok.startswith("--") and len(tok) > 2 and tok.split("=", 1)[0] not in known:
            found.append((tok.split("=", 1)[0], suggest_flag(tok, known)))
    return p, found


class Parser(argparse.ArgumentParser):
    """argparse's parser, with errors that point somewhere: an unknown flag names the flag the command
    has for it (Google's and transformers' spellings, typos), an unknown command the nearest one,
    ``convert`` without its direction says so."""

    def parse_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        leaf, unknown = unknown_flags(self, argv)
        if unknown:
            said = []
            for tok, hint in unknown:
                low = tok.lower()
                if low in ANCHOR_SWITCHES:
                    said.append(f"{tok} ({ANCHOR_SWITCHES[low]}; no switch needed)")
                elif hint:
                    said.append(f"{tok} (did you mean {hint}?)")
                else:
                    said.append(tok)
            leaf.exit(2, f"{leaf.prog}: error: unrecognized arguments: {', '.join(said)}; "
                         f"`{leaf.prog} --help` lists the options\n")  # one line: no usage screen
        return super().parse_args(argv, namespace)

    def error(self, message):
        m = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(3))
            close = difflib.get_close_matches(m.group(2), choices, n=1, cutoff=0.6)
            if close:
                message = f"argument {m.group(1)}: invalid choice: {m.group(2)!r} (did you mean {close[0]!r}?)"
        elif self.prog.endswith(" convert") and re.search(r"required: .*\bSRC\b", message):
            message = ("the direction is missing: bert-of convert DIRECTION SRC -o DST, DIRECTION a format pair "
                       "such as tf2of, of2hf, hf2of (`bert-of convert --help` lists the formats)")
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The common options and the help formatter on ``parser`` and every command below it; every
    parser a :class:`Parser` (errors that suggest)."""
    if getattr(parser, "_bert_of_finished", False):
        return parser
    for path, p in walk(parser):
        if type(p) is argparse.ArgumentParser:
            p.__class__ = Parser  # a subclass adding only methods: the parser's state is unchanged
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


__all__ = ["ANCHOR_FLAGS", "ANCHOR_SWITCHES", "GRAMMAR", "HelpFormatter", "Parser", "add_options", "anchors_markdown",
           "configure", "examples", "finish", "grammar_markdown", "suggest_flag", "walk"]
