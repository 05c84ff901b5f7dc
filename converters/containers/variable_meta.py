"""The ``meta`` file of a legacy OneFlow variable folder: a text-format protobuf VariableMetaInfo.

``shape { dim: 30522 dim: 768 } data_type: kFloat`` -- read as OneFlow 0.9's ``flow.load`` reads it
(protobuf's text_format.Parse) and written as its ``text_format.MessageToString`` writes it. Used by the
lazy snapshots (converters/formats/lazy/) and the flow.save folders (converters/containers/flow_save.py).
"""

from __future__ import annotations

import re

import numpy as np

from bert_of.errors import CheckpointError
from bert_of.tensors import check_shape

# VariableMetaInfo.data_type (oneflow/core/common/data_type.proto)
_DT_NAMES = {"kChar": 1, "kFloat": 2, "kDouble": 3, "kInt8": 4, "kInt32": 5, "kInt64": 6, "kUInt8": 7,
             "kFloat16": 9, "kBFloat16": 11, "kBool": 12}
_DT_CODE_NAME = {v: k for k, v in _DT_NAMES.items()}


def _np_dtypes():
    d = {2: np.dtype("<f4"), 3: np.dtype("<f8"), 4: np.dtype("i1"), 5: np.dtype("<i4"), 6: np.dtype("<i8"),
         7: np.dtype("u1"), 9: np.dtype("<f2"), 12: np.dtype("?")}
    try:
        import ml_dtypes

        d[11] = np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # pragma: no cover
        pass
    return d


_CODE_TO_NP = _np_dtypes()


# OneFlow 0.9's DataType enum (data_type.proto, proto2: a number must name one of these).
_DT_ALL = {"kInvalidDataType": 0, "kChar": 1, "kFloat": 2, "kDouble": 3, "kInt8": 4, "kInt32": 5, "kInt64": 6,
           "kUInt8": 7, "kOFRecord": 8, "kFloat16": 9, "kTensorBuffer": 10, "kBFloat16": 11, "kBool": 12,
           "kUInt16": 13, "kUInt32": 14, "kUInt64": 15, "kUInt128": 16, "kInt16": 17, "kInt128": 18,
           "kComplex32": 19, "kComplex64": 20, "kComplex128": 21}
# protobuf's text_format tokenizer (3.20, which OneFlow 0.9's flow.load parses ``meta`` with):
# whitespace and #-comments between tokens, identifiers, numbers, quoted strings, else one character.
_PB_SPACE = re.compile(r"(\s|(#.*$))+", re.MULTILINE)
_PB_TOKEN = re.compile(r"[a-zA-Z_][0-9a-zA-Z_+-]*|([0-9+-]|(\.[0-9]))[0-9a-zA-Z_.+-]*"
                       r"|'[^'\n\\]*((\\.)+[^'\n\\]*)*('|\\?$)|\"[^\"\n\\]*((\\.)+[^\"\n\\]*)*(\"|\\?$)")
_MAX_DIMS = 32


def _pb_tokens(text: str) -> list:
    """The tokens text_format.Parse sees in ``text`` (as ``open(meta).read()`` gives it: universal
    newlines), line by line as it splits them."""
    out = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        col = 0
        while True:
            m = _PB_SPACE.match(line, col)
            if m:
                col = m.end()
            if col >= len(line):
                break
            m = _PB_TOKEN.match(line, col)
            tok = m.group(0) if m else line[col]
            out.append(tok)
            col += len(tok)
    return out


def _pb_int(tok: str):
    """text_format's integer (ParseInteger: C octal 0NN, else Python's int(text, 0)), or None."""
    octal = re.match(r"(-?)0(\d+)$", tok)
    try:
        return int(octal.group(1) + "0o" + octal.group(2) if octal else tok, 0)
    except ValueError:
        return None


def parse_meta(text: str, where: str):
    """Text-format VariableMetaInfo -> (shape tuple, numpy dtype), read as flow.load reads it
    (protobuf's text_format.Parse): fields ``shape`` (a message: ``{...}`` or ``<...>``, its ``:``
    optional) and ``data_type`` (an enum name, or a number naming one), each at most once, each
    followed by an optional ``,`` or ``;``; ``dim`` repeated, one at a time or as a list
    ``dim: [2, 3]``; integers decimal, hex or C octal; ``#`` comments. What text_format refuses is
    refused; a meta it reads but no tensor can have (negative dims, no data_type, a dtype bert_of
    has no NumPy type for) is refused after."""
    toks = _pb_tokens(text)
    i = 0
    shape, dtype_code = None, None

    def bad(why):
        return CheckpointError(f"{where}: not a VariableMetaInfo ({why})")

    def peek():
        return toks[i] if i < len(toks) else ""

    def take(tok):
        nonlocal i
        if peek() == tok:
            i += 1
            return True
        return False

    def separator():
        if not take(","):
            take(";")

    def dim():
        nonlocal i
        v = _pb_int(peek())
        if v is None or not -(1 << 63) <= v < (1 << 63):
            raise bad(f"dim {peek()[:40]!r} is not an int64")
        i += 1
        if v < 0:
            raise bad(f"negative dim {v}")
        dims.append(v)
        if len(dims) > _MAX_DIMS:
            raise bad(f"more than {_MAX_DIMS} dims")

    while i < len(toks):
        name = toks[i]
        i += 1
        if name == "shape":
            if shape is not None:
                raise bad("more than one shape")
            take(":")
            if take("<"):
                close = ">"
            elif take("{"):
                close = "}"
            else:
                raise bad("shape without {")
            dims = []
            while not take(close):
                if i >= len(toks):
                    raise bad("unterminated shape")
                if toks[i] != "dim":
                    raise bad(f"unexpected {toks[i][:40]!r} in shape")
                i += 1
                if not take(":"):
                    raise bad("dim without ':'")
                if take("["):  # dim: [2, 3]
                    if not take("]"):
                        while True:
                            dim()
                            if take("]"):
                                break
                            if not take(","):
                                raise bad("a dim list without ','")
                else:
                    dim()
                separator()
            shape = check_shape(dims, where)
        elif name == "data_type":
            if dtype_code is not None:
                raise bad("more than one data_type")
            if not take(":"):
                raise bad("data_type without ':'")
            v = peek()
            i += 1
            try:
                number = int(v, 0)  # text_format's ParseEnum: a number, else a name
            except ValueError:
                if v not in _DT_ALL:
                    raise bad(f"unknown data_type {v[:40]!r}") from None
                number = _DT_ALL[v]
            if number not in _DT_ALL.values():
                raise bad(f"data_type {number} is no DataType")
            dtype_code = number
        else:
            raise bad(f"unexpected {name[:40]!r}")
        separator()
    if dtype_code is None:
        raise bad("no data_type")
    if dtype_code not in _CODE_TO_NP:
        name = _DT_CODE_NAME.get(dtype_code, next(k for k, v in _DT_ALL.items() if v == dtype_code))
        raise CheckpointError(f"{where}: unsupported data_type {name}")
    return (shape if shape is not None else ()), _CODE_TO_NP[dtype_code]


def format_meta(shape, dtype) -> str:
    """What OneFlow's text_format.MessageToString writes for a VariableMetaInfo."""
    dtype = np.dtype(dtype)
    code = next((c for c, d in _CODE_TO_NP.items() if d == dtype), None)
    if code is None:
        raise CheckpointError(f"dtype {dtype} has no OneFlow DataType")
    dims = "".join(f"  dim: {int(d)}\n" for d in shape)
    return f"shape {{\n{dims}}}\ndata_type: {_DT_CODE_NAME[code]}\n"

