"""The one gate every model input passes before a OneFlow kernel sees it.

OneFlow 0.9's kernels check indices with ``CHECK`` and abort the interpreter (SIGABRT) on an
empty batch or a gather index out of range; an embedding lookup past the table, a 1-D mask that
broadcasts along the wrong axis, a class id past the classifier give a number and no error. So the
forwards first hand their inputs here: shapes and dtypes (free), then values (one min/max
reduction per tensor; NumPy on the host, a device reduction for tensors; tensors being traced
into a graph are checked by shape only, their values do not exist yet). Anything wrong is an
:class:`InputError` (a ``ValueError``) or :class:`InputTypeError` (a ``TypeError``) naming the
input, what it holds and what the model allows.

What passes, and why:

- ``input_ids``, ``token_type_ids``: integers [B, S], B, S >= 1, S <= max_position_embeddings,
  ids in [0, vocab_size), types in [0, type_vocab_size).
- ``attention_mask``: 1 keep / 0 drop, [B, S] (a padding mask), [B, S, S] (per query, as
  transformers' ``get_extended_attention_mask``) or [B, 1, S, S] (transformers' prepared 4-D
  mask in its boolean form); values in [0, 1]. A 1-D mask is refused: it would broadcast along
  the keys of every row alike.
- transformers' ``position_ids``: integers [B, S] or [1, S] in [0, max_position_embeddings)
  (then S itself may exceed the table: the positions are what is looked up); ``head_mask``:
  numbers in [0, 1] shaped [N] or [L, N]; ``inputs_embeds``: floats [B, S, H] in place of
  ``input_ids`` (exactly one of the two, as transformers says).
- labels, per head: class ids in [0, num_labels) or transformers' ignore index -100 where its
  loss ignores it (sequence and token classification, ``labels`` of the MLM head); regression
  targets finite; multi-label targets [B, num_labels] in [0, 1]; ``masked_lm_ids`` in
  [0, vocab_size); ``masked_lm_positions`` and SQuAD start/end positions in [0, S);
  next-sentence labels 0 or 1.

Shapes: B batch, S sequence, P predictions per sequence, V vocab, K labels.
"""

from __future__ import annotations

import sys
from typing import Optional

import numpy as np

from bert_of.config import BertConfig
from bert_of.errors import InputError, InputTypeError

IGNORE_INDEX = -100  # label of positions without a loss (later sub-tokens, [CLS], [SEP], padding): HF's


def _oneflow():
    """OneFlow if this process has loaded it, else None. An input can be a OneFlow tensor only once
    OneFlow is loaded, so NumPy arrays and lists are checked on the host without it (``--engine
    onnxruntime`` predicts without OneFlow); OneFlow is imported only where a tensor is made
    (:func:`as_input`)."""
    return sys.modules.get("oneflow")


def _is_tensor(x) -> bool:
    flow = _oneflow()
    return flow is not None and isinstance(x, flow.Tensor)


def _int_dtypes() -> set:
    """A OneFlow tensor's integer dtypes (asked of a tensor only: OneFlow is loaded)."""
    flow = _oneflow()
    return {flow.int8, flow.int32, flow.int64, flow.uint8}


def _float_dtypes() -> set:
    """A OneFlow tensor's floating dtypes."""
    flow = _oneflow()
    return {flow.float16, flow.float32, flow.float64, flow.bfloat16}


def _number_dtypes() -> set:
    return _int_dtypes() | _float_dtypes()


# --------------------------------------------------------------------------- conversion


def as_input(x, name: str, like, ids: bool = True):
    """A model input as the forward takes it: a flow tensor as it is; a NumPy array or (nested)
    Python list as a tensor on ``like``'s device (global: its placement, broadcast), int64 when
    integer (``ids``: it must be), else float32 (regression labels, masks of 1.0/0.0). None stays
    None. Anything that is not numbers is an :class:`InputTypeError`."""
    if x is None or _is_tensor(x):
        return x
    try:
        a = np.asarray(x)
    except ValueError:  # ragged nested lists
        raise InputError(f"{name}: rows of different lengths (pad them: the tokenizer's padding=True)") from None
    if a.dtype == np.bool_:
        a = a.astype(np.int64)
    integer = np.issubdtype(a.dtype, np.integer)
    if ids and (a.ndim != 2 or not integer):
        raise (InputError if integer else InputTypeError)(
            f"{name}: expected integers shaped [batch, sequence], got {a.dtype} {list(a.shape)}")
    if not integer and not np.issubdtype(a.dtype, np.floating):
        raise InputTypeError(f"{name}: expected numbers, got {a.dtype}")
    from bert_of._flow import flow  # a tensor is made: OneFlow (the model loaded it already)

    dtype = flow.int64 if integer else flow.float32
    if like.is_global:
        return flow.tensor(a, dtype=dtype).to_global(placement=like.placement, sbp=flow.sbp.broadcast)
    return flow.tensor(a, dtype=dtype, device=like.device)


def dims(x) -> tuple:
    """The shape of a tensor, array or nested list (without converting a tensor)."""
    if isinstance(x, np.ndarray) or _is_tensor(x):
        return tuple(x.shape)
    try:
        return np.shape(x)
    except ValueError:
        raise InputError("rows of different lengths (pad them: the tokenizer's padding=True)") from None


# --------------------------------------------------------------------------- values


def _lazy(x) -> bool:
    return _is_tensor(x) and x.is_lazy


def _is_int(x) -> bool:
    if _is_tensor(x):
        return x.dtype in _int_dtypes()
    return np.issubdtype(np.asarray(x).dtype, np.integer) or np.asarray(x).dtype == np.bool_


def span(x) -> tuple:
    """(min, max) of a non-empty NumPy array or eager tensor: NumPy on the host, else one
    reduction (NaN shows as a NaN bound)."""
    if not _is_tensor(x):
        a = np.asarray(x)
        return a.min().item(), a.max().item()
    flow = _oneflow()
    if x.dtype == flow.bool:
        x = x.to(flow.int8)
    parts = [x.min(), x.max()]
    if x.dtype in _float_dtypes():  # OneFlow 0.9's min/max skip NaN (max of [1, nan, 0] is 0): count them
        parts.append(flow.isnan(x).sum().to(x.dtype))
    lo_hi = flow.stack(parts)
    if lo_hi.is_global:
        lo_hi = lo_hi.to_global(sbp=flow.sbp.broadcast).to_local()
    lo, hi, *nans = lo_hi.numpy().tolist()
    return (float("nan"),) * 2 if nans and nans[0] else (lo, hi)


def _shown(v) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


def check_range(name: str, x, low, high, what: str, ignore: Optional[int] = None) -> None:
    """Every value of ``x`` in [low, high) (or equal to ``ignore``), else an InputError saying
    which value and ``what`` the range is. One reduction; a second only when ``ignore`` may be present."""
    if x is None or _lazy(x) or int(np.prod(dims(x))) == 0:
        return
    lo, hi = span(x)
    if ignore is not None and lo < low:  # the smallest value below range: is it only the ignore index?
        if _is_tensor(x):
            flow = _oneflow()
            lo = span(flow.where(x == ignore, flow.zeros_like(x) + low, x))[0]
        else:
            a = np.asarray(x)
            lo = np.where(a == ignore, low, a).min().item()
    if lo != lo or hi != hi:
        raise InputError(f"{name} holds NaN")
    if lo < low or hi >= high:
        bad = lo if lo < low else hi
        also = f" (or {ignore}, ignored)" if ignore is not None else ""
        raise InputError(f"{name} holds {_shown(bad)}, outside [{_shown(low)}, {_shown(high)}){also}: {what}")


# --------------------------------------------------------------------------- the gate


def check_inputs(config: BertConfig, input_ids, token_type_ids=None, attention_mask=None, *, position_ids=None,
                 head_mask=None, inputs_embeds=None) -> None:
    """Refuse what the model cannot compute on, as one :class:`InputError` (dtype problems:
    :class:`InputTypeError`): ids not integers [B, S] with B, S >= 1, a sequence longer than
    ``max_position_embeddings``, a token id outside [0, vocab_size), a token type outside
    [0, type_vocab_size), a mask of another shape than [B, S], [B, S, S] or [B, 1, S, S] or with
    values outside [0, 1]; transformers' ``position_ids``, ``head_mask`` and ``inputs_embeds`` as
    the module doc says. Inputs: int NumPy arrays or tensors (see the module doc)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise InputError("pass exactly one of input_ids or inputs_embeds" +
                         (" (not both)" if input_ids is not None else ""))
    if inputs_embeds is not None:
        shape = dims(inputs_embeds)
        H = config.hidden_size
        if len(shape) != 3 or shape[2] != H:
            raise InputError(f"inputs_embeds: expected [batch, sequence, {H}] (hidden_size {H}), got shape "
                             f"{list(shape)}")
        if _is_tensor(inputs_embeds) and inputs_embeds.dtype not in _float_dtypes():
            raise InputTypeError(f"inputs_embeds: expected floats, got {inputs_embeds.dtype}")
        shape = shape[:2]
    else:
        shape = dims(input_ids)
    given = "input_ids" if inputs_embeds is None else "inputs_embeds"
    if len(shape) != 2:
        raise InputError(f"input_ids: expected [batch, sequence], got shape {list(shape)}"
                         + (" (one text? wrap it in a list: [ids])" if len(shape) == 1 else ""))
    B, S = shape
    if B == 0 or S == 0:
        raise InputError(f"{given}: an empty batch (shape {list(shape)}): the model needs at least one "
                         f"sequence of at least one token")
    if position_ids is not None:
        if not _is_int(position_ids):
            raise InputTypeError(f"position_ids: expected integers, got "
                                 f"{getattr(position_ids, 'dtype', None) or np.asarray(position_ids).dtype}")
        if dims(position_ids) not in ((B, S), (1, S)):
            raise InputError(f"position_ids: shape {list(dims(position_ids))}, expected [{B}, {S}] or [1, {S}]")
        check_range("position_ids", position_ids, 0, config.max_position_embeddings,
                    f"the model's max_position_embeddings is {config.max_position_embeddings}")
    elif S > config.max_position_embeddings:
        raise InputError(f"input of {S} tokens is longer than the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    for name, x in (("input_ids", input_ids), ("token_type_ids", token_type_ids)):
        if x is not None and not _is_int(x):
            raise InputTypeError(f"{name}: expected integers, got {getattr(x, 'dtype', type(x).__name__)}")
    if token_type_ids is not None and dims(token_type_ids) != shape:
        raise InputError(f"token_type_ids: shape {list(dims(token_type_ids))} != input_ids' {list(shape)}")
    if attention_mask is not None:
        m = dims(attention_mask)
        if m not in ((B, S), (B, S, S), (B, 1, S, S)):
            raise InputError(f"attention_mask: shape {list(m)} does not fit input_ids {list(shape)}: expected "
                             f"[{B}, {S}] (1 = attend, 0 = padding), [{B}, {S}, {S}] or [{B}, 1, {S}, {S}]")
        if _is_tensor(attention_mask) and attention_mask.dtype not in _number_dtypes() | {_oneflow().bool}:
            raise InputTypeError(f"attention_mask: expected numbers, got {attention_mask.dtype}")
        if not _lazy(attention_mask):
            lo, hi = span(attention_mask)
            if not (0 <= lo and hi <= 1):  # NaN fails too
                raise InputError(f"attention_mask holds {_shown(lo if not 0 <= lo else hi)}: a mask holds 1 (attend) "
                                 f"and 0 (padding), not an additive mask")
    if head_mask is not None:
        L, N = config.num_hidden_layers, config.num_attention_heads
        if dims(head_mask) not in ((N,), (L, N)):
            raise InputError(f"head_mask: shape {list(dims(head_mask))}, expected [{N}] (every layer) or [{L}, {N}] "
                             f"(num_attention_heads {N}, num_hidden_layers {L})")
        if _is_tensor(head_mask) and head_mask.dtype not in _number_dtypes() | {_oneflow().bool}:
            raise InputTypeError(f"head_mask: expected numbers, got {head_mask.dtype}")
        if not _lazy(head_mask):
            lo, hi = span(head_mask)
            if not (0 <= lo and hi <= 1):  # NaN fails too
                raise InputError(f"head_mask holds {_shown(lo if not 0 <= lo else hi)}: 1 keeps a head, 0 silences it")
    check_range("input_ids", input_ids, 0, config.vocab_size, f"the model's vocab_size is {config.vocab_size}")
    check_range("token_type_ids", token_type_ids, 0, config.type_vocab_size,
                f"the model's type_vocab_size is {config.type_vocab_size}")


def check_labels(name: str, x, rows: tuple, low=0, high=None, what: str = "", ignore: Optional[int] = None,
                 integer: bool = True) -> None:
    """A head's targets: shaped ``rows`` (a leading [B] may also come as [B, 1]), integers when
    ``integer``, values in [low, high) or ``ignore`` (``high`` None: only finite)."""
    if x is None:
        return
    shape = dims(x)
    if shape != tuple(rows) and not (len(rows) == 1 and shape == (rows[0], 1)):
        raise InputError(f"{name}: shape {list(shape)}, expected {list(rows)}")
    if integer and not _is_int(x):
        raise InputTypeError(f"{name}: expected integer ids, got {getattr(x, 'dtype', None) or np.asarray(x).dtype}")
    if _is_tensor(x) and x.dtype not in _number_dtypes():
        raise InputTypeError(f"{name}: expected numbers, got {x.dtype}")
    if high is None:
        if x is not None and not _lazy(x) and int(np.prod(shape)):
            lo, hi = span(x)
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise InputError(f"{name} holds {_shown(lo if not np.isfinite(lo) else hi)}: targets must be finite")
        return
    check_range(name, x, low, high, what, ignore)


# --------------------------------------------------------------------------- each head's targets


def check_pretraining_targets(config: BertConfig, B: int, S: int, masked_lm_positions=None, masked_lm_ids=None,
                              masked_lm_weights=None, labels=None, next_sentence_labels=None) -> None:
    """BertForPreTraining's: positions int [B, P] in [0, S) (P >= 1); ``masked_lm_ids`` (and
    ``masked_lm_weights``, finite) shaped like the MLM logits' rows, [B, P] with positions, else
    [B, S], ids in [0, vocab_size); transformers' ``labels`` the same, -100 ignored; next-sentence
    labels [B] of 0 / 1."""
    rows = (B, S)
    if masked_lm_positions is not None:
        shape = dims(masked_lm_positions)
        if len(shape) != 2 or shape[0] != B or shape[1] == 0:
            raise InputError(f"masked_lm_positions: shape {list(shape)}, expected [{B}, P] with P >= 1 "
                             f"(the positions predicted in each sequence)")
        check_labels("masked_lm_positions", masked_lm_positions, shape, 0, S,
                     f"positions index a sequence of {S} tokens")
        rows = shape
    vocab = f"the model's vocab_size is {config.vocab_size}"
    check_labels("masked_lm_ids", masked_lm_ids, rows, 0, config.vocab_size, vocab)
    check_labels("masked_lm_weights", masked_lm_weights, rows, integer=False)
    check_labels("labels", labels, rows, 0, config.vocab_size, vocab, ignore=IGNORE_INDEX)
    check_labels("next_sentence_labels", next_sentence_labels, (B,), 0, 2,
                 "next-sentence labels are 0 (is next) or 1 (random)")


def check_classifier_targets(config: BertConfig, kind: str, B: int, S: int, labels) -> None:
    """A ``classifier`` head's labels, as its loss reads them (see the module doc): ``kind``
    "sequence" [B] (regression: finite floats; multi-label: [B, K] in [0, 1]) or "token" [B, S]."""
    K = config.num_labels
    what = f"the classifier has num_labels {K} (class ids 0..{K - 1})"
    if kind == "token":
        check_labels("labels", labels, (B, S), 0, K, what, ignore=IGNORE_INDEX)
    elif K == 1:
        check_labels("labels", labels, (B,), integer=False)
    elif config.problem_type == "multi_label_classification":
        check_labels("labels", labels, (B, K), integer=False)
        if labels is not None and not _lazy(labels):
            lo, hi = span(labels)
            if not (0 <= lo and hi <= 1):
                raise InputError(f"labels holds {_shown(lo if not 0 <= lo else hi)}: multi-label targets are "
                                 f"0 or 1 for each of the {K} classes")
    else:
        check_labels("labels", labels, (B,), 0, K, what, ignore=IGNORE_INDEX)


def check_span_targets(B: int, S: int, start_positions=None, end_positions=None) -> None:
    """SQuAD's start/end positions: integers [B] in [0, S) (run_squad's one-hot of depth S)."""
    for name, x in (("start_positions", start_positions), ("end_positions", end_positions)):
        check_labels(name, x, (B,), 0, S, f"positions index a sequence of {S} tokens")
