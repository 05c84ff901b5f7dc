"""The one list of checkpoint formats: each format module declares one
:class:`~bert_of.converters.descriptor.Format` (``FORMAT``).

Everything that used to list formats by hand derives from :data:`FORMATS`: the CLI's ``X2Y``
choices and their descriptions (``converters/convert.py``), the files ``--overwrite`` knows as
bert_of's (``bert_of.files.owned.own_files``, filled from each format's ``owns``), the numerics and head
notes of a conversion (``pre_ln``, ``records_numerics``, ``token_classifier``), ``verify``'s
reference layout and ecosystem run (``reference``, ``ecosystem``), the zoo's source and download
formats, and the tests' matrix (``dtypes``).

Adding a format = its module (declaring ``FORMAT = Format(...)``) + one line in :data:`MODULES`.
A format module imports only the core dependencies at the top (NumPy; OneFlow, TensorFlow, h5py,
torch inside the functions that need them): every format is imported to build this list.
"""

from __future__ import annotations

import importlib
import re

from bert_of.errors import BertOfError
from bert_of.files.owned import register_own_files
from bert_of.converters.descriptor import Format

# Detection order: the first format whose ``detect`` takes a path is its format. The flow.save
# folders come before lazy, whose detection takes any folder with snapshot_done.
MODULES = (
    "tf2",  # before tf1: a TF2 checkpoint is a TF1 bundle too (with an object graph)
    "tf1",
    "of",
    "oneflow_native.libai",
    "oneflow_native.ofmodels",
    "oneflow_native.ofsd",
    "lazy",
    "nvidia",
    "hf",
    "h5",
    "onnx",
)


def _load() -> dict:
    out = {}
    for m in MODULES:
        fmt = importlib.import_module(f"bert_of.converters.formats.{m}").FORMAT
        if fmt.name in out or not re.fullmatch(r"[a-z][a-z0-9]*", fmt.name):
            raise AssertionError(f"converters/formats/{m}: format name {fmt.name!r} is taken or not [a-z][a-z0-9]*")
        register_own_files(fmt.owns, fmt.owns_patterns)
        out[fmt.name] = fmt
    return out


FORMATS: dict = _load()  # short name -> Format, in detection order


def get(name: str) -> Format:
    if name not in FORMATS:
        raise BertOfError(f"unknown format {name!r} (known: {', '.join(FORMATS)})")
    return FORMATS[name]


def names(*, writable: bool = False) -> tuple:
    return tuple(n for n, f in FORMATS.items() if not writable or f.write_files is not None)


def reference_layout(source):
    """The NumPy reference's layout of a ``Source``: its format's layout class on its stored tensors."""
    return get(source.format).reference.from_source(source)


__all__ = ["Format", "FORMATS", "MODULES", "get", "names", "reference_layout"]
