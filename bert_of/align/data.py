"""The alignment suite's data: real pretraining records derived into the datasets the experiments
need, read as per-rank shards; and the suite's small shared helpers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np

from bert_of.converters.source import Options
from bert_of.converters.convert import convert
from bert_of.converters.verify.ecosystems import tf_reference_module
from bert_of.data.create_pretraining import PretrainingOptions, create_pretraining_data
from bert_of.data.ofrecord import OFRecordWriter, decode_values, iter_raw_records, parse_record
from bert_of.data.cli import reshard
from bert_of.data.layout import data_lengths, list_data_files
from bert_of.data.reader import PretrainingDataset
from bert_of.errors import BertOfError
from bert_of.files.atomic import atomic_write, write_json
from bert_of.files.reading import read_json
from bert_of.progress import log

# The default corpus ships with the package (a wheel has no tests/data): bert_of/align/default-corpus/
# (a folder name that is no identifier: setuptools takes such a folder for a package).
TEXT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default-corpus")

DEFAULT_CORPUS = (os.path.join(TEXT_DIR, "sample_text.txt"), os.path.join(TEXT_DIR, "classics.txt"))

DEFAULT_VOCAB = os.path.join(TEXT_DIR, "vocab.txt")

NUM_PARTS = 4


class AlignError(BertOfError):
    """A bad experiment name or option, or a run that could not be executed."""


def _log(msg: str, quiet: bool = False) -> None:
    """A progress note on stderr (the bert_of logger), unless ``quiet``."""
    if not quiet:
        log.info(f"[align] {msg}")


# --------------------------------------------------------------------------- files


def _atomic_json(path: str, obj) -> None:
    atomic_write(path, (json.dumps(obj, indent=1, default=_json_default) + "\n").encode())


def _json_default(o):
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# --------------------------------------------------------------------------- data


def _data_key(size: dict, corpus, vocab) -> str:
    h = hashlib.sha256()
    for p in list(corpus) + [vocab]:
        with open(p, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    h.update(json.dumps([size["seq_length"], size["max_predictions"], NUM_PARTS]).encode())
    return h.hexdigest()[:12]


def prepare_data(data_dir: str, size: dict, corpus, vocab, quiet=False, data=None) -> dict:
    """The datasets (cached in ``data_dir``): real pretraining records from ``corpus``.

    base      4 parts made by create_pretraining_data (Google's semantics, seed 12345)
    shuffle   the same parts in another order: part i = base part (i + 2) % 4, i.e. the
              two ranks' shards swapped (the global batch of every step is unchanged)
    repeat    base part 0 copied into all 4 parts
    uniform   base records whose every MLM slot is real (weight sum == max_predictions),
              per part: every micro-batch then has the same MLM weight sum (experiment 3)
    """
    S, P = size["seq_length"], size["max_predictions"]
    if data is not None:  # existing records (OFRecord, TFRecord or HDF5) instead of --corpus
        paths = list_data_files(data)[0]
        if data_lengths(data) != (S, P):
            raise AlignError(f"{data}: records of seq_length/max_predictions {data_lengths(data)}, this --size "
                             f"needs {(S, P)}")
        corpus = paths
    for p in list(corpus) + [vocab]:
        if not os.path.isfile(p):
            raise AlignError(f"{p}: not found (pass --corpus FILE... --vocab FILE)")
    root = os.path.join(data_dir, f"seq{S}-pred{P}-{'data-' if data is not None else ''}"
                                  f"{_data_key(size, corpus, vocab)}")
    dirs = {k: os.path.join(root, k) for k in ("base", "shuffle", "repeat", "uniform")}
    if all(os.path.isfile(os.path.join(d, "bert_of_data.json")) for d in dirs.values()):
        return _alias_uniform(dirs)
    os.makedirs(root, exist_ok=True)
    opts = PretrainingOptions(max_seq_length=S, max_predictions_per_seq=P)
    if not os.path.isfile(os.path.join(dirs["base"], "bert_of_data.json")):
        if data is not None:  # its records as OFRecord parts (file i -> part i when it has NUM_PARTS files)
            _log(f"reading {data} into {root}", quiet)
            done = reshard(data, dirs["base"], None if len(paths) == NUM_PARTS else NUM_PARTS, overwrite=True,
                           fmt="ofrecord")
            meta_path = os.path.join(dirs["base"], "bert_of_data.json")
            if not os.path.isfile(meta_path):  # Google's / NVIDIA's files carry none
                counts = [len(list(iter_raw_records(os.path.join(dirs["base"], f"part-{i:05d}"))))
                          for i in range(NUM_PARTS)]
                write_json(meta_path, {"num_records": done["num_records"], "records_per_part": counts,
                                       "source": os.path.abspath(data),
                                       "options": {"max_seq_length": S, "max_predictions_per_seq": P}})
        else:
            _log(f"creating pretraining data in {root}", quiet)
            create_pretraining_data(list(corpus), vocab, dirs["base"], options=opts, num_parts=NUM_PARTS,
                                    overwrite=True, progress=False, workers=1)
    with open(os.path.join(dirs["base"], "bert_of_data.json")) as f:
        meta = json.load(f)
    parts = [os.path.join(dirs["base"], f"part-{i:05d}") for i in range(NUM_PARTS)]

    def derive(name, sources, keep=None, note=""):
        tmp = dirs[name] + f".tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        counts = []
        for i, src in enumerate(sources):
            n = 0
            with OFRecordWriter(os.path.join(tmp, f"part-{i:05d}")) as w:
                for raw in iter_raw_records(src):
                    if keep is None or keep(raw):
                        w.write(raw)
                        n += 1
            counts.append(n)
        m = dict(meta, records_per_part=counts, num_records=sum(counts), derived_from="base", derivation=note)
        with open(os.path.join(tmp, "bert_of_data.json"), "w") as f:
            json.dump(m, f, indent=2, sort_keys=True)
        shutil.rmtree(dirs[name], ignore_errors=True)
        os.replace(tmp, dirs[name])

    def full_weights(raw):
        fields = parse_record(raw)
        kind, spans = fields["masked_lm_weights"]
        return float(np.sum(decode_values(raw, kind, spans))) == float(P)

    half = NUM_PARTS // 2
    derive("shuffle", [parts[(i + half) % NUM_PARTS] for i in range(NUM_PARTS)],
           note="part i = base part (i + 2) % 4: the ranks' shards swapped")
    derive("repeat", [parts[0]] * NUM_PARTS, note="base part 0 copied into every part")
    derive("uniform", parts, keep=full_weights, note=f"records with {P} real MLM predictions only")
    return _alias_uniform(dirs)


def _alias_uniform(dirs):
    """When every record already has all MLM slots real, "uniform" IS "base": share its runs."""
    counts = []
    for k in ("base", "uniform"):
        with open(os.path.join(dirs[k], "bert_of_data.json")) as f:
            counts.append(json.load(f)["records_per_part"])
    if counts[0] == counts[1]:
        dirs = dict(dirs, uniform=dirs["base"])
    return dirs


def _rename_batch(b: dict) -> dict:
    b = dict(b)
    b["token_type_ids"] = b.pop("segment_ids")
    b["attention_mask"] = b.pop("input_mask")
    return b


class BatchStream:
    """The global batch of every step, or one rank's rows of it.

    The data is read as WORLD shards (rank r of WORLD: its own part files, in order,
    no shuffling, PretrainingDataset's sharding). A 1-process run reads every
    shard and concatenates them in rank order; rank r of a WORLD-rank run reads
    shard r only: the same global batch, the rows where split(0) puts them.

    reader "all-parts" reproduces the lazy OneFlow BERT's bug: every rank reads every
    part from part 0, so all ranks get the same rows.
    """

    def __init__(self, data: dict, rank: int = 0, world: int = 1):
        shards, B = data["shards"], data["batch_size"]
        if world not in (1, shards):
            raise AlignError(f"a {world}-rank run of data read as {shards} shards")
        per = B // shards
        mine = range(shards) if world == 1 else [rank]
        kw = dict(seq_length=data["seq_length"], max_predictions=data["max_predictions"], shuffle=False)
        if data.get("reader", "sharded") == "sharded":
            self.readers = [PretrainingDataset(data["dir"], per, rank=r, world_size=shards, **kw) for r in mine]
        elif data["reader"] == "all-parts":
            self.readers = [PretrainingDataset(data["dir"], per, rank=0, world_size=1, **kw) for _ in mine]
        else:
            raise AlignError(f"unknown reader {data['reader']!r}")

    def next(self) -> dict:
        parts = [r.next_batch() for r in self.readers]
        return _rename_batch({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})

    def close(self):
        for r in self.readers:
            r.close()


def prepare_tf_checkpoint(d: str, gcfg: dict, vocab: str, seed: int, global_step: int) -> tuple:
    """(TF prefix, converted bert_of folder), cached in ``d``: a Google-layout TF checkpoint with
    realistic weights, adam_m / adam_v slots and ``global_step``, and its ``tf2of --with-optimizer``."""
    # TensorFlow (the tf extra): only this needs it
    ref = tf_reference_module("bert_of.converters.verify.tf_reference_checkpoint", "align's TF experiment")

    prefix, of_dir, marker = (os.path.join(d, n) for n in ("bert_model.ckpt", "converted-of", "done.json"))
    want = {"config": gcfg, "global_step": global_step, "seed": seed}
    if not (os.path.isfile(marker) and read_json(marker, "cache marker") == want):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        write_json(os.path.join(d, "bert_config.json"), gcfg)
        shutil.copy(vocab, os.path.join(d, "vocab.txt"))
        ref.make_checkpoint(prefix, gcfg, seed=seed, realistic=True, with_optimizer=True, global_step=global_step)
        convert("tf2of", prefix, of_dir, Options(with_optimizer=True))
        write_json(marker, want)
    return prefix, of_dir
