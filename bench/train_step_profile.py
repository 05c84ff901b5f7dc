"""Where one fine-tuning step's time goes, bert_of (OneFlow 0.9, eager, CPU) beside transformers (torch):
forward, backward, global-norm clip, optimizer update, zero-grad, each timed to its end (OneFlow runs
asynchronously: each phase waits for its tensors), wall and CPU seconds, medians over --steps steps
after --warm warm-up steps. The same SQuAD-shaped windows and the same recipe as bench/infer_worker.py
--task train (BertForQuestionAnswering, AdamW lr 5e-5, weight decay 0.01, eps 1e-6, clip 1.0, dropout 0.1).

    .venv/bin/python bench/train_step_profile.py --impl of --model-dir OF_DIR --seq 128 --batch 8
    /work/ext/anchor/bin/python bench/train_step_profile.py --impl hf --model-dir HF_DIR --seq 128 --batch 8

Prints one JSON object: {"phases": {phase: {"ms": median wall, "cpu_ms": median CPU}}, "step_ms", ...}.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from infer_worker import hf_adamw, windows  # noqa: E402  (the bench train rows' windows and optimizer)

PHASES = ("forward", "backward", "clip", "step", "zero_grad")


def timed(phases, name, fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    phases.setdefault(name, []).append(((time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000))
    return out


def run_hf(a, data):
    os.environ.setdefault("USE_TF", "0")
    import torch
    import transformers

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = transformers.BertForQuestionAnswering.from_pretrained(a.model_dir)
    model.train()
    t = {k: torch.from_numpy(v) for k, v in data.items()}
    opt = hf_adamw(torch, model)

    def step(i, phases):
        lo, hi = i * a.batch, (i + 1) * a.batch
        out = timed(phases, "forward", lambda: model(**{k: v[lo:hi] for k, v in t.items()}))
        timed(phases, "backward", lambda: out.loss.backward())
        timed(phases, "clip", lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        timed(phases, "step", opt.step)
        timed(phases, "zero_grad", opt.zero_grad)
        return float(out.loss)

    return step


def of_eager_step(model_dir, data):
    """bert_of's side of the recipe: (model, runtime, the trainer's EagerStep started on ``data``'s keys)."""
    os.environ.setdefault("BERT_OF_BLAS", "auto")
    from bert_of._flow import flow
    from bert_of.finetuning.steps import load_model
    from bert_of.heads import BertForQuestionAnswering
    from bert_of.options import TrainConfig
    from bert_of.training.runtime import Runtime
    from bert_of.training.trainer import Trainer

    flow.manual_seed(0)
    model, _ = load_model(BertForQuestionAnswering, model_dir)
    rt = Runtime.create("cpu")
    rt.place(model)
    cfg = TrainConfig(mode="eager", optimizer="adamw", lr=5e-5, steps=1000, weight_decay=0.01, adam_eps=1e-6,
                      bias_correction=False, clip_grad_norm=1.0, seed=0)
    eager = Trainer(model, cfg, rt).way  # its EagerStep: the phases below are EagerStep.run's, timed one by one
    eager.start(tuple(data))
    return model, rt, eager


def run_of(a, data):
    from bert_of._flow import flow
    from bert_of.training.optim import clip_by_global_norm

    model, rt, eager = of_eager_step(a.model_dir, data)
    sync = flow._oneflow_internal.eager.Sync

    def waited(fn):
        def inner():
            out = fn()
            sync()
            return out
        return inner

    def step(i, phases):
        lo, hi = i * a.batch, (i + 1) * a.batch
        micro = [rt.tensor(data[k][lo:hi]) for k in eager.keys]
        values = timed(phases, "forward", waited(lambda: eager.scalars_of(*micro)))
        timed(phases, "backward", waited(lambda: (values[0] * 1.0).backward()))  # as EagerStep.run
        params = [p for p in model.parameters() if p.grad is not None]
        timed(phases, "clip", waited(lambda: clip_by_global_norm(params, 1.0, eager.views)))
        timed(phases, "step", waited(eager.opt.step))
        timed(phases, "zero_grad", waited(eager.opt.zero_grad))
        eager.sched.step()
        return float(values[0].numpy())

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=("hf", "of"), required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warm", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    data = windows(a.batch * (a.steps + a.warm), a.seq)
    step = (run_hf if a.impl == "hf" else run_of)(a, data)
    phases, losses = {}, []
    for i in range(a.warm + a.steps):
        p = {}
        losses.append(step(i, p))
        if i >= a.warm:
            for k, v in p.items():
                phases.setdefault(k, []).extend(v)
    mid = lambda xs: round(sorted(xs)[len(xs) // 2], 1)  # noqa: E731
    med = {k: {"ms": mid([x[0] for x in v]), "cpu_ms": mid([x[1] for x in v])} for k, v in phases.items()}
    res = {"impl": a.impl, "seq": a.seq, "batch": a.batch, "phases": med,
           "step_ms": round(sum(v["ms"] for v in med.values()), 1), "losses": [round(x, 4) for x in losses]}
    if a.impl == "of":
        from bert_of.runtime.train_kernels import train_status
        res["train_kernels"] = train_status()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
