"""bert_of's training kernels for CPU (bert_of/runtime/train_kernels.py) vs OneFlow's ops, A/B in one
process: eager fine-tuning steps of a QA model, alternating one step with the kernels and one
without (``train_kernels.off()``: OneFlow's ops, as with BERT_OF_CPU_TRAIN_KERNELS=0), so both arms see the same
machine load; then the pieces alone (LayerNorm(x + residual) and dense + GELU, forward + backward).

    .venv/bin/python bench/train_kernels_bench.py --model minilm --seq 384 --batch 8 --steps 2 \
        --out bench/results/train_kernels_minilm384.json

Wall and process CPU seconds per step (medians), the load average before and after. Prints one
JSON object and writes it to --out (default bench/results/train_kernels.json). For the ratio to
transformers see bench/infer_bench.py --tasks train (its t0 rows: the kernels off).
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from infer_worker import BASE, MINILM, VOCAB, windows  # noqa: E402  (the same windows and shapes)


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("minilm", "base"), default="minilm")
    ap.add_argument("--seq", type=int, default=384)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per arm (after one warm-up step each)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per arm of each piece")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "train_kernels.json"))
    a = ap.parse_args()
    os.environ.setdefault("BERT_OF_BLAS", "auto")  # as `bert-of finetune` runs
    os.environ.setdefault("BERT_OF_CPU_TRAIN_KERNELS", "1")  # the A arm: the kernels (their default)
    from bert_of._flow import LayerNorm, dense_act, flow, gelu_erf
    from bert_of.config import BertConfig
    from bert_of.heads import BertForQuestionAnswering
    from bert_of.options import TrainConfig
    from bert_of.runtime import train_kernels
    from bert_of.training.runtime import Runtime
    from bert_of.training.trainer import Trainer

    load0 = os.getloadavg()[0]
    shape = MINILM if a.model == "minilm" else BASE
    flow.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_act="gelu_erf", **shape)
    model = BertForQuestionAnswering(cfg)
    rt = Runtime.create("cpu")
    rt.place(model)
    trainer = Trainer(model, TrainConfig(mode="eager", optimizer="adamw", lr=5e-5, steps=1000, weight_decay=0.01,
                                         adam_eps=1e-6, bias_correction=False, clip_grad_norm=1.0, seed=0), rt)
    data = windows(a.batch * (2 * a.steps + 2), a.seq)
    arms = {"kernels": lambda f: f(), "oneflow": lambda f: _off(train_kernels, f)}
    res = {"model": a.model, "seq": a.seq, "batch": a.batch, "load_before": round(load0, 2), "steps": {}, "pieces": {}}
    i = 0

    def step():
        nonlocal i
        lo = i * a.batch
        i += 1
        return trainer.step({k: v[lo:lo + a.batch] for k, v in data.items()})["loss"]

    times = {k: [] for k in arms}
    for k in arms:  # warm-up (the kernels' checks, OneFlow's first calls)
        arms[k](step)
    for _ in range(a.steps):
        for k, run in arms.items():
            times[k].append(timed(lambda: run(step)))
    for k, t in times.items():
        res["steps"][k] = {"wall_s": round(statistics.median(x[0] for x in t), 3),
                           "cpu_s": round(statistics.median(x[1] for x in t), 3),
                           "all_wall_s": [round(x[0], 3) for x in t]}
    res["steps"]["speedup"] = round(res["steps"]["oneflow"]["wall_s"] / res["steps"]["kernels"]["wall_s"], 3)

    T, H, I = a.batch * a.seq, shape["hidden_size"], shape["intermediate_size"]
    rng = __import__("numpy").random.default_rng(0)
    leaf = lambda *s: flow.tensor(rng.standard_normal(s).astype("float32"), requires_grad=True)  # noqa: E731
    ln, dense = LayerNorm(H), flow.nn.Linear(H, I)
    x, r, h = leaf(a.batch, a.seq, H), leaf(a.batch, a.seq, H), leaf(a.batch, a.seq, H)
    pieces = {"LayerNorm(x + residual) [T, H]": lambda: ln(x, r),
              "dense H->I + GELU [T, I]": lambda: dense_act(dense, h, gelu_erf)}
    for name, fn in pieces.items():
        def fb():
            y = fn()
            y.backward(flow.ones_like(y))
            x.grad.numpy() if x.grad is not None else None
            h.grad.numpy() if h.grad is not None else None
        got = {k: [] for k in arms}
        for k in arms:
            arms[k](fb)
        for _ in range(a.reps):
            for k, run in arms.items():
                got[k].append(timed(lambda: run(fb)))
        res["pieces"][name] = {k: {"wall_ms": round(1e3 * statistics.median(x[0] for x in v), 2),
                                   "cpu_ms": round(1e3 * statistics.median(x[1] for x in v), 2)} for k, v in got.items()}
    res.update(T=T, load_after=round(os.getloadavg()[0], 2), status=train_kernels.train_status(),
               date=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), cpus=os.cpu_count())
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


def _off(train_kernels, f):
    with train_kernels.off():
        return f()


if __name__ == "__main__":
    sys.exit(main())
