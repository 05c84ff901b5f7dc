"""The transformers side of bench/infer_bench.py's "user rows" workload, as a transformers user runs it:

    .venv-anchor/bin/python bench/hf_pipeline_worker.py --model HF_DIR --rows rows.csv --out labels.json

``pipeline("text-classification", model=HF_DIR)(rows, batch_size=32)`` on CPU (torch, --threads
threads) over the ``text`` column of a CSV; writes each row's label and top probability, in input
order, and the seconds spent in the pipeline call, to --out (JSON). The bench times the whole
process from outside (interpreter start, imports and load included). Imports nothing of bert_of.
"""

import argparse
import csv
import json
import os
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", required=True, help="CSV with a text column")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.environ.setdefault("USE_TF", "0")
    import torch
    from transformers import pipeline

    torch.set_num_threads(a.threads)
    with open(a.rows, encoding="utf-8", newline="") as f:
        rows = [r["text"] for r in csv.DictReader(f)]
    clf = pipeline("text-classification", model=a.model, device=-1)
    t0 = time.perf_counter()
    out = clf(rows, batch_size=a.batch)
    secs = time.perf_counter() - t0
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"labels": [o["label"] for o in out], "scores": [o["score"] for o in out],
                   "predict_seconds": round(secs, 3)}, f)


if __name__ == "__main__":
    main()
