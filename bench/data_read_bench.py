"""Reading pretraining data: records/s of one reader worker for the same records as OFRecord,
TFRecord (plain and gzip) and NVIDIA HDF5, through PretrainingDataset.next_batch (what `bert-of
pretrain` calls each step: shuffled random access, decode, range check), and the share of a training
step that this reading would take beside bench/results/pretrain.json's measured step rate.

    .venv/bin/python bench/data_read_bench.py [--dupe-factor 40] [--batch 32] [--repeat 3]
        [--out bench/results/data_read.json]

The records: tests/data/text (sample_text.txt + classics.txt), seq 128, 20 predictions, made by
`bert-of data create-pretraining`, converted with `bert-of data convert` (the same records in each
format, checked). One process, one thread of Python (the reader's worker); best of --repeat passes
over the data, formats interleaved (the machine is shared).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bert_of.data.reader import FEATURES, PretrainingDataset  # noqa: E402
from bert_of.files.atomic import write_json  # noqa: E402

TEXT = os.path.join(ROOT, "tests", "data", "text")
FORMATS = {"ofrecord": [], "tfrecord": ["--format", "tfrecord"], "tfrecord_gzip": ["--format", "tfrecord", "--gzip"],
           "hdf5": ["--format", "hdf5"]}


def cli(*args):
    subprocess.run([sys.executable, "-m", "bert_of", *map(str, args)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)


def read_rate(path, batch, seq, pred):
    """(records/s, records read): every record of the set once, in shuffled batches."""
    with PretrainingDataset(path, batch, seq, pred, shuffle=True, seed=1) as ds:
        n = len(ds) // batch
        t = time.perf_counter()
        first = None
        for _ in range(n):
            b = ds.next_batch()
            first = b if first is None else first
        dt = time.perf_counter() - t
    return n * batch / dt, n * batch, first


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dupe-factor", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "data_read.json"))
    a = ap.parse_args()
    seq, pred = 128, 20
    with tempfile.TemporaryDirectory() as tmp:
        sets = {}
        for fmt, extra in FORMATS.items():
            sets[fmt] = os.path.join(tmp, fmt)
            if fmt == "ofrecord":
                cli("data", "create-pretraining", "--input", os.path.join(TEXT, "sample_text.txt"),
                    os.path.join(TEXT, "classics.txt"), "--vocab", os.path.join(TEXT, "vocab.txt"), "-o", sets[fmt],
                    "--dupe-factor", a.dupe_factor, "--num-parts", 2, "--no-progress")
            else:
                cli("data", "convert", sets["ofrecord"], "-o", sets[fmt], *extra)
        sizes = {f: sum(os.path.getsize(os.path.join(p, n)) for n in os.listdir(p) if n.startswith("part-"))
                 for f, p in sets.items()}
        best = {f: 0.0 for f in sets}
        count, firsts = 0, {}
        for _ in range(a.repeat):
            for fmt, path in sets.items():
                rate, count, first = read_rate(path, a.batch, seq, pred)
                best[fmt] = max(best[fmt], rate)
                firsts[fmt] = first
        same = all(np.array_equal(firsts["ofrecord"][k], firsts[f][k]) for f in sets for k in FEATURES)
    step = json.load(open(os.path.join(ROOT, "bench", "results", "pretrain.json")))
    sps = step["samples_per_s_median"]["of_graph_1p"]  # BERT-base, seq 128, 1 process, graph
    rows = {f: {"records_per_s_per_worker": round(best[f]), "bytes": sizes[f],
                "share_of_step_time": round(sps / best[f], 5)} for f in sets}
    out = {"benchmark": "pretraining data reading per worker: PretrainingDataset.next_batch (shuffled)",
           "command": "bench/data_read_bench.py " + " ".join(sys.argv[1:]),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "shared": "~9 engineers"},
           "records": count, "seq_length": seq, "max_predictions": pred, "batch": a.batch, "repeat": a.repeat,
           "same_first_batch_in_every_format": bool(same),
           "step_rate_from": "bench/results/pretrain.json samples_per_s_median.of_graph_1p "
                             f"({sps} samples/s, BERT-base seq 128, 1 process)",
           "share_of_step_time_means": "reading time per record x samples/s of a training step: the share of "
                                       "a step one worker spends reading its records",
           "rows": rows}
    write_json(a.out, out)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
