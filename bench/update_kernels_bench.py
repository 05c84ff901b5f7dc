"""The step's update after the backward, OneFlow's ops beside bert_of's update kernels
(bert_of/runtime/update_kernels.py), in one process on the gradients of one real MiniLM fine-tuning
backward (BertForQuestionAnswering, the recipe of bench/train_step_profile.py): the global norm, the
clip's scaling and AdamW's step (both groups), each timed to its end (OneFlow's VM waited
for), the two ways interleaved round by round; medians and minima of wall and CPU milliseconds.

    .venv/bin/python bench/update_kernels_bench.py --model-dir OF_DIR --seq 128 --batch 8 --rounds 9

Prints one JSON object: {"phases": {phase: {"oneflow": {...}, "kernels": {...}}}, "load": [before, after], ...}.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from infer_worker import windows  # noqa: E402  (the same windows as the bench's train rows)
from train_step_profile import of_eager_step  # noqa: E402  (the same model, recipe and step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    os.environ.setdefault("BERT_OF_BLAS", "auto")
    import numpy as np

    import bert_of.runtime.update_kernels as uk
    from bert_of._flow import flow

    load0 = os.getloadavg()[0]
    data = windows(a.batch, a.seq)
    model, rt, eager = of_eager_step(a.model_dir, data)
    opt = eager.opt
    sync = flow._oneflow_internal.eager.Sync
    values = eager.scalars_of(*[rt.tensor(data[k]) for k in eager.keys])
    (values[0] * 1.0).backward()
    sync()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    one, views = flow.tensor(np.float32(1.0)), uk.Views()

    def oneflow_step():
        os.environ["BERT_OF_CPU_ADAMW"] = "0"
        try:
            opt.step()
        finally:
            del os.environ["BERT_OF_CPU_ADAMW"]

    ways = {  # phase: (OneFlow's ops, the kernel); the scaling by 1.0 keeps the gradients as they are
        "norm": (lambda: flow.sqrt(sum((g * g).sum() for g in grads)).numpy(), lambda: uk.global_norm(grads, views)),
        "scale": (lambda: [g.mul_(one) for g in grads], lambda: uk.scale(grads, np.float32(1.0), views)),
        "adamw": (oneflow_step, opt.step),
    }
    times = {}
    for _ in range(a.rounds):
        for phase, fns in ways.items():
            for way, fn in zip(("oneflow", "kernels"), fns):
                sync()
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                sync()
                times.setdefault(phase, {}).setdefault(way, []).append(
                    ((time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000))
    mid = lambda xs: round(sorted(xs)[len(xs) // 2], 2)  # noqa: E731
    out = {phase: {way: {"ms": mid([x[0] for x in v]), "min_ms": round(min(x[0] for x in v), 2),
                         "cpu_ms": mid([x[1] for x in v])} for way, v in ws.items()} for phase, ws in times.items()}
    print(json.dumps({"seq": a.seq, "batch": a.batch, "rounds": a.rounds, "tensors": len(grads),
                      "elements": int(sum(g.numel() for g in grads)), "phases": out,
                      "update_status": uk.update_status(), "load": [round(load0, 2), round(os.getloadavg()[0], 2)]}))


if __name__ == "__main__":
    main()
