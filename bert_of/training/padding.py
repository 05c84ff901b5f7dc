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
