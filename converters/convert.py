"""Any format to any format, through canonical names.

``convert("tf2of", src, dst)`` = ``FORMATS["of"].write_files(FORMATS["tf"].read(src), staged dst)``.
Adding a format means one module in ``FORMATS``; no pairwise code.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re

from bert_of.errors import BertOfError, CheckpointError, OutputError
from bert_of.fs import check_destination, publishing
from bert_of.converters.source import Options, Source, summarize
from bert_of.progress import Progress

# short name -> module (imported on use so `convert tf2of` never loads OneFlow or TF)
FORMATS = {
    "tf": "bert_of.converters.tf1",
    "of": "bert_of.converters.of",
    # flow.save folders: before lazy, whose detection takes any folder with snapshot_done
    "libai": "bert_of.converters.libai",
    "ofmodels": "bert_of.converters.ofmodels",
    "ofsd": "bert_of.converters.ofsd",
    "lazy": "bert_of.converters.lazy",
    "hf": "bert_of.converters.hf",
    "h5": "bert_of.converters.h5",
}
DESCRIPTIONS = {
    "tf": "Google TF1 checkpoint (bert_model.ckpt.* + bert_config.json + vocab.txt)",
    "of": "bert_of checkpoint directory (config.json + model.safetensors + vocab.txt)",
    "libai": "LiBai BERT saved by flow.save (model_final/model/ + the run's config.yaml)",
    "ofmodels": "Oneflow-Inc/models NLP/BERT state dict saved by flow.save (pickled_data + tensor_N/)",
    "ofsd": "bert_of module state dict saved by flow.save (pickled_data + tensor_N/ + config.json)",
    "lazy": "legacy lazy OneFlow snapshot (one folder per variable, out [+ meta])",
    "hf": "HuggingFace directory (config.json + model.safetensors)",
    "h5": "HuggingFace Keras weights (tf_model.h5 + config.json)",
}


def module(fmt: str):
    if fmt not in FORMATS:
        raise BertOfError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    return importlib.import_module(FORMATS[fmt])


def parse_direction(direction: str) -> tuple:
    m = re.fullmatch(r"([a-z0-9]+)2([a-z0-9]+)", direction)
    if not m or m.group(1) not in FORMATS or m.group(2) not in FORMATS:
        known = ", ".join(f"{a}2{b}" for a in FORMATS for b in FORMATS if a != b)
        raise BertOfError(f"unknown conversion {direction!r} (known: {known})")
    return m.group(1), m.group(2)


def detect(path: str) -> str:
    """The format of ``path``; a clear error when none fits."""
    if not os.path.exists(path) and not any(os.path.exists(path + s) for s in (".index",)):
        raise CheckpointError(f"{path}: no such file or directory")
    for fmt in FORMATS:
        try:
            mod = module(fmt)
        except ModuleNotFoundError as e:  # a format not installed in this checkout
            if e.name == FORMATS[fmt]:
                continue
            raise
        if mod.detect(path):
            return fmt
    raise CheckpointError(f"{path}: not a checkpoint in any known format ({', '.join(FORMATS)})")


def read(path: str, fmt: str | None = None, opts: Options | None = None) -> Source:
    return module(fmt or detect(path)).read(path, opts or Options())


@contextlib.contextmanager
def _counted(source: Source, desc: str):
    """Progress of a conversion: the bytes of the tensors the writer has read (a bar on a terminal,
    else a line every few seconds of a long conversion)."""
    items = {"tensors": source.tensors, "optimizer": source.optimizer}
    total = sum(s.nbytes for group in items.values() for s, _ in group)
    with Progress(desc, total=total, unit="B", unit_scale=True) as bar:
        def counting(spec, produce):
            def produce_counted():
                arr = produce()
                bar.update(spec.nbytes)
                return arr
            produce_counted.checked = getattr(produce, "checked", False)
            return produce_counted

        for key, group in items.items():
            setattr(source, key, [(s, counting(s, p)) for s, p in group])
        try:
            yield
        finally:
            for key, group in items.items():
                setattr(source, key, group)


def convert(direction: str, src: str, dst: str, opts: Options | None = None, check=None) -> tuple:
    """Run one conversion; returns (Source, notes). Nothing is left at dst on error.

    ``dst`` is never the source, inside it or around it (nor ``opts.config`` / ``opts.vocab``);
    ``opts.overwrite`` replaces only a folder of files bert_of writes (:func:`bert_of.fs.check_destination`).

    ``check(source, staged_dir)``, when given, runs on the finished files before they are published
    (``convert --verify``, with the ``Source`` already read): if it raises, ``dst`` is never created (or, with ``overwrite``, the
    old ``dst`` stays as it was).
    """
    opts = opts or Options()
    a, b = parse_direction(direction)
    sources = (src, opts.config, opts.vocab)  # never written over, into or around
    check_destination(dst, opts.overwrite, sources)  # before reading: fail at once
    source = module(a).read(src, opts)
    target = module(b)
    why = source.config.original_bert_mismatch()
    if why and not getattr(target, "PRE_LN", b == "of"):
        raise CheckpointError(f"{src}: cannot convert to {b}: {why}")
    stage = None
    try:
        with publishing(dst, overwrite=opts.overwrite, sources=sources) as stage:
            with _counted(source, direction):
                notes = target.write_files(source, stage, opts) or []
                if not hasattr(target, "PRE_LN") and b != "of":  # an original-BERT format: what it drops
                    notes += source.config.numerics_notes()
            if check is not None:
                check(source, stage)
    except OutputError as e:  # name the file as the user will know it, not its staging path
        if stage is None:
            raise
        raise OutputError(str(e).replace(stage, os.path.abspath(dst))) from None
    return source, notes


__all__ = ["FORMATS", "Options", "convert", "detect", "read", "summarize", "parse_direction"]
