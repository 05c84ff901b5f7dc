"""Options defined once: a command's options are one dataclass whose fields carry the type, the
default, the help and the flag (as transformers' ``HfArgumentParser`` reads its dataclasses); the
command's parser is generated from it (:func:`bert_of.cli_grammar.add_options`) and the parsed
object goes down to the code that runs. :class:`TrainConfig`, the trainer's hyper-parameters, is
the base the training commands' options extend, so the trainer gets the same names.

    @dataclass(kw_only=True)
    class MyOptions:
        data: str = arg(help="input file", metavar="FILE")           # no default: required
        steps: int = arg(1000, help="optimizer steps")                # --steps N
        output: str = arg(help="where to write", short="-o", flag="--output")

Importing this module is cheap (no OneFlow): parsers are built from it before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import MISSING, dataclass, field, fields

from bert_of.errors import BertOfError, ConfigError
from bert_of.files.reading import read_json


def arg(default=MISSING, *, help: str, flag: str | None = None, short: str | None = None, metavar: str | None = None,
        choices=None, group: str | None = None, commands: tuple | None = None, off: str | None = None,
        positional: bool = False, default_factory=MISSING, path: bool = False,
        on_resume: str | None = None, required=False, helps: dict | None = None, nargs: str | None = None):
    """A dataclass field that is also a command-line option.

    ``flag``: its spelling (default ``--`` + the name with dashes); ``short``: e.g. ``-o``;
    ``group``: the help section; ``commands``: the commands of a shared options class that show it
    (None: all); ``off``: for a ``bool | None`` field, the flag that sets False (``--no-lower-case``);
    ``path``: a file or folder (recorded absolute);
    ``required``: True, or the commands that require an option the others may leave unset;
    ``helps``: {command: help} where a shared option means something more precise; ``nargs``: "+"
    for a list option that also takes several values after one flag.
    ``on_resume`` (runs that record their options, :func:`resumed`): None = a value given again
    must be the recorded one; ``"may grow"`` = it may be larger; ``"may change"``; ``"not kept"`` =
    not part of the run (this invocation's alone). The default is written here only: the help shows
    it (``(default: ...)``), so the help text never repeats it.
    """
    assert on_resume in (None, "may grow", "may change", "not kept"), on_resume
    md = {"help": help, "flag": flag, "short": short, "metavar": metavar, "choices": choices, "group": group,
          "commands": commands, "off": off, "positional": positional, "path": path,
          "on_resume": on_resume, "required": required, "helps": helps or {},
          "nargs": nargs}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=md)
    return field(default=default, metadata=md)


def is_option(f: dataclasses.Field) -> bool:
    return "help" in f.metadata


def help_of(f: dataclasses.Field, command: str | None = None) -> str:
    return f.metadata["helps"].get(command, f.metadata["help"])


def required_in(f: dataclasses.Field, command: str | None = None) -> bool:
    req = f.metadata.get("required")
    return (f.default is MISSING and f.default_factory is MISSING) or req is True or \
        (isinstance(req, tuple) and command in req)


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def shown_in(f: dataclasses.Field, command: str | None, cls=None) -> bool:
    """Whether the option ``f`` belongs to ``command``: a shared options class names its commands
    in the field, or, for a field it extends, in its ``FIELD_COMMANDS`` ({name: commands})."""
    cmds = getattr(cls, "FIELD_COMMANDS", {}).get(f.name, f.metadata.get("commands"))
    return is_option(f) and (cmds is None or command is None or command in cmds)


def nested(f: dataclasses.Field):
    """The options dataclass a field holds (a group of options, e.g. the ranks), or None."""
    factory = f.default_factory
    return factory if factory is not MISSING and dataclasses.is_dataclass(factory) else None


def from_args(cls, args, command: str | None = None, **given):
    """``cls`` from a command line parsed by a parser :func:`bert_of.cli_grammar.add_options` made
    from it: an option the user gave takes its value, one not given (absent from ``args``) its
    field's default; ``given`` sets fields directly. Only the options ``command`` shows are read."""
    kw = {}
    for f in fields(cls):
        if f.name in given:
            kw[f.name] = given[f.name]
        elif nested(f) is not None:
            kw[f.name] = from_args(nested(f), args, command)
        elif shown_in(f, command, cls) and hasattr(args, f.name):
            kw[f.name] = getattr(args, f.name)
    return cls(**kw)


def option_fields(cls, command: str | None = None) -> dict:
    """{flag: field} of every option ``command`` shows, nested groups included."""
    out = {}
    for f in fields(cls):
        if nested(f) is not None:
            out.update(option_fields(nested(f), command))
        elif shown_in(f, command, cls):
            out[flag_of(f)] = f
    return out


# --------------------------------------------------------------------------- the ranks of a job


RANKS = "ranks (data parallel; under an external launcher give none of these)"


@dataclass(kw_only=True)
class Nodes:
    """The machines of a multi-rank job (read by :func:`bert_of.launch.topology`)."""

    nnodes: int = arg(1, help="machines in the job; every node runs the same command with its own --node-rank",
                      metavar="M", group=RANKS)
    node_rank: int = arg(0, help="this machine's index, 0..M-1 (0 = master)", metavar="R", group=RANKS)
    master_addr: str = arg("127.0.0.1", help="node 0's address every node can reach (one machine: loopback)",
                           metavar="A", group=RANKS, on_resume="may change")
    master_port: int | None = arg(None, help="a free TCP port on node 0, the same on every node (unset: any free "
                                             "port; one node)", metavar="P", group=RANKS, on_resume="may change")


@dataclass(kw_only=True)
class Ranks(Nodes):
    """Data-parallel ranks of a command: how many on this machine, over which machines."""

    nproc: int = arg(1, help="ranks on this machine (the command runs itself again as N ranks)", metavar="N",
                     group=RANKS)


# --------------------------------------------------------------------------- training


TRAINING = "training"


@dataclass(kw_only=True)
class TrainConfig:
    """How to train: the trainer's hyper-parameters, which the training commands' options extend
    (same names from the flag down). Google's (optimization.py) are the fixed ones: AdamW without
    bias correction, weight decay not on bias / LayerNorm, linear warmup from 0 then polynomial
    decay over the global step."""

    mode: str = arg("auto", choices=("auto", "graph", "eager"),
                    help="nn.Graph (compiled) or eager execution; auto: graph, but eager under DDP and, on "
                         "CPU, for fine-tuning and prediction (faster there)")
    optimizer: str = arg("adamw", group=TRAINING, choices=("adamw", "lamb", "sgd"),
                         help="adamw: Google's AdamWeightDecay (no bias correction); lamb; sgd")
    lr: float = arg(1e-4, group=TRAINING, help="peak learning rate", metavar="LR")
    warmup_steps: int = arg(0, group=TRAINING, help="linear warmup steps, then linear decay", metavar="N")
    batch_size: int = arg(32, group=TRAINING, metavar="N", help="the global batch (all ranks together)")
    steps: int = arg(1000, group=TRAINING, metavar="N", on_resume="may grow",
                     help="total optimizer steps (the decay horizon; a resume may extend it)")
    weight_decay: float = arg(0.01, group=TRAINING, metavar="W",
                              help="decoupled weight decay (not on LayerNorm / bias)")
    clip_grad_norm: float = arg(1.0, group=TRAINING, help="global-norm clip; 0 turns it off", metavar="C")
    adam_eps: float = arg(1e-6, group=TRAINING, help="Adam / LAMB epsilon", metavar="EPS")
    # Google's AdamWeightDecayOptimizer has none: its first updates are m/sqrt(v) uncorrected, 3-6x
    # torch.optim.AdamW's over the first ~100 steps, so a short run with transformers' hyper-parameters
    # needs this to train alike (bench/squad_bench.py)
    bias_correction: bool = arg(False, flag="--adam-bias-correction", group=TRAINING,
                                help="Adam / LAMB bias correction, as torch.optim.AdamW (transformers' Trainer) "
                                     "does; off: Google's AdamWeightDecay, which has none")
    grad_accum_steps: int = arg(1, group=TRAINING, help="micro-batches per optimizer step", metavar="K")
    amp: bool = arg(False, group=TRAINING, help="mixed precision: fp16 autocast + loss scaling (GPU; graph: "
                                                "OneFlow's GradScaler, eager: bert_of's dynamic loss scaler)")
    seed: int = arg(42, group=TRAINING, help="initialisation (a new model or head), shuffling and dropout seed",
                    metavar="S")
    # fixed by Google's recipe (no flags)
    end_lr: float = 0.0
    power: float = 1.0
    no_decay: tuple = ("bias", "LayerNorm", "layer_norm")
    betas: tuple = (0.9, 0.999)
    momentum: float = 0.9
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, opts, **overrides) -> "TrainConfig":
        """The trainer's part of a command's options (``overrides``: values the command computed)."""
        return cls(**{f.name: overrides.get(f.name, getattr(opts, f.name)) for f in fields(cls) if f.init})

    def check(self) -> "TrainConfig":
        """One line naming the first value the trainer cannot use."""
        for name, ok in (("lr", self.lr > 0), ("steps", self.steps >= 1), ("warmup_steps", self.warmup_steps >= 0),
                         ("grad_accum_steps", self.grad_accum_steps >= 1), ("weight_decay", self.weight_decay >= 0),
                         ("clip_grad_norm", self.clip_grad_norm >= 0), ("adam_eps", self.adam_eps > 0)):
            if not ok:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)!r}: out of range")
        return self

    def to_dict(self):
        d = {f.name: getattr(self, f.name) for f in fields(TrainConfig)}
        d["no_decay"], d["betas"] = list(self.no_decay), list(self.betas)
        return d


RUN = "the run (its folder: run.json, metrics.jsonl, checkpoints/)"


@dataclass(kw_only=True)
class RunOptions(TrainConfig):
    """Run control, declared once for every training command (``pretrain``, ``finetune``): the same
    flags, defaults and meanings; the commands extend it. ``-o`` is the run folder for both (each
    command declares it, with its help); what lives in it is :class:`bert_of.training.state.RunDir`'s,
    and its model is ``final/`` (:func:`bert_of.checkpoint.run_final`)."""

    log_every: int = arg(10, group=RUN, metavar="N", on_resume="may change",
                         help="the loss shown, and a metrics.jsonl record written in the run folder, every N steps")
    save_every: int = arg(0, group=RUN, metavar="N", on_resume="may change",
                          help="a resumable checkpoint (checkpoints/step-N in the run folder) every N steps; "
                               "0 = none")
    keep: int = arg(2, group=RUN, metavar="N", on_resume="may change",
                    help="resumable checkpoints to keep (the newest; older ones are deleted)")
    resume: bool = arg(False, group=RUN, on_resume="not kept",
                       help="continue the run in --output from its last checkpoint, exactly, with the options it "
                            "recorded (run.json): give none again, or only a larger --steps, --save-every, --keep, "
                            "--log-every")
    stop_after: int = arg(0, group=RUN, metavar="N", on_resume="not kept",
                          help="stop once step N is done, publishing nothing (--resume continues the run, e.g. a "
                               "job in a scheduler's time slots); 0 = train to the end")


def _normal(f, v):
    return os.path.abspath(v) if f.metadata.get("path") and isinstance(v, str) else v


def record(opts) -> dict:
    """The options of a run as it keeps them (:func:`resumed`): every option but the ones ``"not
    kept"``, paths absolute, groups nested."""
    out = {}
    for f in fields(opts):
        v = getattr(opts, f.name)
        if nested(f) is not None:
            out[f.name] = record(v)
        elif is_option(f) and f.metadata.get("on_resume") != "not kept":
            out[f.name] = _normal(f, v)
    return out


RUN_RECORD = "run.json"  # a run directory's record of its options (RunDir writes it; a resume reads it)


def resume_from_record(cls, directory: str, args, command: str | None = None, what: str = "bert-of", **given):
    """The options of a resumed run: its record (``DIRECTORY/run.json``) with what this command line
    gives on top; a given value that may not change on a resume is refused in one line naming it."""
    path = os.path.join(directory, RUN_RECORD)
    if not os.path.isfile(path):
        raise BertOfError(f"{directory}: nothing to resume (no {RUN_RECORD}: not a run of {what})")
    opts, differ = resumed(cls, read_json(path, "run record"), args, command, **given)
    if differ:
        may = [flag_of(f) for f in option_fields(cls, command).values()
               if f.metadata.get("on_resume") in ("may grow", "may change")]
        raise ConfigError(f"{directory}: cannot resume exactly with a different setup ({', '.join(differ)}); a resume "
                          f"continues the run as recorded: give no options again, or change only {', '.join(may)} "
                          "(--steps: larger)")
    return opts


def resumed(cls, recorded: dict, args, command: str | None = None, **given):
    """(options, differences) of a run resumed from its ``recorded`` options (:func:`record`) with
    what this command line gives on top. A differences entry (``"lr 0.001 -> 0.0005"``) is a given
    value that may not change on a resume (``on_resume`` of :func:`arg`)."""
    kw, differ = {}, []
    for f in fields(cls):
        if f.name in given:
            kw[f.name] = given[f.name]
            continue
        if nested(f) is not None:
            kw[f.name], more = resumed(nested(f), recorded.get(f.name) or {}, args, command)
            differ += more
            continue
        if not is_option(f):
            continue
        rule, have = f.metadata.get("on_resume"), f.name in recorded
        if shown_in(f, command, cls) and hasattr(args, f.name):
            new = _normal(f, getattr(args, f.name))
            old = recorded.get(f.name)
            if have and new != old and rule not in ("may change", "not kept") and \
                    not (rule == "may grow" and old is not None and new is not None and new > old):
                differ.append(f"{f.name} {old!r} -> {new!r}")
            kw[f.name] = new
        elif have and rule != "not kept":
            kw[f.name] = recorded[f.name]
    return cls(**kw), differ


__all__ = ["Nodes", "RUN", "RUN_RECORD", "Ranks", "RunOptions", "TrainConfig", "arg", "flag_of", "from_args", "help_of",
           "is_option", "nested", "option_fields", "record", "required_in", "resume_from_record", "resumed", "shown_in"]
