"""Run as N ranks of bert_of's launcher (tests/conftest.py:run_ranks:
`python -m bert_of.launch --job N 1 0 127.0.0.1 0 tests/scripts/data_rank_reader.py ...`).

Each rank reads datasets with shuffle off through both readers, bert_of's NumPy
`PretrainingDataset(rank, world_size)` and OneFlow's global `nn.OFRecordReader`
(via `OneFlowPretrainingReader`), and writes OUT_DIR/rank<r>.json with a digest of
every record it got, in order: {name: {"numpy": [...], "oneflow": [...], "parts": [...]}}.

Usage: data_rank_reader.py OUT_DIR BATCH_SIZE NAME=DIR[@NUM_BATCHES] ...
(without @NUM_BATCHES: one epoch of the rank's shard, which must divide by BATCH_SIZE).
"""

import hashlib
import json
import os
import sys

import numpy as np

from bert_of._flow import flow
from bert_of.data.oneflow_reader import OneFlowPretrainingReader
from bert_of.data.reader import FEATURES, PretrainingDataset


def digests(batch):
    """One hex digest per row over all features (same dtypes from both readers)."""
    rows = len(batch["input_ids"])
    out = []
    for i in range(rows):
        h = hashlib.sha1()
        for name in FEATURES:
            h.update(np.ascontiguousarray(batch[name][i]).tobytes())
        out.append(h.hexdigest()[:16])
    return out


def main():
    out_dir, batch_size = sys.argv[1], int(sys.argv[2])
    datasets = {}
    for arg in sys.argv[3:]:
        name, d = arg.split("=", 1)
        d, _, nb = d.partition("@")
        datasets[name] = (d, int(nb or 0))
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    meta = json.load(open(os.path.join(next(iter(datasets.values()))[0], "bert_of_data.json")))
    S = meta["features"]["input_ids"][1][0]
    P = meta["features"]["masked_lm_ids"][1][0]
    report = {"rank": rank, "world": world, "datasets": {}}
    for name, (d, num_batches) in datasets.items():
        ds = PretrainingDataset(d, batch_size, S, P, rank=rank, world_size=world, shuffle=False)
        n = num_batches or len(ds) // batch_size
        assert num_batches or len(ds) % batch_size == 0, "one epoch must be whole batches"
        ours = [x for _ in range(n) for x in digests(ds.next_batch())]
        of = OneFlowPretrainingReader(d, batch_size, S, P, shuffle=False)
        theirs = [x for _ in range(n) for x in digests(of.next_batch())]
        report["datasets"][name] = {"numpy": ours, "oneflow": theirs,
                                    "parts": [os.path.basename(p) for p in ds.part_files]}
        ds.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
