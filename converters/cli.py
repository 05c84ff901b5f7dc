"""``bert-of convert``, ``bert-of verify``, ``bert-of inspect``: the format layer's commands.

    bert-of convert tf2of SRC -o DST [--verify] [--with-optimizer]
    bert-of verify A B [-o REPORT]
    bert-of inspect PATH [--json]

``add_parser(subparsers)`` adds them to the ``bert-of`` parser (:func:`bert_of.cli.build_parser`);
their errors are bert_of errors, printed as one ``bert-of: error:`` line by ``bert_of.cli.dispatch``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import numpy as np

from bert_of.cli import _err
from bert_of.cli_grammar import add_command
from bert_of.converters.convert import DESCRIPTIONS, FORMATS, convert, detect, model_path, parse_direction, read
from bert_of.converters.source import Options, parse_size, summarize
from bert_of.converters.verify.compare import DEFAULT_TOL, FLOAT16_TOL, format_report, verdict, verify, verify_source
from bert_of.errors import BertOfError, ConfigError
from bert_of.progress import log
from bert_of.files.atomic import atomic_write
from bert_of.options import arg, from_args


# --------------------------------------------------------------------------- convert

@dataclass(kw_only=True)
class CheckOptions:
    """How ``convert --verify`` and ``verify`` check: the tolerance and the ecosystems' runs."""

    tol: float | None = arg(None, metavar="T",
                            help=f"largest max |diff| accepted (unset: {DEFAULT_TOL:g}; when every weight of the "
                                 f"checked files is float16, {FLOAT16_TOL:g} of each output's magnitude)")
    reference_dtype: str = arg("float64", choices=("float64", "float32"),
                               help="precision the source's own ecosystem runs in beside the NumPy reference "
                                    "(TensorFlow for tf and h5, transformers for hf)")
    torch_python: str | None = arg(None, metavar="PYTHON",
                                   help="a Python interpreter with torch and transformers, for the transformers "
                                        "run of hf checkpoints when this one has none")

    def failure(self, report: dict, dst: str) -> str:
        """The one line a failed check ends with."""
        if report.get("failures"):
            k, v = next(iter(report["failures"].items()))
            return f"verification failed: {k} {v}; {dst}"
        measure = report.get("tolerance_rule", "max |diff|")
        return f"verification failed: {measure} {report['worst']:.3g} > {report['tolerance']:g}; {dst}"



@dataclass(kw_only=True)
class ConvertOptions(CheckOptions):
    """``bert-of convert``."""

    direction: str = arg(positional=True, metavar="DIRECTION",
                         help="SRC2DST format pair: X2Y with X, Y among " + ", ".join(FORMATS) + " (e.g. tf2of, of2tf)")
    src: str = arg(positional=True, metavar="SRC", help="source checkpoint (directory, or a TF checkpoint prefix)")
    output: str = arg(short="-o", metavar="DST", help="destination directory (must not exist unless --overwrite)")
    config: str | None = arg(None, metavar="FILE", help="config file if not beside SRC (bert_config.json for tf)")
    vocab: str | None = arg(None, metavar="FILE", help="vocab.txt if not beside SRC")
    with_optimizer: bool = arg(False, help="convert optimizer state and step too")
    skip_unknown: bool = arg(False, help="drop (and report) non-BERT tensors instead of failing")
    dtype: str | None = arg(None, choices=("float32", "float16", "bfloat16"),
                            help="cast floating tensors (unset: keep each tensor's dtype)")
    numerics: str | None = arg(None, choices=("tf1", "lazy", "hf"),
                               help="what the source's \"gelu\" computed (tf1: tanh, hf: erf, lazy: erf + eps "
                                    "1e-5), where its files leave it open (nvidia, hf, h5, lazy); refused where "
                                    "they record it")
    no_meta: bool = arg(False, help="of2lazy: oldest snapshot layout (no meta files)")
    max_shard_size: str | None = arg(None, metavar="SIZE",
                                     help="X2hf: weights in shards of at most SIZE (5GB, 200MB, 1GiB) with "
                                          "model.safetensors.index.json, as transformers' save_pretrained")
    overwrite: bool = arg(False, help="replace DST if it exists")
    verify: bool = arg(False, help="check forward equality SRC vs DST before publishing DST (see bert-of verify); "
                                   "prints verify's one-line verdict")
    json: bool = arg(False, help="with --verify: print the whole verification report as JSON on stdout instead of "
                                 "the verdict (the conversion's summary goes to stderr then)")

    def reader_options(self) -> Options:
        return Options(config=self.config, vocab=self.vocab, with_optimizer=self.with_optimizer,
                       skip_unknown=self.skip_unknown, overwrite=self.overwrite, dtype=self.dtype,
                       numerics=self.numerics, no_meta=self.no_meta,
                       max_shard_size=parse_size(self.max_shard_size) if self.max_shard_size else None)


def cmd_convert(args) -> int:
    """Convert, then say so on stdout: the summary, "wrote DST", and with --verify the verdict line
    (``verify``'s), or with --json the report alone (so ``> report.json`` is JSON: the summary then
    goes to stderr); -q: errors only."""
    o = from_args(ConvertOptions, args)
    if o.json and not o.verify:
        raise ConfigError("--json prints the verification report: it needs --verify")
    quiet = bool(getattr(args, "quiet", False))
    opts = o.reader_options()
    t0 = time.perf_counter()
    reports = []
    check = _verify_staged(o, reports) if o.verify else None  # DST appears only if it passes
    try:
        source, notes = convert(o.direction, o.src, o.output, opts, check=check)
    except VerificationFailed:
        _print_check(o, reports, quiet)
        raise
    dt = time.perf_counter() - t0
    say = log.info if o.json else (lambda line: None) if quiet else print
    say(summarize(source.report, verbose=getattr(args, "verbose", False)))
    for n in notes:
        say(n)
    say(f"wrote {o.output} ({o.direction}{', verified' if o.verify else ''}, {dt:.2f} s)")
    _print_check(o, reports, quiet)
    return 0


def _print_check(o, reports: list, quiet: bool) -> None:
    """The verification's result on stdout: the report as JSON (--json), else its one-line verdict."""
    for report in reports:
        if o.json:
            print(format_report(report))
        elif not quiet:
            print(verdict(report))


class VerificationFailed(BertOfError):
    """``convert --verify``: the converted files do not compute what the source does."""


def _verify_staged(o: "ConvertOptions", reports: list):
    """The check ``convert`` runs on the staged files (against the Source it read) before publishing them."""
    fmt = parse_direction(o.direction)[1]

    def check(source, stage):
        report = verify_source(source, stage, fmt, tol=o.tol, reference_dtype=o.reference_dtype, shown_b=o.output,
                               torch_python=o.torch_python)
        reports.append(report)
        if not report["ok"]:
            raise VerificationFailed(o.failure(report, f"{o.output} not written"))

    return check


# --------------------------------------------------------------------------- verify


@dataclass(kw_only=True)
class VerifyOptions(CheckOptions):
    """``bert-of verify``."""

    a: str = arg(positional=True, metavar="A", help="reference checkpoint (any format)")
    b: str = arg(positional=True, metavar="B", help="checkpoint to compare with A (any format)")
    modes: list = arg(default_factory=list, metavar="MODES",
                      help="bert_of modes to run, comma-separated or repeated (unset: eager and graph)")
    batch_size: int = arg(3, metavar="N", help="rows of the test batch")
    max_seq_length: int | None = arg(None, metavar="N",
                                     help="padded length of the test batch (unset: 16, at most "
                                          "max_position_embeddings)")
    config: str | None = arg(None, metavar="FILE", help="config for A if not beside it")
    vocab: str | None = arg(None, metavar="FILE", help="vocab for A if not beside it")
    numerics: str | None = arg(None, choices=("tf1", "lazy", "hf"),
                               help="what A's \"gelu\" computed, where A's files leave it open (nvidia, hf, h5, "
                                    "lazy); refused where they record it")
    output: str | None = arg(None, short="-o", metavar="FILE", help="also write the JSON report to this file")
    json: bool = arg(False, help="print the whole report as JSON on stdout instead of the one-line verdict")


def cmd_verify(args) -> int:
    o = from_args(VerifyOptions, args)
    modes = tuple(m for item in o.modes or ["eager,graph"] for m in item.split(",") if m)
    report = verify(o.a, o.b, tol=o.tol, modes=modes, batch_size=o.batch_size, seq_len=o.max_seq_length,
                    opts=Options(config=o.config, vocab=o.vocab, numerics=o.numerics),
                    reference_dtype=o.reference_dtype,
                    torch_python=o.torch_python)
    text = format_report(report)
    print(text if o.json else verdict(report))
    if o.output:
        atomic_write(o.output, text + "\n")
    if not report["ok"]:
        if report.get("failures"):
            return _err(o.failure(report, o.b))
        return _err(f"forward outputs differ: {report.get('tolerance_rule', 'max |diff|')} {report['worst']:.3g} > "
                    f"{report['tolerance']:g}")
    return 0


# --------------------------------------------------------------------------- inspect


def inspect_path(path: str, config: str | None = None) -> dict:
    """Format, config, and every tensor (name, shape, dtype) of a checkpoint (``config``: its config
    file when it is not beside it). A training run's folder: the model it published."""
    path = model_path(path)
    fmt = detect(path)
    info = {"path": path, "format": fmt, "tensors": [], "config": None}
    if FORMATS[fmt].inspect is not None:  # a format listing its file as stored (tf: its index, no config needed)
        info.update(FORMATS[fmt].inspect(path, config))
    else:  # any other format: what it reads as, through its converter
        source = read(path, fmt, Options(config=config, with_optimizer=True, skip_unknown=True, describe=True))
        info["config"] = source.config.to_dict()
        if source.numerics_unknown:  # never shown as a guess
            info["config"]["hidden_act"] = "unknown"
            info["numerics"] = source.numerics_unknown
        elif source.numerics_from:
            info["numerics"] = f"{source.config.hidden_act} from {source.numerics_from}"
        for kind, items in (("model", source.tensors), ("optimizer", source.optimizer)):
            for spec, produce in items:
                info["tensors"].append({"name": spec.name, "shape": list(spec.shape), "dtype": str(spec.dtype),
                                        "kind": kind})
                if kind == "optimizer" and spec.name == "step" and math.prod(spec.shape) == 1:
                    info["step"] = int(np.asarray(produce()).reshape(()))  # its value (one element)
        dropped = [r.source for r in source.report if r.action == "dropped"]
        if dropped:
            info["dropped"] = dropped
    counts = {}
    for t in info["tensors"]:
        if t["kind"] != "step":  # a step is a value (info["step"]), not elements of state
            counts[t["kind"]] = counts.get(t["kind"], 0) + math.prod(t["shape"])
    info["parameters"] = counts.get("model", 0)
    info["elements_by_kind"] = counts
    return info


@dataclass(kw_only=True)
class InspectOptions:
    """``bert-of inspect``."""

    path: str = arg(positional=True, metavar="PATH",
                    help="checkpoint directory or TF checkpoint prefix (any format)")
    json: bool = arg(False, help="print everything as JSON on stdout")
    config: str | None = arg(None, metavar="FILE", path=True,
                             help="config file if not beside PATH (a flow.save folder holds none)")


def cmd_inspect(args) -> int:
    o = from_args(InspectOptions, args)
    info = inspect_path(o.path, o.config)
    if o.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['path']}: format {info['format']}")
    cfg = info["config"]
    if cfg:
        print(f"  config: L={cfg['num_hidden_layers']} H={cfg['hidden_size']} A={cfg['num_attention_heads']} "
              f"I={cfg['intermediate_size']} V={cfg['vocab_size']} P={cfg['max_position_embeddings']} "
              f"T={cfg['type_vocab_size']} act={cfg['hidden_act']} ln_eps={cfg['layer_norm_eps']:g} "
              f"(provenance {cfg['provenance']})")
    if info.get("numerics"):
        print(f"  numerics: {info['numerics']}")
    if cfg and any(t["name"].startswith("classifier.") for t in info["tensors"]):
        names = cfg.get("id2label") or {}
        shown = ", ".join(str(names[k]) for k in sorted(names, key=int)[:8]) + (", ..." if len(names) > 8 else "")
        print(f"  classifier: {cfg.get('classifier_kind', 'sequence')}, {cfg.get('num_labels')} labels"
              + (f" ({shown})" if shown else "") + (f", {cfg['problem_type']}" if cfg.get("problem_type") else ""))
    width = max((len(t["name"]) for t in info["tensors"]), default=10)
    for t in info["tensors"]:
        print(f"  {t['name']:<{width}}  {t['dtype']:<8} {str(t['shape']):<16} {t['kind']}")
    by = info["elements_by_kind"]
    extra = ", ".join(f"{k} {v:,}" for k, v in by.items() if k != "model")
    step = f"; step {info['step']}" if "step" in info else ""
    print(f"  {len(info['tensors'])} tensors; {info['parameters']:,} model parameters" + (f"; {extra}" if extra else "")
          + step)
    if info.get("dropped"):
        print(f"  {len(info['dropped'])} more tensors not part of the model (tied copies, buffers, unknown)")
    return 0


# --------------------------------------------------------------------------- registration


def add_parser(sub):
    """Register ``convert``, ``verify`` and ``inspect`` on the main command line."""
    add_command(sub, "convert", cmd_convert, ConvertOptions,
                help="convert a checkpoint: tf2of, of2tf, hf2of, of2hf, lazy2of, h52of, ...",
                description="Convert a checkpoint between formats through canonical names. Formats: "
                            + "; ".join(f"{k} = {v}" for k, v in DESCRIPTIONS.items()) + ".",
                example_lines=(
                    "bert-of convert tf2of uncased_L-12_H-768_A-12/ -o bert-base-of/ --verify",
                    "bert-of convert tf2of model.ckpt-100000 -o out/ --config bert_config.json "
                    "--vocab vocab.txt --with-optimizer",
                    "bert-of convert of2hf bert-base-of/ -o hf/          # + tokenizer_config.json",
                    "bert-of convert h52hf tf_model_dir/ -o hf/ --dtype float16"))

    add_command(sub, "verify", cmd_verify, VerifyOptions,
                help="forward equality of two checkpoints (vs a float64 NumPy reference on A)",
                description="Run a float64 NumPy BERT on A's tensors as A's format stores them (its names, "
                            "layout and numerics) and bert_of (eager and graph) on B, on real tokens of A's "
                            "vocabulary and on random ids, and compare every output; TensorFlow runs beside "
                            "for a Google checkpoint or a Keras h5. Without OneFlow the same reference runs on "
                            "B's tensors in B's layout instead of bert_of. Exit 1 above --tol.",
                example_lines=("bert-of verify uncased_L-12_H-768_A-12/ bert-base-of/",
                               "bert-of verify bert-base-of/ hf/ --modes eager -o report.json"))

    add_command(sub, "inspect", cmd_inspect, InspectOptions, help="format, tensors, shapes, dtypes, parameter count",
                description="What a checkpoint in any format holds: its format, config (with the numerics "
                            "of its provenance), every tensor as bert_of reads it, the parameter count.",
                example_lines=("bert-of inspect uncased_L-12_H-768_A-12/",
                               "bert-of inspect hf/ --json | jq .parameters"))
