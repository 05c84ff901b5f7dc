"""A BERT pretraining dataset on disk: which files it holds, in which order, which of them each
rank reads, and what bert_of recorded about it (``bert_of_data.json``, its vocab.txt, its lengths).

A dataset is a directory of OFRecord part files ``part-0, part-1, ...`` or ``part-00000, ...``
(OneFlow's naming: prefix + index, optionally zero-padded), or a directory or glob of TFRecord
files (google-research/bert's, plain or gzip) or NVIDIA HDF5 shards (:mod:`bert_of.data.formats`),
detected by content; every file is one "part". Sharding follows OneFlow's own ``OFRecordReader``
in global mode: rank ``r`` of ``k`` reads a contiguous block of parts, the first ``N % k`` ranks
one part more (``BalancedSplitter``); ``shard="round_robin"`` gives rank r the parts
``i % k == r`` instead. Ranks never share a part, so with ``N >= k`` parts the ranks see
disjoint data. Reading the records is :mod:`bert_of.data.reader`'s job.
"""

from __future__ import annotations

import glob
import os
import re
from typing import List, Optional, Tuple

import numpy as np

from bert_of.errors import BertOfError
from bert_of.files.reading import read_json, sha256_file
from bert_of.files.owned import register_own_files

from .formats import detect, open_record_file

__all__ = ["DatasetError", "META_FILE", "list_part_files", "list_data_files", "shard_parts", "read_meta",
           "dataset_vocab", "data_lengths"]

_PART_RE = re.compile(r"^part-(\d+)$")
META_FILE = "bert_of_data.json"
register_own_files((META_FILE,), (r"part-\d+",))


class DatasetError(BertOfError):
    """A dataset directory that does not fit the reader (missing parts, shapes, sharding)."""


def list_part_files(data_dir: str) -> Tuple[List[str], int]:
    """(paths of part-0 .. part-(N-1) in index order, OneFlow ``part_name_suffix_length``)."""
    if not os.path.isdir(data_dir):
        raise DatasetError(f"{data_dir}: dataset directory not found")
    found = {}
    digits = []
    for name in os.listdir(data_dir):
        m = _PART_RE.match(name)
        if m and os.path.isfile(os.path.join(data_dir, name)):
            i = int(m.group(1))
            if i in found:
                raise DatasetError(f"{data_dir}: two part files with index {i} ({found[i]}, {name})")
            found[i] = name
            digits.append(m.group(1))
    if not found:
        raise DatasetError(f"{data_dir}: no OFRecord part files (expected part-0, part-1, ... or part-00000, ...)")
    n = len(found)
    missing = [i for i in range(n) if i not in found]
    if missing:
        raise DatasetError(f"{data_dir}: part files are not numbered 0..{n - 1}: part {missing[0]} is missing "
                           f"(highest is {max(found)})")
    for i in range(n):
        if os.path.getsize(os.path.join(data_dir, found[i])) == 0:
            raise DatasetError(f"{os.path.join(data_dir, found[i])}: empty part file (0 bytes): a reader would "
                               f"skip it silently; remove it and renumber, or re-create the data")
    widths = {len(d) for d in digits}
    if all(d == str(int(d)) for d in digits):
        suffix = -1
    elif len(widths) == 1:
        suffix = widths.pop()
    else:
        raise DatasetError(f"{data_dir}: part file names mix zero-padded and unpadded numbers")
    return [os.path.join(data_dir, found[i]) for i in range(n)], suffix


def list_data_files(spec: str) -> Tuple[List[str], int, str]:
    """(record files in order, OneFlow part_name_suffix_length or -1, format) of a dataset given as a
    directory or a glob. A directory of ``part-N`` files is OneFlow's layout; any other directory
    holds its record files (``*.json``, ``*.txt`` and hidden files aside), in natural name order."""
    if os.path.isdir(spec):
        names = [n for n in os.listdir(spec) if os.path.isfile(os.path.join(spec, n))]
        if any(_PART_RE.match(n) for n in names):
            paths, suffix = list_part_files(spec)
        else:
            paths = [os.path.join(spec, n) for n in names if not n.startswith(".") and not n.endswith((".json", ".txt"))]
            suffix = -1
            if not paths:
                raise DatasetError(f"{spec}: no record files (OFRecord part-N files, TFRecords or HDF5 shards)")
    else:
        paths = [p for p in glob.glob(spec) if os.path.isfile(p)]
        suffix = -1
        if not paths:
            raise DatasetError(f"{spec}: no such dataset directory, and no files match it as a pattern")
    if suffix == -1:
        paths.sort(key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p)])
    fmts = {p: detect(p) for p in paths}
    kinds = sorted(set(fmts.values()))
    if len(kinds) > 1:
        first = {k: next(p for p in paths if fmts[p] == k) for k in kinds}
        raise DatasetError(f"{spec}: files of different formats: " + ", ".join(f"{first[k]} is {k}" for k in kinds))
    return paths, suffix, kinds[0]


def shard_parts(num_parts: int, rank: int, world_size: int, shard: str = "contiguous") -> List[int]:
    """Indices of the parts rank ``rank`` reads."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise DatasetError(f"rank {rank} is not in 0..{world_size - 1}")
    if num_parts < world_size:
        raise DatasetError(f"{num_parts} part file(s) for {world_size} ranks: every rank needs at least one part; "
                           f"re-shard with `bert-of data reshard SRC DST --num-parts {world_size}` (or any multiple)")
    if shard == "round_robin":
        return list(range(rank, num_parts, world_size))
    if shard != "contiguous":
        raise ValueError(f"shard must be 'contiguous' or 'round_robin', not {shard!r}")
    base, extra = divmod(num_parts, world_size)  # OneFlow's BalancedSplitter
    start = rank * base + min(rank, extra)
    return list(range(start, start + base + (1 if rank < extra else 0)))


def read_meta(data_dir: str) -> Optional[dict]:
    """``bert_of_data.json`` of a dataset made by bert_of, or None (e.g. data written by OneFlow)."""
    p = os.path.join(data_dir, META_FILE)
    if not os.path.isfile(p):
        return None
    return read_json(p, "dataset metadata", DatasetError)


def dataset_vocab(data_dir: str) -> Optional[str]:
    """The vocab.txt the dataset was made with (its copy beside the parts), or None when the
    data does not record one. A copy that no longer matches its recorded SHA-256 is an error."""
    vocab = (read_meta(data_dir) or {}).get("vocab")
    name = vocab.get("file") if isinstance(vocab, dict) else None
    if not isinstance(name, str) or not name or os.path.basename(name) != name or name in (".", ".."):
        return None
    path = os.path.join(data_dir, name)
    if not os.path.isfile(path):
        return None  # data made before the copy was kept: the name is the original file's
    want = vocab.get("sha256")
    if want and sha256_file(path) != want:
        raise DatasetError(f"{path}: vocabulary changed since the data was made (SHA-256 differs from "
                           f"{os.path.join(data_dir, META_FILE)})")
    return path


def data_lengths(spec: str) -> Tuple[int, int]:
    """(seq_length, max_predictions) of a dataset's records: its bert_of_data.json, else its first record."""
    made = (read_meta(spec) or {}).get("options", {})
    if made.get("max_seq_length") and made.get("max_predictions_per_seq"):
        return int(made["max_seq_length"]), int(made["max_predictions_per_seq"])
    paths, _, fmt = list_data_files(spec)
    with open_record_file(paths[0], fmt) as f:
        if not len(f):
            raise DatasetError(f"{paths[0]}: no records")
        rec = f.record(0)
    for name in ("input_ids", "masked_lm_positions"):
        if name not in rec:
            raise DatasetError(f"{paths[0]}: record 0 has no feature {name!r}: not BERT pretraining data")
    return int(np.asarray(rec["input_ids"]).size), int(np.asarray(rec["masked_lm_positions"]).size)
