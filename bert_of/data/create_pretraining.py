"""Masked-LM / next-sentence pretraining data, as google-research/bert's ``create_pretraining_data.py``.

Semantics (each checked against Google's script; ``combine_files=True`` reproduces its
output record for record, tested on a golden file made by running it):

* **Input**: one sentence per line, blank line = document boundary; a line whose
  tokens are empty is skipped (it does not end a document). Lines end at ``\\n`` only
  and are ``str.strip()``-ed. Documents without sentences are dropped, the list of
  documents is shuffled.
* **Instances** (per document, ``dupe_factor`` passes over all documents):
  ``max_num_tokens = max_seq_length - 3``; with probability ``short_seq_prob`` the
  target length is ``randint(2, max_num_tokens)``. Sentences are gathered until the
  target is reached; segment A takes ``randint(1, len(chunk) - 1)`` of them; B is
  the rest (actual next) or, with probability 0.5 or when the chunk has one sentence,
  text from a random other document (random next, label 1) and the unused sentences
  are put back. The pair is truncated to ``max_num_tokens`` by removing, from the
  longer side, the first or last token (coin flip). ``[CLS] A [SEP] B [SEP]``, segment
  ids 0 through the first ``[SEP]``, 1 after.
* **Masking**: candidates are all positions but ``[CLS]``/``[SEP]`` (with whole-word
  masking, ``##`` pieces join the preceding word), shuffled; ``num_to_predict =
  min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob)))``; a word
  that would exceed it is skipped; each chosen position becomes ``[MASK]`` (80%),
  stays (10%) or becomes a uniformly random vocabulary entry (10%). Positions are
  sorted; labels are the original tokens.
* **Records**: ``input_ids``/``input_mask``/``segment_ids`` padded with 0 to
  ``max_seq_length``; ``masked_lm_positions``/``masked_lm_ids`` padded with 0 and
  ``masked_lm_weights`` 1.0 for real predictions, 0.0 for padding, to
  ``max_predictions_per_seq``; ``next_sentence_labels`` 1 for random next. All instances
  are shuffled and dealt round-robin into the part files.
* The random stream is Python's ``random.Random`` used in exactly Google's call order.

Parallelism: by default every input file is its own corpus processed by a worker
process with its own generator, seeded from ``(random_seed, file index)``; results are
gathered in file order, so the output is the same bytes for any number of workers.
``combine_files=True`` treats all files as one corpus with one generator seeded by
``random_seed`` exactly as Google's script does (random next sentences may then come
from any file; a single process).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, List, Optional, Sequence

from bert_of.errors import BertOfError
from bert_of.fs import publishing, sha256_file

from .ofrecord import OFRecordWriter, encode_record

DATASET_META = "bert_of_data.json"
PART_FORMAT = "part-{:05d}"


class DataError(BertOfError):
    """Input text, vocabulary, config or output directory problems for data creation."""


@dataclass
class PretrainingOptions:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    random_seed: int = 12345
    do_lower_case: bool = True
    do_whole_word_mask: bool = False

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


@dataclass
class TrainingInstance:
    tokens: List[str]
    segment_ids: List[int]
    masked_lm_positions: List[int]
    masked_lm_labels: List[str]
    is_random_next: bool


# --------------------------------------------------------------------------- reading text


def _read_lines(path: str, on_bytes: Optional[Callable[[int], None]] = None) -> Iterable[str]:
    """Lines split at b"\\n" only (as TensorFlow's GFile), decoded as UTF-8."""
    try:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if on_bytes is not None:
                    on_bytes(len(raw))
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}: line {lineno} is not valid UTF-8 (byte {e.start})") from None
    except FileNotFoundError:
        raise DataError(f"{path}: input file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a text file") from None


def read_documents(paths: Sequence[str], tokenizer, documents: Optional[list] = None,
                   on_bytes: Optional[Callable[[int], None]] = None) -> list:
    """Documents (lists of tokenized sentences) of text files read in order, as Google does.

    A file boundary is not a document boundary (Google's reader keeps appending to the
    current document), so pass all files of one corpus in one call.
    """
    docs = documents if documents is not None else [[]]
    for path in paths:
        for line in _read_lines(path, on_bytes):
            line = line.strip()
            if not line:
                docs.append([])
            tokens = tokenizer.tokenize(line)
            if tokens:
                docs[-1].append(tokens)
    return [d for d in docs if d]


# --------------------------------------------------------------------------- instances


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int, rng: random.Random) -> None:
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def create_masked_lm_predictions(tokens: List[str], opts: PretrainingOptions, vocab_words: List[str],
                                 rng: random.Random):
    """(output tokens, sorted masked positions, original tokens at those positions)."""
    candidates: List[List[int]] = []
    for i, tok in enumerate(tokens):
        if tok == "[CLS]" or tok == "[SEP]":
            continue
        if opts.do_whole_word_mask and candidates and tok.startswith("##"):
            candidates[-1].append(i)
        else:
            candidates.append([i])
    rng.shuffle(candidates)

    output = list(tokens)
    num_to_predict = min(opts.max_predictions_per_seq, max(1, int(round(len(tokens) * opts.masked_lm_prob))))
    chosen: List[int] = []
    covered = set()
    for word in candidates:
        if len(chosen) >= num_to_predict:
            break
        if len(chosen) + len(word) > num_to_predict:
            continue  # a whole word that would not fit is skipped, not cut
        if (word[0] in covered) if len(word) == 1 else any(i in covered for i in word):
            continue
        for i in word:
            covered.add(i)
            if rng.random() < 0.8:
                output[i] = "[MASK]"
            elif rng.random() < 0.5:
                output[i] = tokens[i]
            else:
                output[i] = vocab_words[rng.randint(0, len(vocab_words) - 1)]
            chosen.append(i)
    chosen.sort()
    return output, chosen, [tokens[i] for i in chosen]


def create_instances_from_document(all_documents: list, document_index: int, opts: PretrainingOptions,
                                   vocab_words: List[str], rng: random.Random) -> List[TrainingInstance]:
    document = all_documents[document_index]
    max_num_tokens = opts.max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < opts.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    chunk: List[List[str]] = []
    chunk_len = 0
    i = 0
    while i < len(document):
        sentence = document[i]
        chunk.append(sentence)
        chunk_len += len(sentence)
        if i == len(document) - 1 or chunk_len >= target_seq_length:
            if chunk:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                tokens_a = [t for s in chunk[:a_end] for t in s]
                tokens_b: List[str] = []
                if len(chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):  # try to avoid the current document
                        random_index = rng.randint(0, len(all_documents) - 1)
                        if random_index != document_index:
                            break
                    random_document = all_documents[random_index]
                    start = rng.randint(0, len(random_document) - 1)
                    for j in range(start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    i -= len(chunk) - a_end  # the unused sentences go back into the stream
                else:
                    is_random_next = False
                    tokens_b = [t for s in chunk[a_end:] for t in s]
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                assert tokens_a and tokens_b

                tokens = ["[CLS]", *tokens_a, "[SEP]", *tokens_b, "[SEP]"]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                tokens, positions, labels = create_masked_lm_predictions(tokens, opts, vocab_words, rng)
                instances.append(TrainingInstance(tokens, segment_ids, positions, labels, is_random_next))
            chunk = []
            chunk_len = 0
        i += 1
    return instances


def create_training_instances(all_documents: list, opts: PretrainingOptions, vocab_words: List[str],
                              rng: random.Random, on_document: Optional[Callable[[], None]] = None
                              ) -> List[TrainingInstance]:
    """Shuffle documents, ``dupe_factor`` passes of instance creation, shuffle instances."""
    rng.shuffle(all_documents)
    instances = []
    for _ in range(opts.dupe_factor):
        for index in range(len(all_documents)):
            instances.extend(create_instances_from_document(all_documents, index, opts, vocab_words, rng))
            if on_document is not None:
                on_document()
    rng.shuffle(instances)
    return instances


def instance_to_record(inst: TrainingInstance, vocab: dict, opts: PretrainingOptions) -> bytes:
    S, P = opts.max_seq_length, opts.max_predictions_per_seq
    ids = [vocab[t] for t in inst.tokens]
    n, m = len(ids), len(inst.masked_lm_positions)
    assert n <= S and m <= P
    pad_s, pad_p = [0] * (S - n), [0] * (P - m)
    return encode_record({
        "input_ids": ("int32", ids + pad_s),
        "input_mask": ("int32", [1] * n + pad_s),
        "segment_ids": ("int32", list(inst.segment_ids) + pad_s),
        "masked_lm_positions": ("int32", list(inst.masked_lm_positions) + pad_p),
        "masked_lm_ids": ("int32", [vocab[t] for t in inst.masked_lm_labels] + pad_p),
        "masked_lm_weights": ("float", [1.0] * m + [0.0] * len(pad_p)),
        "next_sentence_labels": ("int32", [1 if inst.is_random_next else 0]),
    })


# --------------------------------------------------------------------------- vocabulary / config

REQUIRED_TOKENS = ("[CLS]", "[SEP]", "[MASK]", "[UNK]")


def make_tokenizer(vocab_file: str, do_lower_case: bool):
    """Google's FullTokenizer semantics (literal "[CLS]" etc. in text are split, as Google does)."""
    from bert_of.tokenization import FullTokenizer

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


def vocab_line_count(vocab_file: str) -> int:
    with open(vocab_file, "rb") as f:
        return sum(1 for _ in f)


def load_model_config(path: str):
    """A bert_of config.json, Google's bert_config.json, or a directory holding either."""
    from bert_of.config import BertConfig
    from bert_of.errors import ConfigError

    if os.path.isdir(path):
        for name in ("config.json", "bert_config.json"):
            if os.path.isfile(os.path.join(path, name)):
                path = os.path.join(path, name)
                break
        else:
            raise DataError(f"{path}: no config.json or bert_config.json in this directory")
    try:
        return BertConfig.from_json_file(path), path
    except ConfigError:
        return BertConfig.from_google_json_file(path), path


def check_vocab_against_config(vocab_file: str, config_path: str, max_seq_length: int) -> None:
    cfg, where = load_model_config(config_path)
    n = vocab_line_count(vocab_file)
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
    for arg in patterns:
        for pat in (p for p in arg.split(",") if p):
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


# --------------------------------------------------------------------------- workers

_WORKER = {}

# Share of a job's progress (measured in its input bytes) for each phase.
_READ_SHARE, _CREATE_SHARE = 0.4, 0.4


class _SharedProgress:
    """Progress a worker reports to the parent's bar: a shared counter, flushed in chunks."""

    def __init__(self, value):
        self.value, self.pending, self.last = value, 0.0, time.monotonic()

    def __call__(self, amount: float) -> None:
        self.pending += amount
        now = time.monotonic()
        if now - self.last > 0.1:
            self.flush()
            self.last = now

    def flush(self) -> None:
        if self.pending and self.value is not None:
            with self.value.get_lock():
                self.value.value += self.pending
        self.pending = 0.0


def _init_worker(vocab_file: str, opts_dict: dict, counter=None) -> None:
    opts = PretrainingOptions(**opts_dict)
    tok = make_tokenizer(vocab_file, opts.do_lower_case)
    report = _SharedProgress(counter) if counter is not None else None
    _WORKER.update(tok=tok, opts=opts, vocab_words=list(tok.vocab.keys()), report=report)


def _process(job):
    """(job index, serialized records, stats) for one corpus (one file, or all files combined)."""
    index, paths, seed = job
    tok, opts, vocab_words = _WORKER["tok"], _WORKER["opts"], _WORKER["vocab_words"]
    report = _WORKER.get("report")
    t0 = time.perf_counter()
    on_bytes = on_document = None
    if report is not None:
        on_bytes = lambda n: report(n * _READ_SHARE)  # noqa: E731
    docs = read_documents(paths, tok, on_bytes=on_bytes)
    size = sum(os.path.getsize(p) for p in paths)
    if report is not None and docs:
        per_doc = size * _CREATE_SHARE / (len(docs) * opts.dupe_factor)
        on_document = lambda: report(per_doc)  # noqa: E731
    rng = random.Random(seed)
    instances = create_training_instances(docs, opts, vocab_words, rng, on_document) if docs else []
    records = [instance_to_record(inst, tok.vocab, opts) for inst in instances]
    if report is not None:
        report(size * (1 - _READ_SHARE - (_CREATE_SHARE if docs else 0)))
        report.flush()
    stats = {"documents": len(docs), "sentences": sum(len(d) for d in docs),
             "tokens": sum(len(s) for d in docs for s in d), "instances": len(records),
             "seconds": time.perf_counter() - t0}
    return index, records, stats


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
                            progress: bool = True) -> dict:
    """Write ``output_dir/part-00000 ...`` (OFRecord) + ``bert_of_data.json``; returns the summary.

    Everything is written to a staging folder and swapped in at the end (:mod:`bert_of.fs`): on
    any error the previous ``output_dir`` (if any) is untouched and no partial output remains.
    """
    opts = options or PretrainingOptions()
    opts.validate()
    if num_parts < 1:
        raise DataError(f"num_parts must be at least 1, got {num_parts}")
    files = expand_inputs(inputs)
    tok = make_tokenizer(vocab_file, opts.do_lower_case)  # fail early on a bad vocabulary
    del tok
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
            writers = [OFRecordWriter(os.path.join(tmp, PART_FORMAT.format(p))) for p in range(num_parts)]
            totals = {"documents": 0, "sentences": 0, "tokens": 0, "instances": 0}
            per_file = []
            from tqdm import tqdm

            bar = tqdm(total=sum(sizes.values()), unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                       disable=not progress, desc="create-pretraining", dynamic_ncols=True)
            k = 0
            for index, records, stats in _run_jobs(jobs, vocab_file, opts, n_workers, bar):
                for rec in records:  # round-robin over the parts, in a fixed global order
                    writers[k % num_parts].write(rec)
                    k += 1
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
            meta = {
                "format": "bert_of pretraining OFRecord",
                "version": 1,
                "num_parts": num_parts,
                "part_name_prefix": "part-",
                "part_name_suffix_length": 5,
                "records_per_part": [w.count for w in writers],
                "num_records": totals["instances"],
                "features": {
                    "input_ids": ["int32", [opts.max_seq_length]],
                    "input_mask": ["int32", [opts.max_seq_length]],
                    "segment_ids": ["int32", [opts.max_seq_length]],
                    "masked_lm_positions": ["int32", [opts.max_predictions_per_seq]],
                    "masked_lm_ids": ["int32", [opts.max_predictions_per_seq]],
                    "masked_lm_weights": ["float", [opts.max_predictions_per_seq]],
                    "next_sentence_labels": ["int32", [1]],
                },
                "options": asdict(opts),
                "combine_files": combine_files,
                "vocab": {"file": os.path.basename(vocab_file), "size": vocab_line_count(vocab_file),
                          "sha256": sha256_file(vocab_file)},
                "inputs": [{"file": os.path.basename(p), "bytes": os.path.getsize(p), "sha256": sha256_file(p)}
                           for p in files],
                "stats": {k2: totals[k2] for k2 in ("documents", "sentences", "tokens")},
            }
            with open(os.path.join(tmp, DATASET_META), "w") as f:
                f.write(json.dumps(meta, indent=2, sort_keys=True) + "\n")
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


def _run_jobs(jobs, vocab_file: str, opts: PretrainingOptions, n_workers: int, bar):
    """Job results in job order, whatever the number of workers; progress goes to ``bar``."""
    if n_workers == 1:
        _init_worker(vocab_file, asdict(opts))
        if not bar.disable:
            _WORKER["report"] = lambda amount: bar.update(amount)
            _WORKER["report"].flush = lambda: None
        for job in jobs:
            yield _process(job)
        _WORKER.pop("report", None)
        return
    import multiprocessing as mp

    # fork is cheap, but not safe once OneFlow's threads exist in this process.
    ctx = mp.get_context("spawn" if "oneflow" in sys.modules else "fork")
    counter = ctx.Value("d", 0.0) if not bar.disable else None
    with ctx.Pool(n_workers, initializer=_init_worker, initargs=(vocab_file, asdict(opts), counter)) as pool:
        results = pool.imap(_process, jobs, chunksize=1)
        while True:
            try:
                item = results.next(timeout=0.2)
            except mp.TimeoutError:
                item = None
            except StopIteration:
                return
            if counter is not None:
                bar.n = min(bar.total, counter.value)
                bar.refresh()
            if item is not None:
                yield item
