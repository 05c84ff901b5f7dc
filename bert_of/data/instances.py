"""Google's masked-LM / next-sentence instances over a token-id :class:`~bert_of.data.text.Corpus`.

The algorithm and its random stream are those of google-research/bert's
``create_pretraining_data.py`` (Python's ``random.Random``, called in exactly Google's order),
but an instance is kept as two ranges of the corpus plus its masked positions, never as lists
of token strings:

* A (and B) are whole consecutive sentences of one document, so each is one contiguous range
  ``ids[start:start + length]``; truncation only moves the range ends (Google deletes list
  heads one at a time: quadratic on long lines).
* ``[CLS]``/``[SEP]`` are only ever at positions 0, ``len(A) + 1`` and ``n - 1``, so the
  masking candidates are known without looking at tokens (whole-word masking reads the
  ``##`` flags of the two ranges).
* The records are assembled afterwards, many at a time, by NumPy indexing (:func:`assemble`).
"""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from .text import Corpus

KEEP = -1  # masked position whose token stays as it is (Google's 10% "keep")


@dataclass
class Instances:
    """N instances, column-wise. Instance i: ``[CLS] A [SEP] B [SEP]`` with
    A = ids[a_start[i]:a_start[i] + a_len[i]], B likewise; its masked positions are
    mask_pos[mask_first[i]:mask_first[i] + mask_count[i]] (sorted), each replaced by
    mask_new (a token id, or KEEP)."""

    a_start: np.ndarray  # int64 [N]
    a_len: np.ndarray    # int64 [N]
    b_start: np.ndarray  # int64 [N]
    b_len: np.ndarray    # int64 [N]
    random_next: np.ndarray  # uint8 [N]
    mask_count: np.ndarray   # int64 [N]
    mask_first: np.ndarray   # int64 [N]
    mask_pos: np.ndarray     # int32 [total masks]
    mask_new: np.ndarray     # int32 [total masks]

    def __len__(self) -> int:
        return len(self.a_start)


@dataclass
class MaskingVocab:
    """What masking needs to know of the vocabulary, as ids."""

    mask_id: int
    words: Sequence[int]  # Google's vocab_words (vocab.keys() in file order) as ids: random replacements
    is_subword: Optional[np.ndarray] = None  # bool [max id + 1]: token starts with "##" (whole-word masking)


def shuffle(x: list, getrandbits) -> None:
    """``random.Random.shuffle(x)`` with its ``_randbelow`` inlined (2x faster, the same draws:
    CPython's Fisher-Yates with rejection sampling on ``getrandbits``; tested against it)."""
    for i in range(len(x) - 1, 0, -1):
        n = i + 1
        k = n.bit_length()
        j = getrandbits(k)
        while j >= n:
            j = getrandbits(k)
        x[i], x[j] = x[j], x[i]


def randint(a: int, b: int, getrandbits) -> int:
    """``random.Random.randint(a, b)`` (= a + _randbelow(b - a + 1)), the same draws."""
    n = b - a + 1
    k = n.bit_length()
    r = getrandbits(k)
    while r >= n:
        r = getrandbits(k)
    return a + r


def truncate_pair(a_lo: int, a_hi: int, b_lo: int, b_hi: int, max_num_tokens: int, rng: random.Random):
    """Google's ``truncate_seq_pair`` on ranges: the longer side loses its first or last token
    (coin flip) until the pair fits. Returns the new (a_lo, a_hi, b_lo, b_hi)."""
    la, lb = a_hi - a_lo, b_hi - b_lo
    coin = rng.random
    while la + lb > max_num_tokens:
        if la > lb:
            if coin() < 0.5:
                a_lo += 1
            else:
                a_hi -= 1
            la -= 1
        else:
            if coin() < 0.5:
                b_lo += 1
            else:
                b_hi -= 1
            lb -= 1
    return a_lo, a_hi, b_lo, b_hi


def mask_positions(la: int, lb: int, num_to_predict: int, rng: random.Random, vocab: MaskingVocab,
                   subword: Optional[np.ndarray] = None):
    """Google's ``create_masked_lm_predictions`` for ``[CLS] A [SEP] B [SEP]`` with len(A) = la,
    len(B) = lb: [(position, replacement id or KEEP)] sorted by position.

    ``subword``: bool [la + lb], whether each token of A then B starts with "##" (whole-word
    masking); None: every token is its own candidate.
    """
    n = la + lb + 3
    positions = list(range(1, la + 1))
    positions += range(la + 2, n - 1)
    random_, bits = rng.random, rng.getrandbits
    out = []
    if subword is None:
        shuffle(positions, bits)  # Google shuffles [[i], ...]: the same permutation
        chosen = positions[:num_to_predict]
    else:
        starts = np.flatnonzero(~subword)  # a word starts at every token not "##..."
        if subword[0]:  # and at the first candidate, "##" or not (no word to join yet)
            starts = np.concatenate(([0], starts))
        bounds = starts.tolist() + [len(positions)]
        groups = list(range(len(bounds) - 1))
        shuffle(groups, bits)
        chosen = []
        for g in groups:
            if len(chosen) >= num_to_predict:
                break
            size = bounds[g + 1] - bounds[g]
            if len(chosen) + size > num_to_predict:
                continue  # a whole word that would not fit is skipped, not cut
            chosen += positions[bounds[g]:bounds[g + 1]]
    words, last = vocab.words, len(vocab.words) - 1
    for p in chosen:
        if random_() < 0.8:
            out.append((p, vocab.mask_id))
        elif random_() < 0.5:
            out.append((p, KEEP))
        else:
            out.append((p, words[randint(0, last, bits)]))
    out.sort()
    return out


def create_instances(corpus: Corpus, max_seq_length: int, max_predictions_per_seq: int, masked_lm_prob: float,
                     short_seq_prob: float, dupe_factor: int, rng: random.Random, vocab: MaskingVocab,
                     on_document: Optional[Callable[[], None]] = None) -> Instances:
    """Google's ``create_training_instances`` after reading: shuffle the documents, then
    ``dupe_factor`` passes of ``create_instances_from_document`` over them (creation order;
    the final shuffle is the caller's ``rng.shuffle`` of ``range(len(instances))``)."""
    D = corpus.num_documents
    sent = corpus.sentence_ends
    ends = memoryview(np.ascontiguousarray(sent, dtype=np.int64))  # Python ints without per-document lists
    doc_ends = memoryview(np.ascontiguousarray(corpus.document_ends, dtype=np.int64))
    ids = corpus.ids
    order = list(range(D))
    bits = rng.getrandbits
    shuffle(order, bits)  # Google shuffles the list of documents: the same permutation
    max_num_tokens = max_seq_length - 3
    random_ = rng.random
    cols = {k: array("q") for k in ("a_start", "a_len", "b_start", "b_len", "mask_count")}
    nsp = array("B")
    mask_pos, mask_new = array("i"), array("i")
    wwm = vocab.is_subword is not None

    for _ in range(dupe_factor):
        for di in range(D):
            d = order[di]
            g0, last = doc_ends[d], doc_ends[d + 1] - 1  # the document's sentences (corpus-wide numbers)
            target = max_num_tokens
            if random_() < short_seq_prob:
                target = randint(2, max_num_tokens, bits)
            first = i = g0  # the current chunk is sentences first..i
            while i <= last:
                if i == last or ends[i + 1] - ends[first] >= target:
                    n_chunk = i - first + 1
                    a_end = randint(1, n_chunk - 1, bits) if n_chunk >= 2 else 1
                    a_lo, a_hi = ends[first], ends[first + a_end]
                    if n_chunk == 1 or random_() < 0.5:
                        is_random = 1
                        target_b = target - (a_hi - a_lo)
                        for _ in range(10):  # try to avoid the current document
                            rdi = randint(0, D - 1, bits)
                            if rdi != di:
                                break
                        r = order[rdi]
                        r0, r1 = doc_ends[r], doc_ends[r + 1]
                        start = r0 + randint(0, r1 - r0 - 1, bits)
                        b_lo = ends[start]
                        # sentences start.. until B reaches target_b (at least one), as Google's loop
                        k = int(np.searchsorted(sent, b_lo + target_b, side="left"))
                        b_hi = ends[min(max(k, start + 1), r1)]
                        i -= n_chunk - a_end  # the unused sentences go back into the stream
                    else:
                        is_random = 0
                        b_lo, b_hi = a_hi, ends[i + 1]
                    a_lo, a_hi, b_lo, b_hi = truncate_pair(a_lo, a_hi, b_lo, b_hi, max_num_tokens, rng)
                    la, lb = a_hi - a_lo, b_hi - b_lo
                    num = min(max_predictions_per_seq, max(1, int(round((la + lb + 3) * masked_lm_prob))))
                    sub = None
                    if wwm:
                        sub = vocab.is_subword[np.concatenate((ids[a_lo:a_hi], ids[b_lo:b_hi]))]
                    masks = mask_positions(la, lb, num, rng, vocab, sub)
                    cols["a_start"].append(a_lo)
                    cols["a_len"].append(la)
                    cols["b_start"].append(b_lo)
                    cols["b_len"].append(lb)
                    cols["mask_count"].append(len(masks))
                    nsp.append(is_random)
                    for p, new in masks:
                        mask_pos.append(p)
                        mask_new.append(new)
                    first = i + 1
                i += 1
            if on_document is not None:
                on_document()

    def col(a, dtype):
        return np.frombuffer(a, dtype=dtype).copy() if len(a) else np.zeros(0, dtype=dtype)

    count = col(cols["mask_count"], np.int64)
    return Instances(col(cols["a_start"], np.int64), col(cols["a_len"], np.int64), col(cols["b_start"], np.int64),
                     col(cols["b_len"], np.int64), col(nsp, np.uint8), count, np.cumsum(count) - count,
                     col(mask_pos, np.int32), col(mask_new, np.int32))


def assemble(ids: np.ndarray, inst: Instances, rows: np.ndarray, max_seq_length: int, max_predictions: int,
             cls_id: int, sep_id: int) -> Dict[str, np.ndarray]:
    """The features of instances ``rows`` (in that order), as Google writes them:

    input_ids, input_mask, segment_ids  int32 [len(rows), max_seq_length] (0-padded)
    masked_lm_positions, masked_lm_ids  int32 [len(rows), max_predictions]  (0-padded)
    masked_lm_weights                   float32 [len(rows), max_predictions] (1.0 real, 0.0 padding)
    next_sentence_labels                int32 [len(rows), 1]  (1: B is random)
    """
    S, P = max_seq_length, max_predictions
    B = len(rows)
    la, lb = inst.a_len[rows][:, None], inst.b_len[rows][:, None]
    a0, b0 = inst.a_start[rows][:, None], inst.b_start[rows][:, None]
    pos = np.arange(S)[None, :]
    n = la + lb + 3
    in_a = (pos >= 1) & (pos <= la)
    in_b = (pos >= la + 2) & (pos < n - 1)
    src = np.where(in_a, a0 + pos - 1, np.where(in_b, b0 + pos - la - 2, 0))
    input_ids = np.where(in_a | in_b, ids[src] if ids.size else 0, 0).astype(np.int32)
    r = np.arange(B)
    input_ids[:, 0] = cls_id
    input_ids[r, la[:, 0] + 1] = sep_id
    input_ids[r, n[:, 0] - 1] = sep_id
    input_mask = (pos < n).astype(np.int32)
    segment_ids = ((pos >= la + 2) & (pos < n)).astype(np.int32)

    count = inst.mask_count[rows]
    total = int(count.sum())
    row = np.repeat(r, count)
    col = np.arange(total) - np.repeat(np.cumsum(count) - count, count)  # index within the instance
    entry = np.repeat(inst.mask_first[rows], count) + col
    mpos = inst.mask_pos[entry]
    mnew = inst.mask_new[entry]
    labels = input_ids[row, mpos]
    input_ids[row, mpos] = np.where(mnew == KEEP, labels, mnew)
    positions = np.zeros((B, P), dtype=np.int32)
    masked_ids = np.zeros((B, P), dtype=np.int32)
    weights = np.zeros((B, P), dtype=np.float32)
    positions[row, col] = mpos
    masked_ids[row, col] = labels
    weights[row, col] = 1.0
    return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids,
            "masked_lm_positions": positions, "masked_lm_ids": masked_ids, "masked_lm_weights": weights,
            "next_sentence_labels": inst.random_next[rows].astype(np.int32)[:, None]}
