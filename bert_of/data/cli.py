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

from bert_of.fs import publishing, write_json

from .create_pretraining import (DATASET_VOCAB, PART_FORMAT, DataError, PretrainingOptions, _check_output,
                                 check_output_spares_inputs, create_pretraining_data)
from .ofrecord import OFRecordError, OFRecordWriter, RecordFile, iter_raw_records
from .reader import FEATURES, META_FILE, PretrainingDataset, list_part_files, read_meta
from .text import MAX_LINE_CHARS

# --------------------------------------------------------------------------- create-pretraining


def cmd_create_pretraining(args) -> int:
    opts = PretrainingOptions(
        max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob, dupe_factor=args.dupe_factor,
        random_seed=args.random_seed, do_lower_case=args.do_lower_case, do_whole_word_mask=args.whole_word_mask)
    s = create_pretraining_data(args.input, args.vocab, args.output, options=opts, num_parts=args.num_parts,
                                workers=args.workers, combine_files=args.combine_files, config=args.config,
                                overwrite=args.overwrite, progress=not args.no_progress,
                                max_line_chars=args.max_line_chars)
    if args.json:
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
    s = reshard(args.src, args.dst, args.num_parts, overwrite=args.overwrite)
    print(f"wrote {s['output']}: {s['num_records']} records in {s['num_parts']} part file(s)")
    return 0


# --------------------------------------------------------------------------- parsers


def _add_commands(sub) -> None:
    c = sub.add_parser(
        "create-pretraining", help="text -> masked-LM/next-sentence OFRecord parts (Google's semantics)",
        description="Make BERT pretraining data as google-research/bert's create_pretraining_data.py does: "
                    "one sentence per line, blank lines between documents. Writes OFRecord part files "
                    "part-00000 ..., vocab.txt (a copy of --vocab) and bert_of_data.json into OUTPUT "
                    "(atomically). OUTPUT may not be, contain or lie inside an input.")
    c.add_argument("--input", nargs="+", action="extend", required=True, metavar="FILE",
                   help="text files (also comma-separated lists, glob patterns, directories); "
                        "repeat to add more (--input a.txt --input b.txt)")
    c.add_argument("--vocab", required=True, help="WordPiece vocab.txt")
    c.add_argument("--output", required=True, help="output directory (must be new or empty unless --overwrite)")
    c.add_argument("--max-seq-length", type=int, default=128, help="tokens per instance, [CLS]/[SEP] included "
                   "(default 128)")
    c.add_argument("--max-predictions-per-seq", type=int, default=20, help="masked positions per instance at most "
                   "(default 20)")
    c.add_argument("--masked-lm-prob", type=float, default=0.15, help="share of tokens to predict (default 0.15)")
    c.add_argument("--short-seq-prob", type=float, default=0.1,
                   help="probability of a shorter random target length (default 0.1)")
    c.add_argument("--dupe-factor", type=int, default=10, help="passes over the data, each with new masks "
                   "(default 10)")
    c.add_argument("--random-seed", "--seed", type=int, default=12345,
                   help="makes the output reproducible (default 12345, Google's)")
    lc = c.add_mutually_exclusive_group()
    lc.add_argument("--do-lower-case", dest="do_lower_case", action="store_true", default=True,
                    help="lower-case and strip accents (default; uncased vocabularies)")
    lc.add_argument("--no-lower-case", "--cased", dest="do_lower_case", action="store_false",
                    help="keep case and accents (cased vocabularies)")
    c.add_argument("--whole-word-mask", "--do-whole-word-mask", action="store_true",
                   help="mask all WordPieces of a word together")
    c.add_argument("--num-parts", type=int, default=1,
                   help="part files to deal instances into, >= the data-parallel ranks that will read them "
                        "(default 1)")
    c.add_argument("--workers", type=int, default=None, help="processes (default: CPUs, at most one per file)")
    c.add_argument("--combine-files", action="store_true",
                   help="all inputs form one corpus with one random stream, exactly as Google's script "
                        "(single process); default: each file is a corpus with its own seed, in parallel")
    c.add_argument("--config", help="model config (config.json / bert_config.json / checkpoint dir): "
                                    "check vocab_size and max_position_embeddings against it")
    c.add_argument("--max-line-chars", type=int, default=MAX_LINE_CHARS,
                   help=f"refuse a line longer than this many characters (default {MAX_LINE_CHARS:,}; 0: no limit)")
    c.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    c.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c.add_argument("--json", action="store_true", help="print the summary as JSON")
    c.set_defaults(fn=cmd_create_pretraining)

    i = sub.add_parser("inspect", help="part files, record counts and features of an OFRecord dataset")
    i.add_argument("path")
    i.add_argument("--check", action="store_true", help="parse every record (default: framing + first record)")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=cmd_inspect)

    r = sub.add_parser("reshard", help="re-deal an OFRecord dataset into N part files (e.g. one per rank)")
    r.add_argument("src")
    r.add_argument("dst")
    r.add_argument("--num-parts", type=int, required=True)
    r.add_argument("--overwrite", action="store_true")
    r.set_defaults(fn=cmd_reshard)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``bert-of data ...`` on the main command line."""
    d = subparsers.add_parser("data", help="pretraining data: create-pretraining, inspect, reshard",
                              description="Pretraining data in OFRecord form.")
    _add_commands(d.add_subparsers(dest="data_command", required=True, metavar="COMMAND"))
    return d


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bert-of data", description="Pretraining data in OFRecord form.")
    _add_commands(p.add_subparsers(dest="data_command", required=True, metavar="COMMAND"))
    return p


def main(argv=None) -> int:
    from bert_of.cli import dispatch

    return dispatch(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
