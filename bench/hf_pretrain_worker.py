"""The anchor: one HF transformers BertForPreTraining (PyTorch, CPU) pretraining timing run.

    .venv-anchor/bin/python bench/hf_pretrain_worker.py --head gathered --threads 2 --steps 20 --out r.json

Same model, batch and step as bench/pretrain_worker.py (it is imported for CONFIG,
SEQ, PRED, TRAIN and the synthetic batches, NumPy only): BertConfig 4x256, tanh
GELU (HF's "gelu_new" is Google's formula), dropout 0.1 on, AdamW (eps 1e-6,
weight decay 0.01 not on bias/LayerNorm), one global-norm clip at 1.0, linear
warmup then linear decay, Google's MLM + NSP loss.

--head gathered: the fair comparison. ``model.bert(...)``, then the MLM head on the
    PRED gathered positions only (as bert_of and Google do), NSP on the pooled output.
--head default:  HF's own ``BertForPreTraining(..., labels=, next_sentence_label=)``:
    the V-wide MLM head runs on all S positions, loss over the masked ones (-100 elsewhere).
--act: hidden_act (gelu_new = Google's tanh formula; gelu = erf; gelu_pytorch_tanh = fused tanh).
--attn: attn_implementation (sdpa is transformers' default, eager the plain matmul/softmax path).
"""

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pretrain_worker import CONFIG, N_BATCHES, PRED, SEQ, TRAIN, make_batch, threads_now  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head", choices=("gathered", "default"), default="gathered")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--act", default="gelu_new")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    os.environ.setdefault("USE_TF", "0")  # transformers would otherwise import TensorFlow (same venv)
    import torch
    import transformers

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(**CONFIG, hidden_act=a.act, layer_norm_eps=1e-12, initializer_range=0.02,
                                  attn_implementation=a.attn)
    model = transformers.BertForPreTraining(cfg)
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    no_decay = TRAIN.get("no_decay", ("bias", "LayerNorm", "layer_norm"))
    groups = [{"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": TRAIN["weight_decay"]},
              {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=TRAIN["lr"], betas=(0.9, 0.999), eps=1e-6)
    warm, total = TRAIN["warmup_steps"], TRAIN["steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / warm if s < warm else max(0.0, (total - s) / max(1, total - warm)))

    batches = []
    for i in range(N_BATCHES):
        b = make_batch(i, a.batch)
        t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in b.items()}
        if a.head == "default":  # HF's labels: the masked ids at their positions, -100 elsewhere
            labels = torch.full((a.batch, SEQ), -100, dtype=torch.long)
            keep = t["masked_lm_weights"] > 0
            rows = torch.arange(a.batch)[:, None].expand(-1, PRED)
            labels[rows[keep], t["masked_lm_positions"][keep]] = t["masked_lm_ids"][keep]
            t["labels"] = labels
        batches.append(t)

    V = CONFIG["vocab_size"]

    def loss_of(t):
        if a.head == "default":
            out = model(input_ids=t["input_ids"], token_type_ids=t["token_type_ids"], attention_mask=t["attention_mask"],
                        labels=t["labels"], next_sentence_label=t["next_sentence_labels"])
            return out.loss
        out = model.bert(input_ids=t["input_ids"], token_type_ids=t["token_type_ids"], attention_mask=t["attention_mask"])
        seq, pooled = out[0], out[1]
        pos = t["masked_lm_positions"]
        gathered = torch.gather(seq, 1, pos.unsqueeze(-1).expand(-1, -1, seq.shape[-1]))  # [B, P, H]
        logits = model.cls.predictions(gathered)  # [B, P, V]
        nsp_logits = model.cls.seq_relationship(pooled)
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, V), t["masked_lm_ids"].reshape(-1), reduction="none")
        w = t["masked_lm_weights"].reshape(-1)
        mlm = (w * nll).sum() / (w.sum() + 1e-5)
        nsp = torch.nn.functional.cross_entropy(nsp_logits, t["next_sentence_labels"])
        return mlm + nsp

    def step(t):
        loss = loss_of(t)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.item())

    t0 = time.perf_counter()
    for i in range(a.warmup):
        step(batches[i % N_BATCHES])
    warm_s = time.perf_counter() - t0
    times, losses = [], []
    ru0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for i in range(a.steps):
        ts = time.perf_counter()
        losses.append(step(batches[(a.warmup + i) % N_BATCHES]))
        times.append(time.perf_counter() - ts)
    wall = time.perf_counter() - c0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    res = {"framework": "pytorch", "head": a.head, "threads": a.threads, "hidden_act": a.act,
           "attn_implementation": model.config._attn_implementation, "global_batch": a.batch, "steps": a.steps,
           "warmup": a.warmup, "samples_per_s": round(a.batch * a.steps / wall, 3), "step_s": [round(t, 4) for t in times],
           "step_median_s": round(float(np.median(times)), 4), "warmup_s": round(warm_s, 2),
           "loss_first_last": [losses[0], losses[-1]], "torch": torch.__version__, "transformers": transformers.__version__,
           "used": [{"torch_num_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                     "os_threads": threads_now(), "cpu_s_per_wall_s": round(cpu / wall, 2),
                     "cpu_s_per_step": round(cpu / a.steps, 3)}]}
    with open(a.out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
