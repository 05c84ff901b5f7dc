"""Per-rank, deterministic, resumable reading of BERT pretraining datasets as NumPy batches.

The files, their order and each rank's shard are :mod:`bert_of.data.layout`'s. Records carry
the features of Google's pretraining data:

    input_ids, input_mask, segment_ids        int32 [seq_length]
    masked_lm_positions, masked_lm_ids        int32 [max_predictions]
    masked_lm_weights                         float [max_predictions]
    next_sentence_labels                      int32 [1]

(int64 lists are accepted too.) Records are visited in part order, or (``shuffle=True``) in a
permutation drawn from ``(seed, epoch, rank)``; epochs follow one another without a gap, so
every batch is full and records are never dropped. :func:`check_batch` is the one range check
of decoded records (OneFlow's own reader, :mod:`bert_of.data.oneflow_reader`, uses it too).
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from .formats import feature_kind_problem, open_record_file
from .layout import META_FILE, DatasetError, list_data_files, read_meta, shard_parts
from .ofrecord import OFRecordError, decode_values, decode_varint_runs

__all__ = ["PretrainingDataset", "FEATURES", "DEFAULT_TYPE_VOCAB_SIZE", "check_batch", "iter_dataset"]

DEFAULT_TYPE_VOCAB_SIZE = 2  # BERT's: segment A = 0, B = 1

# name -> (output dtype, length: "seq" | "pred" | 1)
FEATURES = {
    "input_ids": (np.int64, "seq"),
    "input_mask": (np.int64, "seq"),
    "segment_ids": (np.int64, "seq"),
    "masked_lm_positions": (np.int64, "pred"),
    "masked_lm_ids": (np.int64, "pred"),
    "masked_lm_weights": (np.float32, "pred"),
    "next_sentence_labels": (np.int64, 1),
}


def check_batch(batch: Dict[str, np.ndarray], seq_length: int, vocab_size: Optional[int] = None,
                type_vocab_size: Optional[int] = DEFAULT_TYPE_VOCAB_SIZE) -> Optional[Tuple[int, str]]:
    """(row, what is wrong) for the first record of a decoded batch whose values a model cannot
    take, or None. Vectorised over the batch; ``batch`` holds [b, ...] arrays as
    :meth:`PretrainingDataset.next_batch` returns them.

    input_ids/masked_lm_ids in [0, vocab_size); input_mask 0/1; segment_ids in
    [0, type_vocab_size); masked_lm_positions in [0, seq_length); masked_lm_weights finite
    in [0, 1]; next_sentence_labels 0/1. (OneFlow aborts the process on an out-of-range
    gather; segment or label values out of range would train silently.)
    """
    ids_top = f" (vocab_size {vocab_size}): data and model vocab disagree" if vocab_size else ""
    checks = [
        ("input_ids", 0, vocab_size, lambda v: f"input_ids has id {v} outside the model's vocabulary{ids_top}"),
        ("masked_lm_ids", 0, vocab_size,
         lambda v: f"masked_lm_ids has id {v} outside the model's vocabulary{ids_top}"),
        ("input_mask", 0, 2, lambda v: f"input_mask has {v}, expected 0 or 1"),
        ("segment_ids", 0, type_vocab_size,
         lambda v: f"segment_ids has {v}, outside 0..{type_vocab_size - 1} (type_vocab_size {type_vocab_size})"
         if type_vocab_size else f"segment_ids has {v}, a negative segment"),
        ("masked_lm_positions", 0, seq_length,
         lambda v: f"masked_lm_positions has {v}, outside the sequence of {seq_length} tokens"),
        ("next_sentence_labels", 0, 2, lambda v: f"next_sentence_labels is {v}, expected 0 or 1"),
    ]
    first = None
    for name, lo, hi, say in checks:
        v = batch[name].reshape(len(batch[name]), -1)
        out = v < lo if hi is None else (v < lo) | (v >= hi)
        rows = np.flatnonzero(out.any(axis=1))
        if rows.size and (first is None or rows[0] < first[0]):
            r = int(rows[0])
            first = (r, say(int(v[r][out[r]][0])))
    w = batch["masked_lm_weights"].reshape(len(batch["masked_lm_weights"]), -1)
    out = ~(np.isfinite(w) & (w >= 0) & (w <= 1))
    rows = np.flatnonzero(out.any(axis=1))
    if rows.size and (first is None or rows[0] < first[0]):
        r = int(rows[0])
        first = (r, f"masked_lm_weights has {float(w[r][out[r]][0])}, expected a finite weight in [0, 1]")
    return first


class PretrainingDataset:
    """Batches of one rank's shard as NumPy arrays; deterministic and exactly resumable.

    >>> ds = PretrainingDataset("wiki_128/", batch_size=32, seq_length=128, max_predictions=20,
    ...                         rank=r, world_size=k, shuffle=True, seed=0)
    >>> batch = ds.next_batch()         # input_ids [32, 128] int64, ..., next_sentence_labels [32]
    >>> state = ds.state_dict()         # {"epoch": .., "position": .., ...}: save with the checkpoint
    >>> ds.load_state_dict(state)       # the next batches are the ones that followed the save

    ``batch_size`` is per rank. Every batch is range-checked (:func:`check_batch`) before it is
    returned: a value the model cannot take is an error naming the part file and record.
    ``vocab_size`` and ``type_vocab_size`` are the model's (defaults: the vocabulary size in
    the data's ``bert_of_data.json`` if any, and 2).
    """

    def __init__(self, data_dir: str, batch_size: int, seq_length: int, max_predictions: int, rank: int = 0,
                 world_size: int = 1, shuffle: bool = True, seed: int = 0, *, vocab_size: Optional[int] = None,
                 type_vocab_size: Optional[int] = None, shard: str = "contiguous"):
        if batch_size < 1:
            raise DatasetError(f"batch_size must be at least 1, got {batch_size}")
        if seed < 0:
            raise DatasetError(f"seed must be a non-negative integer, got {seed}")
        self.data_dir = data_dir
        self.batch_size = int(batch_size)
        self.seq_length = int(seq_length)
        self.max_predictions = int(max_predictions)
        self.rank, self.world_size = int(rank), int(world_size)
        self.shuffle, self.seed, self.shard = bool(shuffle), int(seed), shard
        self.vocab_size = vocab_size
        self.type_vocab_size = int(type_vocab_size) if type_vocab_size is not None else DEFAULT_TYPE_VOCAB_SIZE
        paths, self.part_name_suffix_length, self.format = list_data_files(data_dir)
        self._check_meta()
        self.part_indices = shard_parts(len(paths), self.rank, self.world_size, shard)
        self.part_files = [paths[i] for i in self.part_indices]
        self._files: list = []
        try:
            for p in self.part_files:
                # checks every record's framing (and a TFRecord's CRCs, an HDF5 shard's datasets) now, not mid-run
                self._files.append(open_record_file(p, self.format))
        except BaseException:
            self.close()
            raise
        counts = np.array([len(f) for f in self._files], dtype=np.int64)
        self.num_records = int(counts.sum())
        if self.num_records == 0:
            names = ", ".join(os.path.basename(p) for p in self.part_files)
            raise DatasetError(f"{data_dir}: rank {self.rank}'s part file(s) {names} hold no records")
        self._file_of = np.repeat(np.arange(len(self._files)), counts)
        self._index_in_file = np.concatenate([np.arange(c) for c in counts])
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order(0)

    # ------------------------------------------------------------------ checks
    def _check_meta(self) -> None:
        meta = read_meta(self.data_dir)
        if not meta:
            return
        feats = meta.get("features", {})
        where = os.path.join(self.data_dir, META_FILE)
        for name, want, what in (("input_ids", self.seq_length, "seq_length"),
                                 ("masked_lm_ids", self.max_predictions, "max_predictions")):
            shape = feats.get(name, [None, [want]])[1]
            if shape and shape[0] != want:
                raise DatasetError(f"{where}: records have {what} {shape[0]}, the reader was asked for {want}")
        vocab = meta.get("vocab") if isinstance(meta.get("vocab"), dict) else {}
        size = vocab.get("size")
        if self.vocab_size is not None and size not in (None, self.vocab_size):
            raise DatasetError(f"{where}: the data was made with a {size}-token vocabulary "
                               f"({vocab.get('source') or vocab.get('file')}), the model has vocab_size {self.vocab_size}")
        if self.vocab_size is None and isinstance(size, int) and size > 0:
            self.vocab_size = size  # the data's own: ids must be below it

    # ------------------------------------------------------------------ order
    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_records)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch, self.rank])))
        return rng.permutation(self.num_records)

    def __len__(self) -> int:
        """Records in this rank's shard (one epoch)."""
        return self.num_records

    @property
    def batches_per_epoch(self) -> float:
        return self.num_records / self.batch_size

    # ------------------------------------------------------------------ records
    def _length(self, length) -> int:
        return self.seq_length if length == "seq" else self.max_predictions if length == "pred" else 1

    def _parse(self, k: int):
        f = self._files[int(self._file_of[k])]
        i = int(self._index_in_file[k])
        raw, fields = f.parse(i)  # a bytes copy, its structure (an unparsable record names file and record)
        for name in FEATURES:
            if name not in fields:
                raise OFRecordError(f"{f.path}: record {i} has no feature {name!r} "
                                    f"(it has: {', '.join(sorted(fields)) or 'none'})")
            why = feature_kind_problem(name, fields[name][0])
            if why:
                raise OFRecordError(f"{f.path}: record {i}: {why}")
        return raw, fields

    def _gather_hdf5(self, idx: Sequence[int]) -> Dict[str, np.ndarray]:
        """Rows ``idx`` of HDF5 shards (read per file, in one sorted read each)."""
        idx = np.asarray(idx, dtype=np.int64)
        files = self._file_of[idx]
        batch = {}
        for fi in np.unique(files):
            f, sel = self._files[int(fi)], np.flatnonzero(files == fi)
            for name, (dtype, length) in FEATURES.items():
                n = self._length(length)
                if f.width(name) != n:
                    what = {"seq": "seq_length", "pred": "max_predictions"}.get(length, "1")
                    raise OFRecordError(f"{f.path}: record 0: feature {name!r} has {f.width(name)} values, "
                                        f"expected {n} ({what})")
            rows = f.rows(self._index_in_file[idx[sel]])
            for name, (dtype, length) in FEATURES.items():
                if name not in batch:
                    batch[name] = np.empty((len(idx), self._length(length)), dtype=dtype)
                batch[name][sel] = rows[name].reshape(len(sel), -1)
        return batch

    def _decode_batch(self, idx: Sequence[int]) -> Dict[str, np.ndarray]:
        batch = self._gather_hdf5(idx) if self.format == "hdf5" else self._gather_records(idx)
        # the one validation point of every format's records
        bad = check_batch(batch, self.seq_length, self.vocab_size, self.type_vocab_size)
        if bad is not None:
            path, i = self.record_location(int(idx[bad[0]]))
            raise OFRecordError(f"{path}: record {i}: {bad[1]}")
        batch["next_sentence_labels"] = batch["next_sentence_labels"].reshape(-1)
        return batch

    def _gather_records(self, idx: Sequence[int]) -> Dict[str, np.ndarray]:
        """Records ``idx`` of protobuf formats (OFRecord, tf.train.Example), decoded many at once."""
        parsed = [self._parse(int(k)) for k in idx]
        batch = {}
        for name, (dtype, length) in FEATURES.items():
            n = self._length(length)
            kinds = {fields[name][0] for _, fields in parsed}
            packed = all(w == 2 for _, fields in parsed for w, _, _ in fields[name][1])
            values = counts = None
            try:
                if packed and kinds <= {"int32", "int64"}:
                    runs, per_rec = [], []
                    for raw, fields in parsed:
                        spans = fields[name][1]
                        runs.extend(raw[s:e] for _, s, e in spans)
                        per_rec.append(len(spans))
                    vals, run_counts = decode_varint_runs(runs)
                    counts = np.add.reduceat(run_counts, np.cumsum([0] + per_rec[:-1])) if runs else \
                        np.zeros(len(parsed), dtype=np.int64)
                    counts[np.asarray(per_rec) == 0] = 0
                    values = vals.view(np.int64)
                elif packed and kinds == {"float"}:
                    chunks = [raw[s:e] for raw, fields in parsed for _, s, e in fields[name][1]]
                    sizes = [sum(e - s for _, s, e in fields[name][1]) for raw, fields in parsed]
                    if any(sz % 4 for sz in sizes):
                        raise ValueError("packed float payload is not a multiple of 4 bytes")
                    values = np.frombuffer(b"".join(chunks), dtype="<f4")
                    counts = np.asarray(sizes) // 4
            except ValueError:
                values = None  # find and name the bad record below
            if values is None:  # unusual encodings (unpacked, double, mixed) or an error: one by one
                per = []
                for k, (raw, fields) in zip(idx, parsed):
                    kind, spans = fields[name]
                    try:
                        per.append(decode_values(raw, kind, spans))
                    except ValueError as e:
                        path, i = self.record_location(int(k))
                        raise OFRecordError(f"{path}: record {i}: feature {name!r} is corrupt ({e})") from None
                counts = np.array([v.size for v in per])
                values = np.concatenate(per) if per else np.zeros(0)
            bad = np.flatnonzero(counts != n)
            if bad.size:
                path, i = self.record_location(int(idx[bad[0]]))
                what = {"seq": "seq_length", "pred": "max_predictions"}.get(length, "1")
                raise OFRecordError(f"{path}: record {i}: feature {name!r} has {int(counts[bad[0]])} values, "
                                    f"expected {n} ({what})")
            arr = values.reshape(len(parsed), n)
            if np.issubdtype(arr.dtype, np.integer) and "int32" in kinds:
                arr = arr.astype(np.int32)  # protobuf's int32: low 32 bits
            batch[name] = arr.astype(dtype, copy=False)
        return batch

    def record(self, k: int) -> Dict[str, np.ndarray]:
        """Record ``k`` of this rank's shard (shard order, not shuffled), decoded and checked."""
        b = self._decode_batch([k])
        return {name: v[0] for name, v in b.items()}

    def record_location(self, k: int) -> Tuple[str, int]:
        """(part file, record index in it) of shard record ``k``."""
        return self._files[int(self._file_of[k])].path, int(self._index_in_file[k])

    def validate(self) -> int:
        """Decode and check every record of this shard (shapes, features, value ranges); returns the count."""
        for lo in range(0, self.num_records, 1024):
            self._decode_batch(range(lo, min(lo + 1024, self.num_records)))
        return self.num_records

    # ------------------------------------------------------------------ batches
    def next_indices(self, n: int) -> np.ndarray:
        """Shard record numbers of the next ``n`` records of the stream (advances it)."""
        out = []
        while n > 0:
            if self.position >= self.num_records:
                self.epoch += 1
                self.position = 0
                self._order = self._epoch_order(self.epoch)
            take = min(n, self.num_records - self.position)
            out.append(self._order[self.position:self.position + take])
            self.position += take
            n -= take
        return np.concatenate(out)

    def next_batch(self) -> Dict[str, np.ndarray]:
        """The next ``batch_size`` records as arrays: ids/masks int64 [b, S] / [b, P],
        ``masked_lm_weights`` float32 [b, P], ``next_sentence_labels`` int64 [b]."""
        return self._decode_batch(self.next_indices(self.batch_size))

    def __iter__(self):
        while True:
            yield self.next_batch()

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """Where the stream is; with the same dataset/rank/seed, ``load_state_dict`` continues it exactly."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "shuffle": self.shuffle,
                "rank": self.rank, "world_size": self.world_size, "shard": self.shard,
                "num_records": self.num_records,
                "parts": [os.path.basename(p) for p in self.part_files]}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "shuffle", "rank", "world_size", "shard", "num_records", "parts"):
            if key in state and state[key] != self.state_dict()[key]:
                raise DatasetError(f"{self.data_dir}: cannot resume: saved {key} {state[key]!r} != current "
                                   f"{self.state_dict()[key]!r} (the dataset or its sharding changed)")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.num_records:
            raise DatasetError(f"{self.data_dir}: cannot resume: position {position} of epoch {epoch} is outside "
                               f"the {self.num_records} records of this shard")
        self.epoch, self.position = epoch, position
        self._order = self._epoch_order(epoch)

    # ------------------------------------------------------------------ cleanup
    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def iter_dataset(spec: str, features: Optional[Sequence[str]] = None):
    """Every record of a dataset (OFRecord, TFRecord or HDF5; a directory or glob), file by file in
    order, as ``{feature: NumPy array}``; ``features`` (default: Google's seven) picks them.

    >>> for rec in iter_dataset("tf_examples.tfrecord*"):
    ...     rec["input_ids"]            # int64 [seq_length]; masked_lm_weights float32 [max_predictions]

    Each record is decoded by its file's own reader (framing, CRCs, protobuf) but not range-checked;
    :class:`PretrainingDataset` checks values against a model.
    """
    from .formats import iter_file_batches

    paths, _, fmt = list_data_files(spec)
    names = list(features or FEATURES)
    for p in paths:
        with open_record_file(p, fmt) as f:
            for chunk in iter_file_batches(f, names, 256):
                for r in range(len(chunk[names[0]])):
                    yield {k: chunk[k][r].astype(FEATURES[k][0], copy=False) if k in FEATURES else chunk[k][r]
                           for k in names}
