"""Masked-LM / next-sentence pretraining data, as google-research/bert's ``create_pretraining_data.py``.

Semantics (each checked against Google's script; ``combine_files=True`` reproduces its
output record for record, tested on a golden file made by running it):

* **Input** (:mod:`bert_of.data.text`): one sentence per line, blank line = document
  boundary; a line whose tokens are empty is skipped. Lines end at ``\\n`` only and are
  ``str.strip()``-ed. Documents without sentences are dropped, the list of documents is
  shuffled. Tokens are Google's FullTokenizer's (:class:`bert_of.tokenization.FastTokenizer`
  computes them at C string speed, proven equal to the reference).
* **Instances** (:mod:`bert_of.data.instances`, per document, ``dupe_factor`` passes over all
  documents): ``max_num_tokens = max_seq_length - 3``; with probability ``short_seq_prob`` the
  target length is ``randint(2, max_num_tokens)``. Sentences are gathered until the target is
  reached; segment A takes ``randint(1, len(chunk) - 1)`` of them; B is the rest (actual next)
  or, with probability 0.5 or when the chunk has one sentence, text from a random other
  document (random next, label 1) and the unused sentences are put back. The pair is
  truncated to ``max_num_tokens`` by removing, from the longer side, the first or last token
  (coin flip). ``[CLS] A [SEP] B [SEP]``, segment ids 0 through the first ``[SEP]``, 1 after.
* **Masking**: candidates are all positions but ``[CLS]``/``[SEP]`` (with whole-word masking,
  ``##`` pieces join the preceding word), shuffled; ``num_to_predict = min(max_predictions_per_seq,
  max(1, round(len(tokens) * masked_lm_prob)))``; a word that would exceed it is skipped; each
  chosen position becomes ``[MASK]`` (80%), stays (10%) or becomes a uniformly random
  vocabulary entry (10%). Positions are sorted; labels are the original tokens.
* **Records**: ``input_ids``/``input_mask``/``segment_ids`` padded with 0 to ``max_seq_length``;
  ``masked_lm_positions``/``masked_lm_ids`` padded with 0 and ``masked_lm_weights`` 1.0 for real
  predictions, 0.0 for padding, to ``max_predictions_per_seq``; ``next_sentence_labels`` 1 for
  random next. All instances are shuffled and dealt round-robin into the part files. Records
  are assembled and serialized thousands at a time with NumPy (:func:`~bert_of.data.ofrecord.encode_records`).
* The random stream is Python's ``random.Random`` used in exactly Google's call order.

Parallelism: by default every input file is its own corpus processed by a worker process with
its own generator, seeded from ``(random_seed, file index)``; each worker writes its records to a
file in the staging folder and the parent deals them, in file order, into the parts: the output
is the same bytes for any number of workers, and memory is bounded by the largest input file
(the processes and their pipes: :mod:`bert_of.data.pool`).
``combine_files=True`` treats all files as one corpus with one generator seeded by
``random_seed`` exactly as Google's script does (random next sentences may then come from any
file; a single process holding the whole corpus).
"""

from __future__ import annotations

import glob
import hashlib
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence

import numpy as np

from bert_of.config import BertConfig
from bert_of.errors import OutputError
from bert_of.files.atomic import write_json
from bert_of.files.publish import publishing
from bert_of.files.reading import sha256_file
from bert_of.files.owned import register_own_files
from bert_of.tokenization import FastTokenizer, FullTokenizer
from bert_of.vocab import vocab_size

from bert_of.options import arg

from .instances import MaskingVocab, assemble, create_instances, shuffle
from .ofrecord import OFRecordWriter, encode_records, iter_raw_records
from .pool import run_pool
from .text import MAX_LINE_CHARS, DataError, read_corpus

DATASET_META = "bert_of_data.json"
DATASET_VOCAB = "vocab.txt"  # the copy of the vocabulary kept beside the parts
PART_FORMAT = "part-{:05d}"
register_own_files((DATASET_META, DATASET_VOCAB), (r"part-\d+",))
FEATURE_KINDS = {"input_ids": "int32", "input_mask": "int32", "segment_ids": "int32",
                 "masked_lm_positions": "int32", "masked_lm_ids": "int32", "masked_lm_weights": "float",
                 "next_sentence_labels": "int32"}
_CHUNK = 4096  # records assembled and serialized at a time

__all__ = ["DataError", "PretrainingOptions", "create_pretraining_data", "make_tokenizer", "expand_inputs",
           "check_output_spares_inputs", "DATASET_META", "DATASET_VOCAB", "PART_FORMAT"]


@dataclass(kw_only=True)
class PretrainingOptions:
    """How instances are made: google-research/bert's create_pretraining_data.py flags, its names
    and defaults (``bert-of data create-pretraining`` generates its options from these fields)."""

    max_seq_length: int = arg(128, metavar="N", help="tokens per instance, [CLS]/[SEP] included")
    max_predictions_per_seq: int = arg(20, metavar="N", help="masked positions per instance at most")
    masked_lm_prob: float = arg(0.15, metavar="P", help="share of tokens to predict")
    short_seq_prob: float = arg(0.1, metavar="P", help="probability of a shorter random target length")
    dupe_factor: int = arg(10, metavar="N", help="passes over the data, each with new masks")
    random_seed: int = arg(12345, metavar="S", help="makes the output reproducible (Google's seed)")
    do_lower_case: bool = arg(True, off=("--no-lower-case", "keep case and accents (cased vocabularies)"),
                              help="lower-case and strip accents (uncased vocabularies)")
    do_whole_word_mask: bool = arg(False, help="mask all WordPieces of a word together")

    def validate(self) -> None:
        if self.max_seq_length < 5:
            raise DataError(f"max_seq_length must be at least 5 ([CLS] A [SEP] B [SEP] with 2 tokens), "
                            f"got {self.max_seq_length}")
        if self.max_predictions_per_seq < 1:
            raise DataError(f"max_predictions_per_seq must be at least 1, got {self.max_predictions_per_seq}")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise DataError(f"masked_lm_prob must be in (0, 1], got {self.masked_lm_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise DataError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if self.dupe_factor < 1:
            raise DataError(f"dupe_factor must be at least 1, got {self.dupe_factor}")


# --------------------------------------------------------------------------- vocabulary / config

REQUIRED_TOKENS = ("[CLS]", "[SEP]", "[MASK]", "[UNK]")


def make_tokenizer(vocab_file: str, do_lower_case: bool):
    """Google's FullTokenizer semantics (literal "[CLS]" etc. in text are split, as Google does)."""
    if not os.path.isfile(vocab_file):
        raise DataError(f"{vocab_file}: vocabulary file not found")
    try:
        tok = FullTokenizer(vocab_file, do_lower_case=do_lower_case, keep_special_tokens=False)
    except UnicodeDecodeError as e:
        raise DataError(f"{vocab_file}: not a UTF-8 text vocabulary ({e.reason} at byte {e.start})") from None
    missing = [t for t in REQUIRED_TOKENS if t not in tok.vocab]
    if missing:
        raise DataError(f"{vocab_file}: vocabulary has no {', '.join(missing)} token(s); pretraining data needs "
                        f"{', '.join(REQUIRED_TOKENS)}")
    return tok


def load_model_config(path: str):
    """A bert_of config.json, Google's bert_config.json, or a directory holding either."""
    if os.path.isdir(path):
        for name in ("config.json", "bert_config.json"):
            if os.path.isfile(os.path.join(path, name)):
                path = os.path.join(path, name)
                break
        else:
            raise DataError(f"{path}: no config.json or bert_config.json in this directory")
    return BertConfig.from_model_json_file(path), path


def check_vocab_against_config(vocab_file: str, config_path: str, max_seq_length: int) -> None:
    cfg, where = load_model_config(config_path)
    n = vocab_size(vocab_file)
    if cfg.vocab_size != n:
        raise DataError(f"{vocab_file} has {n} tokens but {where} says vocab_size {cfg.vocab_size}: "
                        f"use the vocabulary the model was trained with")
    if cfg.max_position_embeddings < max_seq_length:
        raise DataError(f"max_seq_length {max_seq_length} exceeds max_position_embeddings "
                        f"{cfg.max_position_embeddings} of {where}")
    if cfg.type_vocab_size < 2:
        raise DataError(f"{where}: type_vocab_size {cfg.type_vocab_size} < 2, but sentence pairs use segment 1")


# --------------------------------------------------------------------------- inputs


def expand_inputs(patterns: Sequence[str]) -> List[str]:
    """Files named by arguments: paths, comma-separated lists, glob patterns, or directories
    (their regular files, sorted). Order is kept: it decides each file's seed."""
    files: List[str] = []
    for pattern in patterns:
        for pat in (p for p in pattern.split(",") if p):
            if os.path.isdir(pat):
                found = sorted(os.path.join(pat, n) for n in os.listdir(pat)
                               if os.path.isfile(os.path.join(pat, n)) and not n.startswith("."))
                if not found:
                    raise DataError(f"{pat}: input directory has no files")
            elif glob.has_magic(pat):
                found = sorted(p for p in glob.glob(pat) if os.path.isfile(p))
                if not found:
                    raise DataError(f"{pat}: no input file matches")
            else:
                if not os.path.isfile(pat):
                    raise DataError(f"{pat}: input file not found")
                found = [pat]
            files.extend(found)
    if not files:
        raise DataError("no input files given")
    return files


def file_seed(random_seed: int, index: int) -> int:
    """The seed of input file ``index``: independent streams, fixed by (seed, index) alone."""
    h = hashlib.sha256(f"bert_of/create-pretraining/{random_seed}/{index}".encode()).digest()
    return int.from_bytes(h[:8], "little")


def _inside(path: str, folder: str) -> bool:
    return path != folder and os.path.commonpath([path, folder]) == folder


def check_output_spares_inputs(output_dir: str, inputs: Sequence[str], what: str = "input") -> None:
    """Refuse an output directory that is, contains or lies inside one of ``inputs`` (files or
    folders, symlinks resolved): publishing it would replace or bury them."""
    out = os.path.realpath(output_dir)
    for p in inputs:
        q = os.path.realpath(p)
        rel = "is" if q == out else "contains" if _inside(q, out) else "lies inside" if _inside(out, q) else None
        if rel:
            raise OutputError(f"{output_dir}: the output directory {rel} the {what} {p}: choose another output "
                              f"directory (inputs are never overwritten)")


# --------------------------------------------------------------------------- workers

_WORKER = {}

# Share of a job's progress (measured in its input bytes) for each phase.
_READ_SHARE, _CREATE_SHARE = 0.4, 0.4


def _init_worker(vocab_file: str, opts_dict: dict, max_line_chars: int, tok=None) -> None:
    opts = PretrainingOptions(**opts_dict)
    tok = tok or make_tokenizer(vocab_file, opts.do_lower_case)
    vocab = tok.vocab
    is_subword = None
    if opts.do_whole_word_mask:
        is_subword = np.zeros(max(vocab.values()) + 1, dtype=bool)
        is_subword[[i for t, i in vocab.items() if t.startswith("##")]] = True
    masking = MaskingVocab(vocab["[MASK]"], [vocab[t] for t in vocab], is_subword)
    _WORKER.update(encode=FastTokenizer(tok).ids, opts=opts, masking=masking, cls=vocab["[CLS]"],
                   sep=vocab["[SEP]"], max_line_chars=max_line_chars)


def _process(job, report=None):
    """Make one corpus's records (one file, or all files combined) into the framed OFRecord file
    ``out``; returns (job index, out, record count, stats). ``report(amount)`` (and ``report.flush()``)
    takes the progress, in input bytes."""
    index, paths, seed, out = job
    W = _WORKER
    opts = W["opts"]
    t0, c0 = time.perf_counter(), time.process_time()
    on_bytes = on_document = None
    if report is not None:
        on_bytes = lambda n: report(n * _READ_SHARE)  # noqa: E731
    corpus = read_corpus(paths, W["encode"], W["max_line_chars"], on_bytes)
    size = sum(os.path.getsize(p) for p in paths)
    if report is not None and corpus.num_documents:
        per_doc = size * _CREATE_SHARE / (corpus.num_documents * opts.dupe_factor)
        on_document = lambda: report(per_doc)  # noqa: E731
    rng = random.Random(seed)
    inst = create_instances(corpus, opts.max_seq_length, opts.max_predictions_per_seq, opts.masked_lm_prob,
                            opts.short_seq_prob, opts.dupe_factor, rng, W["masking"], on_document)
    order = list(range(len(inst)))
    shuffle(order, rng.getrandbits)  # Google shuffles the instances
    order = np.asarray(order, dtype=np.int64)
    write_share = size * (1 - _READ_SHARE - (_CREATE_SHARE if corpus.num_documents else 0))
    with open(out, "wb") as f:
        for lo in range(0, len(order), _CHUNK):
            feats = assemble(corpus.ids, inst, order[lo:lo + _CHUNK], opts.max_seq_length,
                             opts.max_predictions_per_seq, W["cls"], W["sep"])
            buf, _ = encode_records({k: (FEATURE_KINDS[k], v) for k, v in feats.items()}, framed=True)
            f.write(buf.data)
            if report is not None:
                report(write_share * min(_CHUNK, len(order) - lo) / len(order))
    if report is not None:
        if not len(order):
            report(write_share)
        report.flush()
    stats = {"documents": corpus.num_documents, "sentences": corpus.num_sentences, "tokens": corpus.num_tokens,
             "instances": len(order), "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0}
    return index, out, len(order), stats


def _deal(path: str, count: int, writers: List[OFRecordWriter], k: int) -> int:
    """Deal the ``count`` framed records of ``path`` round-robin into ``writers``, starting at
    global record number ``k``; returns the next number. The file is removed."""
    if len(writers) == 1:
        writers[0].append_framed(path, count)
    else:
        for i, rec in enumerate(iter_raw_records(path)):
            writers[(k + i) % len(writers)].write(rec)
    os.remove(path)
    return k + count


# --------------------------------------------------------------------------- driver


def _check_output(output_dir: str, overwrite: bool) -> bool:
    """The ``overwrite`` to publish with: an existing empty folder may be filled without it."""
    if os.path.exists(output_dir):
        if not os.path.isdir(output_dir):
            raise DataError(f"{output_dir}: exists and is not a directory")
        if os.listdir(output_dir) and not overwrite:
            raise DataError(f"{output_dir}: output directory exists and is not empty (pass --overwrite to replace it)")
        return True
    return overwrite


def create_pretraining_data(inputs: Sequence[str], vocab_file: str, output_dir: str, *,
                            options: Optional[PretrainingOptions] = None, num_parts: int = 1,
                            workers: Optional[int] = None, combine_files: bool = False,
                            config: Optional[str] = None, overwrite: bool = False,
                            progress: bool = True, max_line_chars: int = MAX_LINE_CHARS) -> dict:
    """Write ``output_dir/part-00000 ...`` (OFRecord), ``vocab.txt`` (a copy of ``vocab_file``) and
    ``bert_of_data.json``; returns the summary.

    Everything is written to a staging folder and swapped in at the end (:mod:`bert_of.files.publish`): on
    any error the previous ``output_dir`` (if any) is untouched and no partial output remains.
    An ``output_dir`` that is, contains or lies inside an input (text, folder, vocab, config) is
    refused. A line over ``max_line_chars`` characters (0: no limit) is an error.
    """
    opts = options or PretrainingOptions()
    opts.validate()
    if num_parts < 1:
        raise DataError(f"num_parts must be at least 1, got {num_parts}")
    inputs = [inputs] if isinstance(inputs, (str, os.PathLike)) else [os.fspath(p) for p in inputs]
    vocab_file, output_dir = os.fspath(vocab_file), os.fspath(output_dir)
    files = expand_inputs(inputs)
    check_output_spares_inputs(output_dir, [p for arg in inputs for p in arg.split(",") if os.path.exists(p)]
                               + files)
    check_output_spares_inputs(output_dir, [vocab_file], "vocabulary")
    if config:
        check_output_spares_inputs(output_dir, [config], "config")
    tok = make_tokenizer(vocab_file, opts.do_lower_case)  # fails early on a bad vocabulary
    if config:
        check_vocab_against_config(vocab_file, config, opts.max_seq_length)

    if combine_files:
        jobs = [(0, list(files), opts.random_seed)]
    else:
        jobs = [(i, [p], file_seed(opts.random_seed, i)) for i, p in enumerate(files)]
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    sizes = {j[0]: sum(os.path.getsize(p) for p in j[1]) for j in jobs}

    t0 = time.perf_counter()
    writers, bar = [], None
    try:
        with publishing(output_dir, overwrite=_check_output(output_dir, overwrite)) as tmp:
            jobs = [(i, paths, seed, os.path.join(tmp, f".job-{i:05d}")) for i, paths, seed in jobs]
            writers = [OFRecordWriter(os.path.join(tmp, PART_FORMAT.format(p))) for p in range(num_parts)]
            totals = {"documents": 0, "sentences": 0, "tokens": 0, "instances": 0}
            per_file = []
            from tqdm import tqdm

            bar = tqdm(total=sum(sizes.values()), unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                       disable=not progress, desc="create-pretraining", dynamic_ncols=True)
            k = 0
            results = _run_jobs(jobs, vocab_file, tok, opts, max_line_chars, n_workers, bar)
            for index, path, count, stats in results:
                k = _deal(path, count, writers, k)  # round-robin over the parts, in a fixed global order
                for key in totals:
                    totals[key] += stats[key]
                per_file.append({"files": [os.path.basename(p) for p in jobs[index][1]], **stats})
                bar.set_postfix(instances=totals["instances"], refresh=False)
            bar.n = bar.total
            bar.close()
            for w in writers:
                w.close()
            if totals["instances"] == 0:
                raise DataError(f"{', '.join(files)}: no text to make instances from (no non-empty lines)")
            if totals["instances"] < num_parts:
                raise DataError(f"{totals['instances']} instance(s) cannot fill {num_parts} part files (an empty part "
                                f"is an error for readers): use --num-parts {totals['instances']} or fewer")
            shutil.copyfile(vocab_file, os.path.join(tmp, DATASET_VOCAB))
            write_json(os.path.join(tmp, DATASET_META), {
                "format": "bert_of pretraining OFRecord",
                "version": 1,
                "num_parts": num_parts,
                "part_name_prefix": "part-",
                "part_name_suffix_length": 5,
                "records_per_part": [w.count for w in writers],
                "num_records": totals["instances"],
                "features": {k2: [kind, [opts.max_seq_length if k2 in ("input_ids", "input_mask", "segment_ids")
                                         else 1 if k2 == "next_sentence_labels" else opts.max_predictions_per_seq]]
                             for k2, kind in FEATURE_KINDS.items()},
                "options": asdict(opts),
                "combine_files": combine_files,
                "vocab": {"file": DATASET_VOCAB, "source": os.path.basename(vocab_file),
                          "size": vocab_size(vocab_file), "sha256": sha256_file(vocab_file)},
                "inputs": [{"file": os.path.basename(p), "bytes": os.path.getsize(p), "sha256": sha256_file(p)}
                           for p in files],
                "stats": {k2: totals[k2] for k2 in ("documents", "sentences", "tokens")},
            })
    except BaseException:
        if bar is not None:  # clear the bar so the error is the last thing on the terminal
            bar.leave = False
            bar.close()
        raise
    finally:
        for w in writers:
            try:
                w.close()
            except OSError:
                pass
    seconds = time.perf_counter() - t0
    return {"output": os.path.abspath(output_dir), "files": len(files), "workers": n_workers,
            "num_parts": num_parts, "seconds": seconds, **totals, "per_job": per_file}


def _run_jobs(jobs, vocab_file: str, tok, opts: PretrainingOptions, max_line_chars: int, n_workers: int, bar):
    """Job results in job order, whatever the number of workers; progress goes to ``bar``."""
    init = (vocab_file, asdict(opts), max_line_chars)
    try:
        if n_workers == 1:
            _init_worker(*init, tok=tok)
            report = None
            if not bar.disable:
                report = lambda amount: bar.update(amount)  # noqa: E731
                report.flush = lambda: None
            for job in jobs:
                yield _process(job, report)
            return
        yield from run_pool(jobs, _process, n_workers, bar, init=(_init_worker, init),
                            init_forked=lambda: _init_worker(*init, tok=tok), describe=lambda job: ", ".join(job[1]))
    finally:
        _WORKER.clear()
