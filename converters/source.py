"""What every format module reads into and writes from: a canonical stream.

A format module exposes::

    NAME, TABLE                        # short name ("tf"), its name table (mapping.spell)
    detect(path) -> bool               # is this path in my format?
    read(path, opts) -> Source         # canonical tensors, lazily (the steps: converters/reader.py)
    write_files(source, dir, opts)     # a Source's files into an existing (staging) directory

``convert`` publishes the staging directory (bert_of.files.publish.publishing), so no format writes ``dst``
itself.

``Source.tensors`` holds ``(TensorSpec, producer)`` pairs so conversions
stream one tensor at a time, and ``Source.report`` accounts for every tensor
of the input: mapped, converted as optimizer state, or dropped, and why.

Building a ``Source`` is the validation point of every reader: its tensors pass
:func:`bert_of.tensors.check_tensors` (dtype, shape, fit to the config, optimizer
state) and every producer is wrapped so the array it yields must be the dtype and
shape its spec announced.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from bert_of.checkpoint import copy_file
from bert_of.config import BertConfig
from bert_of.errors import CheckpointError, ConfigError
from bert_of.files.atomic import writes_to
from bert_of.tensors import TensorSpec, check_tensors, checked_producer
from bert_of.vocab import lower_case_for, recorded_lower_case


@dataclass
class Options:
    config: Optional[str] = None  # config path overriding the one beside the source
    vocab: Optional[str] = None  # vocab path overriding the one beside the source
    with_optimizer: bool = False
    skip_unknown: bool = False
    overwrite: bool = False
    dtype: Optional[str] = None  # cast floating tensors ("float32", "float16", "bfloat16")
    numerics: Optional[str] = None  # override provenance numerics: "tf1" | "lazy" | "hf"
    describe: bool = False  # inspect: a Source whose numerics are unknown is described, not refused
    no_meta: bool = False  # lazy writer: oldest layout (out files only, no meta)
    max_shard_size: Optional[int] = None  # bytes per weights file, for a format that shards (hf)


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
               "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def parse_size(text: str) -> int:
    """``--max-shard-size``: "5GB", "200MB", "1.5GiB", "1000" -> bytes (GB = 10^9, GiB = 2^30, as
    transformers reads it)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if not m or m.group(2) not in _SIZE_UNITS or float(m.group(1)) * _SIZE_UNITS[m.group(2)] < 1:
        raise ConfigError(f"--max-shard-size {text!r}: not a size (like 5GB, 200MB, 1GiB)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


@dataclass
class ReportLine:
    source: str  # name in the input
    action: str  # "mapped" | "optimizer" | "dropped"
    target: str = ""  # canonical (or optimizer) name
    note: str = ""


@dataclass
class Source:
    path: str
    format: str
    config: BertConfig
    vocab_file: Optional[str]
    tensors: list  # [(TensorSpec canonical, producer)]
    optimizer: list = field(default_factory=list)  # [(TensorSpec "m/<name>", producer)]
    optimizer_meta: dict = field(default_factory=dict)
    report: list = field(default_factory=list)  # [ReportLine]
    # The model tensors as the file stores them (stored name -> producer of the stored array) and
    # the config file read: what verify's reference (converters/verify/reference_np.py) computes from.
    stored: dict = field(default_factory=dict)
    config_file: Optional[str] = None
    native_numerics: Optional[str] = None  # what the file's own code computes, whatever --numerics says
    # where the numerics were read from when the config alone does not say (NVIDIA: the checkpoint's
    # era, or --numerics), and, when nothing says, why (convert/verify/load refuse such a Source)
    numerics_from: str = ""
    numerics_unknown: str = ""
    vocab_pad: int = 1  # the maker rounds vocab_size up to a multiple of this (NVIDIA: 8)
    # The tree the tensors stream from (bert_of.files.pinned.PinnedDir), held open while the Source lives
    # (converters/reader.py whole): every producer reads the checkpoint that was read, or fails.
    pinned: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        """The gate (see the module doc): nothing reaches a writer or a model unchecked. Readers
        check the fit first themselves where they can say more (names and layouts as on disk);
        messages here name tensors as the report does."""
        back = {r.target: r.source for r in self.report if r.target}
        check_tensors([s for s, _ in self.tensors], self.config, self.path,
                      optimizer=[s for s, _ in self.optimizer], source=lambda n: back.get(n, n))
        self.tensors = [(s, p if getattr(p, "checked", False) else checked_producer(s, p, self.path))
                        for s, p in self.tensors]
        self.optimizer = [(s, p if getattr(p, "checked", False) else checked_producer(s, p, self.path))
                          for s, p in self.optimizer]

    def names(self):
        return [s.name for s, _ in self.tensors]

    def load(self) -> dict:
        """All canonical tensors in memory (for verification)."""
        return {s.name: p() for s, p in self.tensors}


def summarize(report: list, verbose: bool = False) -> str:
    """Human report: counts that add up to every input tensor; every drop shown.

    Drops sharing a reason are grouped (a training checkpoint has hundreds of
    optimizer slots); ``verbose`` lists every tensor, mapped ones included.
    """
    by = {}
    for r in report:
        by.setdefault(r.action, []).append(r)
    lines = [f"{len(report)} source tensors: " + ", ".join(f"{len(v)} {k}" for k, v in sorted(by.items()))]
    if verbose:
        for r in report:
            arrow = f" -> {r.target}" if r.target else ""
            note = f"  ({r.note})" if r.note else ""
            lines.append(f"  {r.action:9s} {r.source}{arrow}{note}")
        return "\n".join(lines)
    notes = {}
    layout = {"transposed", "squeezed", "[1,P,H] squeezed", "einsum heads merged, transposed", "einsum heads merged"}
    for r in report:  # notes on kept tensors that say more than a layout change
        note = "; ".join(p for p in r.note.split("; ") if p and p not in layout)
        if r.action != "dropped" and note:
            notes.setdefault(note, []).append(r.source)
    for note, names in notes.items():
        lines.append(f"  note      {names[0]}" + (f" (+{len(names) - 1} more)" if len(names) > 1 else "") + f": {note}")
    groups = {}
    for r in by.get("dropped", []):
        groups.setdefault(r.note, []).append(r.source)
    for note, names in groups.items():
        if len(names) <= 3:
            lines += [f"  dropped   {n}  ({note})" for n in names]
        else:
            lines.append(f"  dropped   {len(names)} tensors, e.g. {names[0]}, {names[-1]}  ({note})")
    return "\n".join(lines)


def lower_case_of(source: Source) -> bool:
    """Whether text is lower-cased for this checkpoint: what its folder records (HF's
    tokenizer_config.json, a fine-tuned bert_of folder's train_args.json, a ``do_lower_case``
    config key), else what its vocabulary says (:func:`vocab_looks_cased`); True without one."""
    recorded = recorded_lower_case_of(source)
    if recorded is not None:
        return recorded
    folder = source.path if os.path.isdir(source.path) else os.path.dirname(source.path)
    return lower_case_for(folder, source.vocab_file, error=CheckpointError)[0]


def recorded_lower_case_of(source: Source) -> Optional[bool]:
    """``do_lower_case`` as the checkpoint records it (its config's key, tokenizer_config.json,
    train_args.json), or None: what a converted copy must keep (bert_of's config.json holds it)."""
    recorded = source.config.extra.get("do_lower_case")
    if isinstance(recorded, bool):
        return recorded
    folder = source.path if os.path.isdir(source.path) else os.path.dirname(source.path)
    return recorded_lower_case(folder, CheckpointError)


def cast_spec(spec: TensorSpec, producer: Callable, dtype: Optional[str]):
    """Apply ``--dtype`` to a floating tensor; integers are left alone."""
    import numpy as np

    if dtype is None or np.dtype(spec.dtype).kind != "f" and np.dtype(spec.dtype).name != "bfloat16":
        return spec, producer
    if dtype == "bfloat16":
        import ml_dtypes

        target = np.dtype(ml_dtypes.bfloat16)
    else:
        target = np.dtype(dtype)
    return TensorSpec(spec.name, target, spec.shape), lambda: producer().astype(target)


def write_google_sidecars(source: Source, d: str) -> None:
    """``bert_config.json`` (Google's keys) and ``vocab.txt`` into ``d``, as Google's releases and
    the lazy OneFlow snapshots keep them beside the weights."""
    cfg = os.path.join(d, "bert_config.json")
    with writes_to(cfg), open(cfg, "w") as f:
        json.dump(source.config.to_google_dict(), f, indent=2)
        f.write("\n")
    if source.vocab_file:
        copy_file(source.vocab_file, os.path.join(d, "vocab.txt"))
