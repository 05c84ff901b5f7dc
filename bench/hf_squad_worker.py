"""The transformers side of bench/squad_bench.py, as a transformers user runs SQuAD v1.1:

    .venv-anchor/bin/python bench/hf_squad_worker.py init --model HF_DIR --seed 42 --out START_DIR
    .venv-anchor/bin/python bench/hf_squad_worker.py train --model START_DIR --data train.json --out FT_DIR \
        --lr 1e-4 --batch 16 --epochs 1 --seed 42 --warmup 0.1 --weight-decay 0.01 --adam-eps 1e-6
    .venv-anchor/bin/python bench/hf_squad_worker.py predict --model FT_DIR --data dev.json --out preds.json
    .venv-anchor/bin/python bench/hf_squad_worker.py pipeline --model FT_DIR --data dev.json --out preds.json

init: ``AutoModelForQuestionAnswering`` from a base checkpoint with a new span head drawn under
``torch.manual_seed(seed)``, saved (safetensors + tokenizer) so both libraries start from the same
weights. train: a run_qa.py-style loop written here (the facts of what run_qa does, not its code):
windows from the fast tokenizer (question first, ``truncation="only_second"``, max_length 384,
``stride`` = doc stride 128 tokens of overlap, padded to max_length), each window labelled with the
answer's first / last token, or [CLS] (0) where the answer is not wholly inside; shuffled each epoch
(torch generator seeded), torch AdamW (weight decay not on biases / LayerNorm weights), linear schedule
with ``--warmup`` of the steps, grad-norm clip 1.0, the model's own loss ((CE(start) + CE(end)) / 2).
predict: the same windows, logits in batches, run_qa's post-processing (per question over its windows:
the ``n_best`` largest start and end logits, spans inside the context, end >= start, <= ``max_answer``
tokens, best start + end score; the answer is the context's characters under the span's offsets).
pipeline: ``pipeline("question-answering")(question=..., context=..., batch_size=32, max_seq_len=384,
doc_stride=128, max_answer_len=30)``. Each writes the official predictions.json ({id: answer}) and, in
``--out``'s ``.meta.json``, the seconds of its own work. The bench times whole processes from outside.
Imports nothing of bert_of.
"""

import argparse
import json
import os
import time


def read_squad(path: str, limit: int = 0) -> list:
    """[(id, question, context, first answer text, its char start)] in file order; the first ``limit``."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)["data"]
    out = []
    for art in data:
        for para in art["paragraphs"]:
            for qa in para["qas"]:
                ans = qa.get("answers") or [{"text": "", "answer_start": -1}]
                out.append((qa["id"], qa["question"].lstrip(), para["context"], ans[0]["text"],
                            int(ans[0]["answer_start"])))
    return out[:limit] if limit else out


def windows(tok, qs, max_len: int, stride: int):
    """The fast tokenizer's windows of every question (padded to max_len) and, per window, its question."""
    enc = tok([q[1] for q in qs], [q[2] for q in qs], truncation="only_second", max_length=max_len,
              stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")
    return enc, enc.pop("overflow_to_sample_mapping")


def labels(enc, owner, qs):
    """Start / end token of the answer in each window; 0 ([CLS]) where it is not wholly inside."""
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        _, _, _, text, a0 = qs[owner[i]]
        a1 = a0 + len(text)
        seq = enc.sequence_ids(i)
        ctx = [j for j, s in enumerate(seq) if s == 1]
        c0, c1 = ctx[0], ctx[-1]
        if not (offsets[c0][0] <= a0 and offsets[c1][1] >= a1):
            starts.append(0)
            ends.append(0)
            continue
        s = c0
        while s <= c1 and offsets[s][0] <= a0:
            s += 1
        e = c1
        while e >= c0 and offsets[e][1] >= a1:
            e -= 1
        starts.append(s - 1)
        ends.append(e + 1)
    return starts, ends


def train(a):
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, get_linear_schedule_with_warmup

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForQuestionAnswering.from_pretrained(a.model)
    qs = read_squad(a.data, a.limit)
    t0 = time.perf_counter()
    enc, owner = windows(tok, qs, a.max_len, a.stride)
    sp, ep = labels(enc, owner, qs)
    cols = {k: torch.tensor(enc[k]) for k in ("input_ids", "token_type_ids", "attention_mask")}
    cols["start_positions"], cols["end_positions"] = torch.tensor(sp), torch.tensor(ep)
    n = len(sp)
    steps_per_epoch = (n + a.batch - 1) // a.batch  # the last, partial batch is a step (Trainer's default)
    total = int(steps_per_epoch * a.epochs)
    no_decay = ("bias", "LayerNorm.weight")
    groups = [{"params": [p for k, p in model.named_parameters() if not any(s in k for s in no_decay)],
               "weight_decay": a.weight_decay},
              {"params": [p for k, p in model.named_parameters() if any(s in k for s in no_decay)],
               "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, eps=a.adam_eps)
    sched = get_linear_schedule_with_warmup(opt, int(a.warmup * total), total)
    gen = torch.Generator().manual_seed(a.seed)
    model.train()
    step, losses = 0, []
    while step < total:
        for idx in torch.randperm(n, generator=gen).split(a.batch):
            if step >= total:
                break
            out = model(**{k: v[idx] for k, v in cols.items()})
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            losses.append(round(out.loss.item(), 4))
            step += 1
    secs = time.perf_counter() - t0
    model.save_pretrained(a.out)
    tok.save_pretrained(a.out)
    meta = {"questions": len(qs), "windows": n, "steps": step, "train_seconds": round(secs, 2),
            "losses": losses}
    with open(os.path.join(a.out, "train_meta.json"), "w") as f:
        json.dump(meta, f)


def best_spans(enc, owner, start, end, qs, n_best: int, max_answer: int) -> dict:
    """run_qa-style post-processing: {question id: answer text}."""
    import numpy as np

    per_q = {}
    for i in range(len(owner)):
        per_q.setdefault(owner[i], []).append(i)
    preds = {}
    for qi, wins in per_q.items():
        context = qs[qi][2]
        best = None
        for i in wins:
            offsets = enc["offset_mapping"][i]
            seq = enc.sequence_ids(i)
            s_idx = np.argsort(start[i])[::-1][:n_best]
            e_idx = np.argsort(end[i])[::-1][:n_best]
            for s in s_idx:
                for e in e_idx:
                    if seq[s] != 1 or seq[e] != 1 or e < s or e - s + 1 > max_answer:
                        continue
                    score = float(start[i][s] + end[i][e])
                    if best is None or score > best[0]:
                        best = (score, offsets[s][0], offsets[e][1])
        preds[qs[qi][0]] = context[best[1]:best[2]] if best else ""
    return preds


def predict(a):
    import numpy as np
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForQuestionAnswering.from_pretrained(a.model).eval()
    qs = read_squad(a.data, a.limit)
    t0 = time.perf_counter()
    enc, owner = windows(tok, qs, a.max_len, a.stride)
    ids = torch.tensor(enc["input_ids"])
    tt, am = torch.tensor(enc["token_type_ids"]), torch.tensor(enc["attention_mask"])
    start, end = [], []
    with torch.inference_mode():
        for b in range(0, len(ids), a.batch):
            out = model(input_ids=ids[b:b + a.batch], token_type_ids=tt[b:b + a.batch],
                        attention_mask=am[b:b + a.batch])
            start.append(out.start_logits.numpy())
            end.append(out.end_logits.numpy())
    preds = best_spans(enc, owner, np.concatenate(start), np.concatenate(end), qs, a.n_best, a.max_answer)
    write(a.out, preds, {"windows": len(owner), "predict_seconds": round(time.perf_counter() - t0, 2)})


def pipe(a):
    import torch
    from transformers import pipeline

    torch.set_num_threads(a.threads)
    qs = read_squad(a.data, a.limit)
    qa = pipeline("question-answering", model=a.model, device=-1)
    t0 = time.perf_counter()
    out = qa(question=[q[1] for q in qs], context=[q[2] for q in qs], batch_size=a.batch,
             max_seq_len=a.max_len, doc_stride=a.stride, max_answer_len=a.max_answer)
    out = out if isinstance(out, list) else [out]
    write(a.out, {q[0]: o["answer"] for q, o in zip(qs, out)},
          {"predict_seconds": round(time.perf_counter() - t0, 2)})


def init(a):
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    torch.manual_seed(a.seed)
    model = AutoModelForQuestionAnswering.from_pretrained(a.model)
    model.save_pretrained(a.out)
    AutoTokenizer.from_pretrained(a.model).save_pretrained(a.out)


def write(path: str, preds: dict, meta: dict):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(preds, f, ensure_ascii=False)
    with open(path + ".meta.json", "w") as f:
        json.dump(meta, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("init", "train", "predict", "pipeline"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=0, help="the first N questions of --data (0: all)")
    ap.add_argument("--max-len", type=int, default=384)
    ap.add_argument("--stride", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--n-best", type=int, default=20)
    ap.add_argument("--max-answer", type=int, default=30)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--warmup", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("USE_TF", "0")
    {"init": init, "train": train, "predict": predict, "pipeline": pipe}[a.what](a)


if __name__ == "__main__":
    main()
