"""Peak memory of every format pair on a BERT-large-shaped checkpoint (336M parameters, 1.34 GB).

    .venv/bin/python bench/streaming_bench.py [--formats tf,of,lazy,hf,h5]

Makes (once, cached in bench/out/) a BERT-large checkpoint in bert_of's format,
converts it to every other format, then runs every pair X2Y, each as a fresh
`bert-of convert` process, and reports wall time and peak RSS (wait4's
ru_maxrss). Target (issue 3): peak RSS under 600 MB whatever the pair. Prints
one JSON object.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.path.join(ROOT, "bench", "out", "large")
BERT_OF = os.path.join(ROOT, ".venv", "bin", "bert-of")
LIMIT_MB = 600


def run(cmd):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    return round(wall, 2), round(ru.ru_maxrss / 1024 * 1.048576, 1)  # MB (10^6 bytes)


def make_large(path):
    """A BERT-large-shaped bert_of checkpoint, written tensor by tensor from a seeded RNG."""
    from bert_of.checkpoint import write_checkpoint
    from bert_of.tensors import TensorSpec, expected_shapes
    from bert_of.config import BertConfig

    cfg = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                     provenance="tf1")
    shapes = {k: v for k, v in expected_shapes(cfg).items() if not k.startswith(("qa_outputs", "classifier"))}
    vocab = os.path.join(OUT, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(30517)]) + "\n")

    def producer(i, shape):
        return lambda: (np.random.default_rng(i).standard_normal(shape, dtype=np.float32) * 0.05)

    items = [(TensorSpec(k, np.float32, s), producer(i, s)) for i, (k, s) in enumerate(sorted(shapes.items()))]
    write_checkpoint(path, items, cfg, vocab)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="tf,of,lazy,hf,h5")
    a = ap.parse_args()
    fmts = a.formats.split(",")
    os.makedirs(OUT, exist_ok=True)
    src = {"of": os.path.join(OUT, "of")}
    if not os.path.isdir(src["of"]):
        make_large(src["of"])
    from bert_of.checkpoint import SafetensorsFile

    with SafetensorsFile(os.path.join(src["of"], "model.safetensors")) as f:
        params = sum(int(np.prod(f.shape(k))) for k in f.keys())
    results = {}
    for f in fmts:  # of -> each format (these runs count too)
        if f == "of":
            continue
        src[f] = os.path.join(OUT, f)
        shutil.rmtree(src[f], ignore_errors=True)
        results[f"of2{f}"] = run([BERT_OF, "convert", f"of2{f}", src["of"], "-o", src[f]])
    for x in fmts:
        for y in fmts:
            if x == y or x == "of":
                continue
            dst = os.path.join(OUT, f"{x}2{y}")
            shutil.rmtree(dst, ignore_errors=True)
            results[f"{x}2{y}"] = run([BERT_OF, "convert", f"{x}2{y}", src[x], "-o", dst, "--vocab",
                                       os.path.join(src["of"], "vocab.txt")])
            shutil.rmtree(dst, ignore_errors=True)
    weights = os.path.join(src["of"], "model.safetensors")
    peak = max(r[1] for r in results.values())
    print(json.dumps({
        "benchmark": "every format pair, BERT-large shape",
        "checkpoint_bytes": os.path.getsize(weights),
        "parameters": params,
        "pairs": {k: {"wall_s": w, "peak_rss_mb": m} for k, (w, m) in results.items()},
        "max_peak_rss_mb": peak, "limit_mb": LIMIT_MB, "ok": peak < LIMIT_MB,
    }, indent=2))


if __name__ == "__main__":
    main()
