"""``bert-of data``: pretraining data commands.

    bert-of data create-pretraining --input FILES... --vocab vocab.txt --output DIR [options]
    bert-of data inspect DIR [--check] [--json]
    bert-of data reshard SRC DST --num-parts N

``add_parser(subparsers)`` registers ``data`` on the ``bert-of`` command line;
``main(argv)`` runs the same commands standalone (``python -m bert_of.data ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass, fields

from bert_of.cli_grammar import add_command, add_options, examples, finish
from bert_of.files.atomic import write_json
from bert_of.files.publish import publishing
from bert_of.options import arg, from_args

from .create_pretraining import (DATASET_VOCAB, PART_FORMAT, DataError, PretrainingOptions, _check_output,
                                 check_output_spares_inputs, create_pretraining_data)
from .ofrecord import OFRecordError, OFRecordWriter, RecordFile, iter_raw_records
from .reader import FEATURES, META_FILE, PretrainingDataset, list_part_files, read_meta
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


@dataclass(kw_only=True)
class InspectOptions:
    """``bert-of data inspect``."""

    path: str = arg(positional=True, metavar="DIR", help="an OFRecord dataset directory (part files, "
                                                         "bert_of_data.json)")
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


def cmd_create_pretraining(args) -> int:
    o = from_args(CreatePretrainingOptions, args)
    opts = PretrainingOptions(**{f.name: getattr(o, f.name) for f in fields(PretrainingOptions)})
    s = create_pretraining_data(o.input, o.vocab, o.output, options=opts, num_parts=o.num_parts, workers=o.workers,
                                combine_files=o.combine_files, config=o.config, overwrite=o.overwrite,
                                progress=not getattr(args, "no_progress", False), max_line_chars=o.max_line_chars)
    if o.json:
        print(json.dumps(s, indent=2))
    else:
        rate = s["tokens"] / s["seconds"] if s["seconds"] > 0 else float("inf")
        print(f"wrote {s['output']}: {s['instances']} instances in {s['num_parts']} part file(s) from "
              f"{s['files']} input file(s) ({s['documents']} documents, {s['sentences']} sentences, "
              f"{s['tokens']} tokens) in {s['seconds']:.2f} s with {s['workers']} worker(s), "
              f"{rate:,.0f} input tokens/s")
    return 0


# --------------------------------------------------------------------------- inspect


def inspect_dataset(data_dir: str, check: bool = False) -> dict:
    """Parts, record counts and features of a dataset. ``check``: parse every record, and range-check
    the values of pretraining records as a reader would (naming the part file and record)."""
    paths, suffix = list_part_files(data_dir)
    info = {"path": data_dir, "parts": [], "num_records": 0, "part_name_suffix_length": suffix,
            "meta": read_meta(data_dir), "features": None}
    for p in paths:
        with RecordFile(p) as f:  # checks the framing of every record
            n = len(f)
            info["parts"].append({"file": os.path.basename(p), "records": n, "bytes": os.path.getsize(p)})
            info["num_records"] += n
            first = None
            for i in range(n if check else min(n, 1)):
                rec = f.record(i)  # parses it
                shape = {k: [len(v)] for k, v in rec.items()}
                if first is None:
                    first = shape
                elif shape != first:
                    diff = sorted(k for k in set(shape) | set(first) if shape.get(k) != first.get(k))
                    raise OFRecordError(f"{p}: record {i}: features differ from record 0 of this file: "
                                        f"{', '.join(f'{k} {first.get(k)} -> {shape.get(k)}' for k in diff)}")
            if first is not None and info["features"] is None:
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
    print(f"{info['path']}: {len(info['parts'])} part file(s), {info['num_records']} records"
          + (" (all records parsed" + (", values in range)" if info.get("values_checked") else ")")
             if args.check else ""))
    for part in info["parts"]:
        print(f"  {part['file']}  {part['records']:>8} records  {part['bytes']:>12,} bytes")
    for name, f in (info["features"] or {}).items():
        print(f"  feature {name:<22} {f['dtype']:<8} {f['shape']}")
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


def reshard(src: str, dst: str, num_parts: int, overwrite: bool = False) -> dict:
    """Deal the records of SRC (part order, then record order) round-robin into NUM_PARTS parts;
    the metadata and the vocabulary copy come along."""
    if num_parts < 1:
        raise DataError(f"num_parts must be at least 1, got {num_parts}")
    paths, _ = list_part_files(src)
    check_output_spares_inputs(dst, [src], "source dataset")
    meta = read_meta(src)
    total = 0
    for p in paths:  # checks every record's framing before anything is written
        with RecordFile(p) as f:
            total += len(f)
    if total < num_parts:
        raise DataError(f"{src}: {total} record(s) cannot fill {num_parts} part files (an empty part is an error "
                        f"for readers): use --num-parts {total} or fewer")
    writers = []
    try:
        with publishing(dst, overwrite=_check_output(dst, overwrite)) as tmp:
            writers = [OFRecordWriter(os.path.join(tmp, PART_FORMAT.format(i))) for i in range(num_parts)]
            k = 0
            for p in paths:
                for rec in iter_raw_records(p):
                    writers[k % num_parts].write(rec)
                    k += 1
            for w in writers:
                w.close()
            if meta:
                vocab = meta.get("vocab") if isinstance(meta.get("vocab"), dict) else {}
                if vocab.get("file") == DATASET_VOCAB and os.path.isfile(os.path.join(src, DATASET_VOCAB)):
                    shutil.copyfile(os.path.join(src, DATASET_VOCAB), os.path.join(tmp, DATASET_VOCAB))
                meta.update(num_parts=num_parts, num_records=k, records_per_part=[w.count for w in writers],
                            part_name_suffix_length=5, resharded_from=os.path.basename(os.path.abspath(src)))
                write_json(os.path.join(tmp, META_FILE), meta)
    finally:
        for w in writers:
            try:
                w.close()
            except OSError:
                pass
    return {"output": os.path.abspath(dst), "num_records": k, "num_parts": num_parts}


def cmd_reshard(args) -> int:
    args = from_args(ReshardOptions, args)
    s = reshard(args.src, args.dst, args.num_parts, overwrite=args.overwrite)
    print(f"wrote {s['output']}: {s['num_records']} records in {s['num_parts']} part file(s)")
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
                help="part files, record counts and features of an OFRecord dataset",
                example_lines=("bert-of data inspect data/", "bert-of data inspect data/ --check --json"))

    add_command(sub, "reshard", cmd_reshard, ReshardOptions,
                help="re-deal an OFRecord dataset into N part files (e.g. one per rank)",
                example_lines=("bert-of data reshard data/ data-8/ --num-parts 8",))


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``bert-of data ...`` on the main command line."""
    d = subparsers.add_parser("data", help="pretraining data: create-pretraining, inspect, reshard",
                              description="Pretraining data in OFRecord form.", epilog=EPILOG)
    _add_commands(d.add_subparsers(dest="data_command", required=True, metavar="COMMAND"))
    return d


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bert-of data", description="Pretraining data in OFRecord form.", epilog=EPILOG)
    _add_commands(p.add_subparsers(dest="data_command", required=True, metavar="COMMAND"))
    return p


def main(argv=None) -> int:
    from bert_of.cli import dispatch

    return dispatch(finish(build_parser()).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
