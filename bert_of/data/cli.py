"""``bert-of data``: pretraining data commands.

    bert-of data create-pretraining --input FILES... --vocab vocab.txt --output DIR [options]
    bert-of data inspect DIR_OR_GLOB [--check] [--json]
    bert-of data reshard SRC DST --num-parts N
    bert-of data convert SRC -o DST --format ofrecord|tfrecord|hdf5 [--num-parts N] [--gzip]

Datasets are OFRecord part files, TFRecords of tf.train.Example (Google's) or NVIDIA HDF5 shards,
detected by content (bert_of.data.formats).

``add_parser(subparsers)`` registers ``data`` on the ``bert-of`` command line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, fields
from typing import Optional

import numpy as np

from bert_of.cli_grammar import add_command, add_options, examples
from bert_of.files.atomic import write_json
from bert_of.files.publish import publishing
from bert_of.options import arg, from_args

from .create_pretraining import (DATASET_VOCAB, PART_FORMAT, DataError, PretrainingOptions, _check_output,
                                 check_output_spares_inputs, create_pretraining_data)
from .formats import FILE_SUFFIX, FORMATS, iter_file_batches, open_record_file, record_writer
from .ofrecord import OFRecordError
from .layout import META_FILE, list_data_files, read_meta
from .reader import FEATURES, PretrainingDataset, check_batch
from .text import MAX_LINE_CHARS

# --------------------------------------------------------------------------- create-pretraining


@dataclass(kw_only=True)
class CreatePretrainingOptions(PretrainingOptions):
    """``bert-of data create-pretraining``: what to read and write, and how (the instance options are
    :class:`PretrainingOptions`)."""

    input: list = arg(default_factory=list, metavar="FILE", required=True, nargs="+",
                      help="text files (also comma-separated lists, glob patterns, directories); repeat to add "
                           "more (--input a.txt --input b.txt)")
    vocab: str = arg(metavar="FILE", help="WordPiece vocab.txt")
    output: str = arg(short="-o", metavar="DIR", help="output directory (must be new or empty unless --overwrite)")
    num_parts: int = arg(1, metavar="N", help="part files to deal instances into, >= the data-parallel ranks that "
                                              "will read them")
    workers: int | None = arg(None, metavar="N", help="processes (unset: CPUs, at most one per file)")
    combine_files: bool = arg(False, help="all inputs form one corpus with one random stream, exactly as Google's "
                                          "script (single process); unset: each file is a corpus with its own seed, "
                                          "in parallel")
    config: str | None = arg(None, metavar="FILE", help="model config (config.json / bert_config.json / checkpoint "
                                                        "dir): check vocab_size and max_position_embeddings against it")
    max_line_chars: int = arg(MAX_LINE_CHARS, metavar="N", help="refuse a line longer than this many characters "
                                                                "(0: no limit)")
    overwrite: bool = arg(False, help="replace OUTPUT if it exists")
    json: bool = arg(False, help="print the summary as JSON")
    format: str = arg("ofrecord", choices=FORMATS, help="record files to write: OneFlow's OFRecord, "
                                                         "Google's TFRecord (tf.train.Example) or NVIDIA's HDF5")
    gzip: bool = arg(False, help="gzip the TFRecord files (TensorFlow's compression_type GZIP)")


@dataclass(kw_only=True)
class InspectOptions:
    """``bert-of data inspect``."""

    path: str = arg(positional=True, metavar="DIR", help="a dataset: a directory (OFRecord part files, TFRecords or "
                                                         "HDF5 shards) or a glob of its files")
    check: bool = arg(False, help="parse and range-check every record (unset: framing + first record)")
    json: bool = arg(False, help="print the report as JSON")


@dataclass(kw_only=True)
class ReshardOptions:
    """``bert-of data reshard``."""

    src: str = arg(positional=True, metavar="SRC", help="the dataset to re-deal (left unchanged)")
    dst: str = arg(positional=True, metavar="DST", help="the new dataset directory (may not be, contain or lie inside "
                                                        "SRC)")
    num_parts: int = arg(metavar="N", help="part files to write, >= the ranks that will read them")
    overwrite: bool = arg(False, help="replace DST if it exists")


@dataclass(kw_only=True)
class ConvertOptions:
    """``bert-of data convert``."""

    src: str = arg(positional=True, metavar="SRC", help="the dataset to convert (a directory or a glob; left unchanged)")
    output: str = arg(short="-o", metavar="DST", help="the new dataset directory")
    format: str = arg(choices=FORMATS, help="record files to write")
    num_parts: int | None = arg(None, metavar="N", help="part files to deal the records into round-robin (unset: "
                                                          "part i of SRC becomes part i, records in order)")
    gzip: bool = arg(False, help="gzip the TFRecord files")
    overwrite: bool = arg(False, help="replace DST if it exists")


def cmd_create_pretraining(args) -> int:
    o = from_args(CreatePretrainingOptions, args)
    opts = PretrainingOptions(**{f.name: getattr(o, f.name) for f in fields(PretrainingOptions)})
    if o.gzip and o.format != "tfrecord":
        raise DataError("--gzip applies to --format tfrecord only")
    kw = dict(options=opts, num_parts=o.num_parts, workers=o.workers, combine_files=o.combine_files,
              config=o.config, progress=not getattr(args, "no_progress", False), max_line_chars=o.max_line_chars)
    if o.format == "ofrecord":
        s = create_pretraining_data(o.input, o.vocab, o.output, overwrite=o.overwrite, **kw)
    else:  # OFRecord first (the parallel writer), then the same records in the asked format
        _check_output(o.output, o.overwrite)
        check_output_spares_inputs(o.output, list(o.input) + [o.vocab], "input")
        parent = os.path.dirname(os.path.abspath(o.output))
        tmp = tempfile.mkdtemp(prefix=".bert_of-ofrecord-", dir=parent)
        try:
            s = create_pretraining_data(o.input, o.vocab, os.path.join(tmp, "d"), overwrite=False, **kw)
            reshard(os.path.join(tmp, "d"), o.output, None, overwrite=o.overwrite, fmt=o.format, compress=o.gzip)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        s["output"] = os.path.abspath(o.output)
    if o.json:
        print(json.dumps(s, indent=2))
    else:
        rate = s["tokens"] / s["seconds"] if s["seconds"] > 0 else float("inf")
        print(f"wrote {s['output']}: {s['instances']} instances in {s['num_parts']} part file(s)"
              f"{'' if o.format == 'ofrecord' else ' (' + o.format + ')'} from "
              f"{s['files']} input file(s) ({s['documents']} documents, {s['sentences']} sentences, "
              f"{s['tokens']} tokens) in {s['seconds']:.2f} s with {s['workers']} worker(s), "
              f"{rate:,.0f} input tokens/s")
    return 0


# --------------------------------------------------------------------------- inspect


def inspect_dataset(data_dir: str, check: bool = False) -> dict:
    """Files, record counts and features of a dataset (any of the three formats). ``check``: parse
    every record, and range-check the values of pretraining records as a reader would (naming the
    file and record)."""
    paths, suffix, fmt = list_data_files(data_dir)
    info = {"path": data_dir, "format": fmt, "parts": [], "num_records": 0, "part_name_suffix_length": suffix,
            "meta": read_meta(data_dir), "features": None}
    for p in paths:
        with open_record_file(p, fmt) as f:  # checks the framing of every record (and TFRecord CRCs)
            n = len(f)
            info["parts"].append({"file": os.path.basename(p), "records": n, "bytes": os.path.getsize(p)})
            info["num_records"] += n
            first = None
            for i in range(n if check and fmt != "hdf5" else min(n, 1)):  # HDF5: one shape per shard
                rec = f.record(i)  # parses it
                shape = {k: [len(v)] for k, v in rec.items()}
                if first is None:
                    first = shape
                elif shape != first:
                    diff = sorted(k for k in set(shape) | set(first) if shape.get(k) != first.get(k))
                    raise OFRecordError(f"{p}: record {i}: features differ from record 0 of this file: "
                                        f"{', '.join(f'{k} {first.get(k)} -> {shape.get(k)}' for k in diff)}")
            if first is not None and info["features"] is None and fmt == "hdf5":
                info["features"] = f.stored()  # the dtypes it holds; what it does not hold, marked rebuilt
            elif first is not None and info["features"] is None:
                rec = f.record(0)
                info["features"] = {k: {"dtype": str(getattr(v, "dtype", "bytes")), "shape": [len(v)]}
                                    for k, v in sorted(rec.items())}
    feats = info["features"] or {}
    if check and set(FEATURES) <= set(feats):
        S, P = feats["input_ids"]["shape"][0], feats["masked_lm_ids"]["shape"][0]
        with PretrainingDataset(data_dir, 1024, S, P, shuffle=False) as ds:
            ds.validate()
        info["values_checked"] = True
    return info


def cmd_inspect(args) -> int:
    args = from_args(InspectOptions, args)
    info = inspect_dataset(args.path, check=args.check)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['path']}: {info['format']}, {len(info['parts'])} part file(s), {info['num_records']} records"
          + (" (all records parsed" + (", values in range)" if info.get("values_checked") else ")")
             if args.check else ""))
    for part in info["parts"]:
        print(f"  {part['file']}  {part['records']:>8} records  {part['bytes']:>12,} bytes")
    for name, f in (info["features"] or {}).items():
        rebuilt = f" not stored: rebuilt from {f['rebuilt_from']}" if f.get("rebuilt_from") else ""
        print(f"  feature {name:<22} {f['dtype']:<8} {f['shape']}{rebuilt}")
    meta = info["meta"]
    if meta:
        o = meta.get("options", {})
        print(f"  made by bert_of: max_seq_length {o.get('max_seq_length')}, max_predictions_per_seq "
              f"{o.get('max_predictions_per_seq')}, seed {o.get('random_seed')}, dupe_factor {o.get('dupe_factor')}, "
              f"whole_word_mask {o.get('do_whole_word_mask')}, vocab {meta.get('vocab', {}).get('size')} tokens")
        vocab = meta.get("vocab", {})
        if os.path.isfile(os.path.join(args.path, str(vocab.get("file")))):
            print(f"  vocabulary: {vocab.get('file')} (a copy of {vocab.get('source')}, sha256 "
                  f"{str(vocab.get('sha256'))[:12]}...)")
    return 0


# --------------------------------------------------------------------------- reshard


def reshard(src: str, dst: str, num_parts: Optional[int] = None, overwrite: bool = False, fmt: Optional[str] = None,
            compress: bool = False) -> dict:
    """Deal the records of SRC (file order, then record order) round-robin into NUM_PARTS part files
    of format ``fmt`` (default: SRC's; ``compress``: gzip TFRecords); the metadata and the vocabulary
    copy come along. Records keep their values; within one format their bytes are copied as they are.
    ``num_parts=None``: part i of SRC becomes part i of DST, records in the same order."""
    paths, _, src_fmt = list_data_files(src)
    if fmt is None and src_fmt == "tfrecord":  # reshard keeps the format, gzip included
        with open(paths[0], "rb") as f:
            compress = compress or f.read(2) == b"\x1f\x8b"
    fmt = fmt or src_fmt
    same_parts = num_parts is None
    num_parts = len(paths) if same_parts else num_parts
    if num_parts < 1:
        raise DataError(f"num_parts must be at least 1, got {num_parts}")
    if fmt not in FORMATS:
        raise DataError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if compress and fmt != "tfrecord":
        raise DataError("gzip applies to TFRecord output only")
    check_output_spares_inputs(dst, [src] if os.path.isdir(src) else paths, "source dataset")
    meta = read_meta(src) if os.path.isdir(src) else None
    total = 0
    for p in paths:  # checks every record's framing before anything is written
        with open_record_file(p, src_fmt) as f:
            total += len(f)
    if total < num_parts:
        raise DataError(f"{src}: {total} record(s) cannot fill {num_parts} part files (an empty part is an error "
                        f"for readers): use --num-parts {total} or fewer")
    suffix = FILE_SUFFIX[fmt] + (".gz" if compress else "")
    writers = []
    try:
        with publishing(dst, overwrite=_check_output(dst, overwrite)) as tmp:
            writers = [record_writer(os.path.join(tmp, PART_FORMAT.format(i) + suffix), fmt, compress)
                       for i in range(num_parts)]
            k = 0
            for pi, p in enumerate(paths):
                with open_record_file(p, src_fmt) as f:
                    first = 0  # the chunk's first record in this file
                    for chunk in iter_file_batches(f, list(FEATURES)):
                        r = len(chunk["input_ids"])
                        # the reader's own check: a negative id (an int64 list's uint64 beyond 2^63 reads
                        # as one, as in TensorFlow) is refused, not written on as a wrapped value
                        bad = check_batch(chunk, chunk["input_ids"].shape[1], None, None)
                        if bad is not None:
                            raise DataError(f"{p}: record {first + bad[0]}: {bad[1]}")
                        if fmt == src_fmt and fmt != "hdf5":  # checked; the same bytes, re-framed
                            for i in range(first, first + r):
                                writers[pi if same_parts else k % num_parts].write_raw(f.raw(i))
                                k += 1
                            first += r
                            continue
                        first += r
                        deal = np.full(r, pi) if same_parts else (k + np.arange(r)) % num_parts
                        for j in range(num_parts):
                            rows = np.flatnonzero(deal == j)
                            if rows.size:
                                try:
                                    writers[j].write_batch({n: v[rows] for n, v in chunk.items()}, where=p)
                                except OverflowError as e:
                                    raise DataError(f"{p}: a record does not fit {fmt}: {e}") from None
                        k += r
            for w in writers:
                w.close()
            if meta:
                vocab = meta.get("vocab") if isinstance(meta.get("vocab"), dict) else {}
                if vocab.get("file") == DATASET_VOCAB and os.path.isfile(os.path.join(src, DATASET_VOCAB)):
                    shutil.copyfile(os.path.join(src, DATASET_VOCAB), os.path.join(tmp, DATASET_VOCAB))
                meta.update(num_parts=num_parts, num_records=k, records_per_part=[w.count for w in writers],
                            part_name_suffix_length=5, resharded_from=os.path.basename(os.path.abspath(src)),
                            format=fmt)
                write_json(os.path.join(tmp, META_FILE), meta)
    finally:
        for w in writers:
            try:
                w.close()
            except OSError:
                pass
    return {"output": os.path.abspath(dst), "num_records": k, "num_parts": num_parts, "format": fmt}


def cmd_reshard(args) -> int:
    args = from_args(ReshardOptions, args)
    s = reshard(args.src, args.dst, args.num_parts, overwrite=args.overwrite)
    print(f"wrote {s['output']}: {s['num_records']} records in {s['num_parts']} part file(s)")
    return 0


def cmd_convert(args) -> int:
    args = from_args(ConvertOptions, args)
    s = reshard(args.src, args.output, args.num_parts, overwrite=args.overwrite, fmt=args.format, compress=args.gzip)
    print(f"wrote {s['output']}: {s['num_records']} records in {s['num_parts']} {s['format']} part file(s)")
    return 0


# --------------------------------------------------------------------------- parsers

EPILOG = examples("bert-of data create-pretraining --input corpus.txt --vocab vocab.txt -o data/",
                  "bert-of data inspect data/ --check", "bert-of data reshard data/ data-4/ --num-parts 4")


def _add_commands(sub) -> None:
    c = sub.add_parser(
        "create-pretraining", help="text -> masked-LM/next-sentence OFRecord parts (Google's semantics)",
        epilog=examples("bert-of data create-pretraining --input corpus/*.txt --vocab vocab.txt -o data/ --num-parts 8",
                        "bert-of data create-pretraining --input a.txt --input b.txt --vocab vocab.txt -o data/ "
                        "--combine-files  # record for record as Google's script"),
        description="Make BERT pretraining data as google-research/bert's create_pretraining_data.py does: "
                    "one sentence per line, blank lines between documents. Writes OFRecord part files "
                    "part-00000 ..., vocab.txt (a copy of --vocab) and bert_of_data.json into OUTPUT "
                    "(atomically). OUTPUT may not be, contain or lie inside an input.")
    add_options(c, CreatePretrainingOptions)
    c.set_defaults(fn=cmd_create_pretraining)

    add_command(sub, "inspect", cmd_inspect, InspectOptions,
                help="part files, record counts and features of a dataset (OFRecord, TFRecord, HDF5)",
                example_lines=("bert-of data inspect data/", "bert-of data inspect data/ --check --json"))

    add_command(sub, "reshard", cmd_reshard, ReshardOptions,
                help="re-deal a dataset into N part files of its format (e.g. one per rank)",
                example_lines=("bert-of data reshard data/ data-8/ --num-parts 8",))

    add_command(sub, "convert", cmd_convert, ConvertOptions,
                help="the same records in another format: OFRecord, TFRecord (Google's), HDF5 (NVIDIA's)",
                example_lines=("bert-of data convert 'wiki/tf_examples.tfrecord*' -o wiki-of/ --format ofrecord",
                               "bert-of data convert data/ -o data-h5/ --format hdf5"))


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``bert-of data ...`` on the main command line."""
    d = subparsers.add_parser("data", help="pretraining data: create-pretraining, inspect, reshard, convert",
                              description="Pretraining data: OFRecord, TFRecord (tf.train.Example) or NVIDIA HDF5.", epilog=EPILOG)
    _add_commands(d.add_subparsers(dest="data_command", required=True, metavar="COMMAND"))
    return d
