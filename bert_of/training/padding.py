"""Padding to the batch, not to the maximum: how wide a batch of rows needs to be, and rows cut to it.

Features are made [n, max_seq_length] (run_classifier / run_squad zero-pad every row), but BERT
with an attention mask computes the same outputs at a row's real positions whatever padding follows
them (the mask adds -10000 before the softmax: exp of it is 0 in float32). So a batch runs at its
longest row's width (rounded up to :data:`PAD_MULTIPLE`), as transformers' DataCollatorWithPadding
and its pipelines do; ``--max-seq-length`` is only the cap. Rows grouped by length (sorted) make
batches of similar rows, so little padding is left; outputs go back to the input order.
"""

from __future__ import annotations

import numpy as np

# Batch widths are rounded up to a multiple of this many tokens: fewer distinct shapes, and
# tensor-core / SIMD friendly widths (transformers' pad_to_multiple_of=8), at <= 7 tokens a row.
PAD_MULTIPLE = 8


def row_lengths(attention_mask: np.ndarray) -> np.ndarray:
    """Real tokens per row [n] of an attention mask [n, S] (ones, then padding zeros)."""
    return np.asarray(attention_mask).sum(axis=1).astype(np.int64)


def padded_width(lengths, cap: int, multiple: int = PAD_MULTIPLE) -> int:
    """The width a batch of rows of ``lengths`` runs at: its longest row rounded up to ``multiple``,
    at least ``multiple`` (or 1 row of 1 token), at most ``cap`` (the features' width)."""
    longest = int(np.max(lengths)) if len(lengths) else 1
    return int(min(cap, max(multiple, -(-max(longest, 1) // multiple) * multiple)))


def cut(arrays: dict, width: int, full: int) -> dict:
    """``arrays`` (named batch arrays) with every [n, full, ...] one cut to its first ``width``
    positions (input ids, segments, mask, token labels); others (class labels, answer positions)
    as they are. Views, no copy."""
    if width >= full:
        return dict(arrays)
    return {k: (a[:, :width] if getattr(a, "ndim", 0) >= 2 and a.shape[1] == full else a) for k, a in arrays.items()}


def length_batches(lengths: np.ndarray, batch_size: int, cap: int, multiple: int = PAD_MULTIPLE):
    """(row indices, width) of each batch of at most ``batch_size`` rows: rows sorted by length
    (longest first: the largest shapes, and any memory failure, come first; ties in input order),
    each batch as wide as its longest row (:func:`padded_width`). Callers put outputs back at the
    indices, so results are in input order."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    for lo in range(0, len(order), batch_size):
        idx = order[lo:lo + batch_size]
        yield idx, padded_width(lengths[idx], cap, multiple)


# Eager frees as it goes, but a call's [B, heads, L, L] attention tensors still peak with B; a few
# rows per call keep the peak near transformers' (whose CPU attention is fused) at no cost in speed.
EAGER_CPU_BUDGET = 128 * 2 ** 20


def eager_rows(config, length: int, device: str, budget: int = EAGER_CPU_BUDGET) -> int | None:
    """Rows per eager CPU call over ``length`` tokens (None: no limit): eager holds about three
    [heads, L, L] tensors and a few [L, I] / [L, H] ones of one layer at a time."""
    if device != "cpu":
        return None
    c = config
    per_row = 4 * (3 * c.num_attention_heads * length * length + 2 * length * c.intermediate_size
                   + 6 * length * c.hidden_size)
    return max(1, int(budget // per_row))


class Gathered:
    """The outputs of batches run in any order, put back in input order: one float32 array per
    output name, [n, ...]; the names in ``positions`` have a position axis and come back ``width``
    wide, ``fill`` at the positions a batch did not compute (past its longest row). What every
    engine's ``infer`` returns (:mod:`bert_of.training.inference`, onnxruntime's)."""

    def __init__(self, names, n: int, width: int, positions=(), fill: float = 0.0):
        self.names, self.n, self.width, self.positions, self.fill = tuple(names), n, width, positions, fill
        self.arrays = [None] * len(self.names)

    def put(self, idx, values) -> None:
        """The rows ``idx`` (indices into the input) of each output (``values``, in ``names``'
        order, at least ``len(idx)`` rows: padding rows past them are dropped)."""
        real = len(idx)
        for j, (name, v) in enumerate(zip(self.names, values)):
            v = np.asarray(v)[:real].astype(np.float32)
            if self.arrays[j] is None:
                at = name in self.positions
                shape = (self.n, self.width, *v.shape[2:]) if at else (self.n, *v.shape[1:])
                self.arrays[j] = np.full(shape, self.fill, np.float32) if at else np.zeros(shape, np.float32)
            if name in self.positions:
                self.arrays[j][idx, :v.shape[1]] = v
            else:
                self.arrays[j][idx] = v
