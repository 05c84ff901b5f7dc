"""The whole-layer kernel against the same layers op by op, in one process, forwards interleaved.

    .venv/bin/python bench/layer_ab.py --model minilm --model-dir DIR --batch 32 --seq 128 --reps 7
    .venv/bin/python bench/layer_ab.py --model base --batch 4 --seq 384 --reps 5 --out r.json

A forward of bert_of's BertModel (eval, no autograd, eager CPU) on random ids, all positions real:
"layer" runs the encoder's default layer runner (each post-LN layer one call of cpu_kernels.c's
bert_of_layer), "op_by_op" the same model under ``encoder.layers_run_by`` with each layer's own forward
(the per-op kernels). One warm-up forward of each (first-use checks), then --reps rounds alternating
which goes first; medians of wall and CPU (process) milliseconds, the 1-minute load before and after.
--model base: BERT-base's shape with random weights (bert_of's BertConfig defaults: the tanh GELU);
minilm: the checkpoint in --model-dir (a HF directory or bert_of's). Prints one JSON object and writes
it to --out (default bench/results/layer_ab.json).
"""

import argparse
import json
import os
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("minilm", "base"), default="minilm")
    ap.add_argument("--model-dir", help="the checkpoint (--model minilm)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "layer_ab.json"))
    a = ap.parse_args()

    from bert_of import BertConfig, BertModel
    from bert_of._flow import flow
    from bert_of.runtime import blas, kernels

    if a.model == "minilm":
        if not a.model_dir:
            ap.error("--model minilm needs --model-dir")
        model = BertModel.from_pretrained(a.model_dir)
    else:
        model = BertModel(BertConfig())
        model.init_weights(seed=1)
    model.eval()
    rng = np.random.default_rng(0)
    B, S = a.batch, a.seq
    args = [flow.tensor(rng.integers(1, 1000, (B, S))), flow.tensor(np.zeros((B, S), np.int64)),
            flow.tensor(np.ones((B, S), np.int64))]

    def op_by_op(layers, hidden, mask_adder):
        for layer in layers:
            hidden = layer(hidden, mask_adder)
        return hidden

    def forward(kind):
        with flow.no_grad():
            if kind == "op_by_op":
                with model.encoder.layers_run_by(op_by_op):
                    return model(*args).sequence_output.numpy()
            return model(*args).sequence_output.numpy()

    kinds = ("layer", "op_by_op")
    outs = {k: forward(k) for k in kinds}
    load = os.getloadavg()[0]
    times = {k: [] for k in kinds}
    for r in range(a.reps):
        for k in kinds if r % 2 == 0 else kinds[::-1]:
            t, c = time.perf_counter(), time.process_time()
            forward(k)
            times[k].append((time.perf_counter() - t, time.process_time() - c))
    res = {"bench": "layer_ab", "model": a.model, "batch": B, "seq": S, "reps": a.reps,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_before": load,
           "load_after": os.getloadavg()[0], "blas": blas.describe(), "kernels": kernels.native_status(),
           "same_bits": bool(np.array_equal(outs["layer"].view(np.uint32), outs["op_by_op"].view(np.uint32)))}
    for k in kinds:
        res[k] = {"wall_ms": round(float(np.median([w for w, _ in times[k]])) * 1e3, 1),
                  "cpu_ms": round(float(np.median([c for _, c in times[k]])) * 1e3, 1)}
    res["cpu_ratio"] = round(res["layer"]["cpu_ms"] / res["op_by_op"]["cpu_ms"], 3)
    print(json.dumps(res))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
