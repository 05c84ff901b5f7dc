"""One measurement of bench/infer_bench.py, in a process of its own (its peak RSS is the row's).

    .venv/bin/python bench/infer_worker.py --impl of --mode graph --model minilm --model-dir DIR \
        --seq 384 --task predict --rows 32 --out r.json
    .venv-anchor/bin/python bench/infer_worker.py --impl hf --model minilm --model-dir HF_DIR ...

--impl hf: transformers' BertForQuestionAnswering (PyTorch, 2 threads, eager); --impl ort: `bert-of
predict --engine onnxruntime`'s engine on a checkpoint that --task save wrote; --impl of: bert_of's,
through what `bert-of predict squad` / `finetune squad` run (bert_of/training/inference.py: infer, and the
trainer with train()'s graph micro-batching). Both see the same windows: NumPy draws them from one
seed here (SQuAD-like: [CLS] question [SEP] context [SEP], every window full, as run_squad's windows
of a long context are). --task predict: windows/s over --rows windows, the whole run timed as a user
sees it (a graph's build included, and reported apart); --task train: AdamW steps of --batch windows (dropout 0.1, clip
1.0), windows/s over --steps steps after one warm-up step. Writes one JSON object to --out.
"""

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

MINILM = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
VOCAB = 30522


def status(key: str) -> int:
    """A /proc/self/status figure in MiB (VmHWM: peak RSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) // 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def windows(n: int, seq: int, seed: int = 1234) -> dict:
    """n SQuAD-shaped windows: question of 10-30 tokens, context filling the rest, answers inside."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, VOCAB, (n, seq)).astype(np.int64)
    q = rng.integers(10, 31, n)
    ids[:, 0] = 101
    segs = np.zeros((n, seq), np.int64)
    for i in range(n):
        ids[i, q[i] + 1] = 102
        segs[i, q[i] + 2:] = 1
    ids[:, -1] = 102
    start = np.array([rng.integers(q[i] + 2, seq - 12) for i in range(n)], np.int64)
    end = start + rng.integers(0, 10, n)
    return dict(input_ids=ids, token_type_ids=segs, attention_mask=np.ones((n, seq), np.int64),
                start_positions=start, end_positions=end)


def run_hf(a, data):
    os.environ.setdefault("USE_TF", "0")
    import torch
    import transformers

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.model == "minilm":
        model = transformers.BertForQuestionAnswering.from_pretrained(a.model_dir)
    else:  # Google's tanh GELU, as bert_of's BertConfig()
        model = transformers.BertForQuestionAnswering(transformers.BertConfig(**BASE, hidden_act="gelu_new"))
    loaded = status("VmRSS")
    t = {k: torch.from_numpy(v) for k, v in data.items()}
    if a.task == "predict":
        model.eval()
        keys = ("input_ids", "token_type_ids", "attention_mask")

        def batch(lo, hi):
            with torch.inference_mode():
                out = model(**{k: t[k][lo:hi] for k in keys})
                return out.start_logits.numpy(), out.end_logits.numpy()

        return predict_loop(batch, a, loaded)
    model.train()
    opt = hf_adamw(torch, model)

    def step(lo, hi):
        out = model(**{k: v[lo:hi] for k, v in t.items()})
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return float(out.loss)

    return train_loop(step, a, loaded)


def run_of(a, data):
    os.environ.setdefault("BERT_OF_BLAS", "auto")  # as `bert-of predict` / `finetune` run (infer_bench sets it per row)
    from bert_of._flow import flow
    from bert_of.config import BertConfig
    from bert_of.finetuning.steps import load_model
    from bert_of.training.inference import infer
    from bert_of.training.oneflow_engine import graph_accum_steps
    from bert_of.heads import BertForQuestionAnswering
    from bert_of.options import TrainConfig
    from bert_of.training.runtime import Runtime
    from bert_of.training.trainer import Trainer

    flow.manual_seed(0)
    if a.model == "minilm":
        model, _ = load_model(BertForQuestionAnswering, a.model_dir)
    else:
        model = BertForQuestionAnswering(BertConfig(**BASE))
    rt = Runtime.create("cpu")
    rt.place(model)  # several ranks (bench --ranks): parameters broadcast, rows split
    loaded = status("VmRSS")
    if a.task == "predict":
        # one infer() call over every window, as `bert-of predict squad` makes (a graph builds inside)
        rows, stats = [data[k][:a.rows] for k in ("input_ids", "token_type_ids", "attention_mask")], {}
        t0, c0 = time.perf_counter(), time.process_time()
        infer(model, rows, ("start_logits", "end_logits"), a.batch, a.mode, rt, stats=stats,
              positions=("start_logits", "end_logits"), fill=float("-inf"))  # as predict squad (full windows here)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        build = stats["build_seconds"]
        return dict(windows_per_s=round(a.rows / secs, 3), seconds=round(secs, 2), cpu_seconds=round(cpu, 2),
                    loaded_rss_mib=loaded, graph_build_s=build or None, rows_per_call=stats["batch_size"])
    accum = graph_accum_steps(model.config, a.seq, a.batch, rt.device) if a.mode == "graph" else 1
    cfg = TrainConfig(mode=a.mode, optimizer="adamw", lr=5e-5, steps=1000, weight_decay=0.01, adam_eps=1e-6,
                      bias_correction=False, clip_grad_norm=1.0, grad_accum_steps=accum, seed=0)
    trainer = Trainer(model, cfg, rt)

    def step(lo, hi):
        return trainer.step({k: v[lo:hi] for k, v in data.items()})["loss"]

    res = train_loop(step, a, loaded)
    res.update(micro_batches=accum)
    return res


def save_qa(a):
    """--task save: the model run_of times, as a checkpoint folder (--out): what --impl ort reads
    (onnxruntime runs a checkpoint's own QA head; bert_of's rows initialise MiniLM's at seed 0)."""
    os.environ.setdefault("BERT_OF_BLAS", "auto")
    from bert_of._flow import flow
    from bert_of.config import BertConfig
    from bert_of.finetuning.driver import save_finetuned
    from bert_of.finetuning.steps import load_model
    from bert_of.heads import BertForQuestionAnswering
    from bert_of.training.runtime import Runtime

    flow.manual_seed(0)
    if a.model == "minilm":
        model, _ = load_model(BertForQuestionAnswering, a.model_dir)
    else:
        model = BertForQuestionAnswering(BertConfig(**BASE))
    save_finetuned(model, a.out, {"task": "squad"}, False, Runtime.create("cpu"))


def ort_mode() -> str:
    """The onnxruntime row's column: ``onnxruntime``, with the engine's switches when set."""
    fused = "" if os.environ.get("BERT_OF_ORT_FUSED", "1") != "0" else " of2onnx graph"
    spin = {"0": " spin0", "1": " spin1"}.get(os.environ.get("BERT_OF_ORT_SPIN", ""), "")
    return "onnxruntime" + fused + spin


def run_ort(a, data):
    """`bert-of predict squad --engine onnxruntime`'s engine over the same windows: the checkpoint's
    ONNX graph built in memory (its build, an onnxruntime session's optimisation, reported apart as
    graph_build_s, as a OneFlow graph's), then infer's batching, timed whole."""
    from bert_of.training.onnxruntime_engine import OnnxModel

    model = OnnxModel(a.model_dir, threads=a.threads)
    loaded = status("VmRSS")
    rows = [data[k][:a.rows] for k in ("input_ids", "token_type_ids", "attention_mask")]
    t0, c0 = time.perf_counter(), time.process_time()
    model.infer(rows, ("start_logits", "end_logits"), a.batch, positions=("start_logits", "end_logits"),
                fill=float("-inf"))
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dict(windows_per_s=round(a.rows / secs, 3), seconds=round(secs, 2), cpu_seconds=round(cpu, 2),
                loaded_rss_mib=loaded, graph_build_s=round(model.build_seconds, 2), engine="onnxruntime",
                ort_threads=model.threads, ort_fused=model.fused)


def pieces(fw, a):
    """--task profile: one encoder layer's pieces at [--batch rows, --seq] for --model's shape, in
    milliseconds (median of 5 after one warm-up): GEMMs (q/k/v + attention output, FFN up and
    down), the attention's batched matmuls and softmax, the attention core whole (scores, mask,
    softmax, product with v, heads merged), the element-wise work around them (mask add,
    GELU, a bias add, LayerNorm, the heads' transpose), then the whole layer as each library runs it.
    Where a prediction's time goes, side by side. bert_of's rows call what its layer calls (for
    inference on CPU, cpu_kernels.c where it applies); its "alt:" rows time OneFlow's own ops for the
    same piece (what BERT_OF_CPU_KERNELS=0 runs)."""
    c = MINILM if a.model == "minilm" else BASE
    B, S, H, N, I = a.batch, a.seq, c["hidden_size"], c["num_attention_heads"], c["intermediate_size"]
    D = H // N
    rng = np.random.default_rng(0)
    arr = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    # weights ~ N(0, 1/fan_in): activations of unit scale, as in a trained layer (unscaled, the FFN's
    # pre-activations reach |u| ~ 30, where OneFlow's scalar exp takes slow paths and GELU runs ~2x slower)
    x, b_up = arr(B * S, H), arr(I)
    w4, w_up, w_dn = arr(H, H) / np.sqrt(H), arr(I, H) / np.sqrt(H), arr(H, I) / np.sqrt(I)
    q, k, v = arr(B, N, S, D), arr(B, N, S, D), arr(B, N, S, D)
    scores, mask = arr(B, N, S, S), np.zeros((B, 1, 1, S), np.float32)
    if fw == "torch":
        import torch
        import transformers

        torch.set_num_threads(a.threads)
        T = torch.from_numpy
        x, w4, w_up, w_dn, b_up, q, k, v, scores, mask = map(T, (x, w4, w_up, w_dn, b_up, q, k, v, scores, mask))
        cfg = transformers.BertConfig(**c, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
        layer = transformers.models.bert.modeling_bert.BertLayer(cfg).eval()
        hid, u = x.reshape(B, S, H), torch.nn.functional.linear(x, w_up)
        ops = {"gemm q/k/v/out (4x [BS,H]x[H,H])": lambda: [torch.nn.functional.linear(x, w4) for _ in range(4)][-1],
               "gemm ffn up [BS,H]x[H,I]": lambda: torch.nn.functional.linear(x, w_up),
               "gemm ffn down [BS,I]x[I,H]": lambda: torch.nn.functional.linear(u, w_dn),
               "attention q.k^T and p.v": lambda: torch.matmul(torch.matmul(q, k.transpose(-1, -2)), v),
               "softmax [B,N,S,S]": lambda: torch.softmax(scores, -1),
               "scores + mask [B,N,S,S]": lambda: scores + mask,
               "softmax(scores + mask) [B,N,S,S]": lambda: torch.softmax(scores + mask, -1),
               "attention core: softmax(q.k^T/sqrt(D) + mask) v -> [B,S,H]":  # what its sdpa layer runs
                   lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                   .transpose(1, 2).reshape(B, S, H),
               "GELU (tanh) [BS,I]": lambda: layer.intermediate.intermediate_act_fn(u),
               "bias add [BS,I]": lambda: u + b_up,
               "LayerNorm [BS,H]": lambda: layer.output.LayerNorm(hid),
               "LayerNorm(x + residual) [BS,H]": lambda: layer.output.LayerNorm(hid + hid),
               "heads: [B,S,H] -> [B,N,S,D] copy": lambda: hid.view(B, S, N, D).transpose(1, 2).contiguous(),
               "query + heads: linear [BS,H]x[H,H] + bias -> [B,N,S,D]":
                   lambda: layer.attention.self.query(hid).view(B, S, N, D).transpose(1, 2).contiguous(),
               "heads: [B,N,S,D] -> [B,S,H] copy": lambda: q.transpose(1, 2).reshape(B, S, H),
               "whole layer (sdpa)": lambda: layer(hid)[0]}
        run = lambda f: f()  # noqa: E731
        ctx = torch.inference_mode
    else:
        os.environ.setdefault("BERT_OF_BLAS", "auto")
        from bert_of._flow import flow
        from bert_of.config import BertConfig
        from bert_of.modeling import BertLayer
        from bert_of.runtime import kernels

        F = lambda t: flow.tensor(t)  # noqa: E731
        x, w4, w_up, w_dn, b_up, q, k, v, scores, mask = map(F, (x, w4, w_up, w_dn, b_up, q, k, v, scores, mask))
        layer = BertLayer(BertConfig(**c, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        layer.eval()
        hid = x.reshape(B, S, H)
        lin = lambda a_, w: flow.matmul(a_, w, transpose_b=True)  # noqa: E731
        u = lin(x, w_up)
        ln, qkv = layer.output.LayerNorm, layer.attention.self.query
        ops = {"gemm q/k/v/out (4x [BS,H]x[H,H])": lambda: [lin(x, w4) for _ in range(4)][-1],
               "gemm ffn up [BS,H]x[H,I]": lambda: lin(x, w_up),
               "gemm ffn down [BS,I]x[I,H]": lambda: lin(u, w_dn),
               "attention q.k^T and p.v": lambda: flow.matmul(flow.matmul(q, k, transpose_b=True), v),
               "softmax [B,N,S,S]": lambda: flow.softmax(scores, dim=-1),
               "scores + mask [B,N,S,S]": lambda: scores + mask,
               "softmax(scores + mask) [B,N,S,S]": lambda: flow.softmax(scores + mask, dim=-1),
               "attention core: softmax(q.k^T/sqrt(D) + mask) v -> [B,S,H]":
                   lambda: kernels.attention(q, k, v, mask, D ** -0.5),
               "alt: attention core, OneFlow's ops (2 matmuls, add, softmax, permute)":
                   lambda: kernels._attention_oneflow(q, k, v, mask, D ** -0.5),
               "GELU (tanh) [BS,I]": lambda: layer.intermediate.act(u),
               "bias add [BS,I]": lambda: u + b_up,
               "LayerNorm [BS,H]": lambda: ln(hid),
               "alt: LayerNorm, OneFlow's ops": lambda: ln._oneflow(hid),
               "LayerNorm(x + residual) [BS,H]": lambda: ln(hid, hid),
               "alt: LayerNorm(x + residual), OneFlow's ops": lambda: ln._oneflow(hid + hid),
               "heads: [B,S,H] -> [B,N,S,D] copy": lambda: hid.reshape(B, S, N, D).permute(0, 2, 1, 3).contiguous(),
               "query + heads: linear [BS,H]x[H,H] + bias -> [B,N,S,D]": lambda: kernels.split_heads(qkv, hid, N),
               "alt: query + heads, OneFlow's linear + permute":
                   lambda: flow.nn.Linear.forward(qkv, hid).reshape(B, S, N, D).permute(0, 2, 1, 3).contiguous(),
               "heads: [B,N,S,D] -> [B,S,H] copy": lambda: kernels.merge_heads(q),
               "alt: heads merge, OneFlow's permute": lambda: q.permute(0, 2, 1, 3).reshape(B, S, H),
               "whole layer": lambda: layer(hid, mask)}
        run = lambda f: f().numpy()  # noqa: E731  (numpy(): OneFlow runs asynchronously)
        ctx = flow.no_grad
    out = {}
    with ctx():
        for name, f in ops.items():
            run(f)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                run(f)
                times.append((time.perf_counter() - t0) * 1000)
            out[name] = round(sorted(times)[2], 1)
    return {"ms": out}


def hf_adamw(torch, model):
    """The train rows' torch optimizer: AdamW lr 5e-5, eps 1e-6, weight decay 0.01 but on biases and LayerNorm."""
    no_decay = ("bias", "LayerNorm")
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": 0.01},
              {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=5e-5, eps=1e-6)


def predict_loop(batch, a, loaded):
    """--rows windows in batches of --batch, timed whole (as a prediction run is); also the process's
    CPU seconds (user + system, every thread) over the same span, less sensitive to other load."""
    t0, c0 = time.perf_counter(), time.process_time()
    for lo in range(0, a.rows, a.batch):
        batch(lo, min(lo + a.batch, a.rows))
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dict(windows_per_s=round(a.rows / secs, 3), seconds=round(secs, 2), cpu_seconds=round(cpu, 2),
                loaded_rss_mib=loaded)


def train_loop(step, a, loaded):
    t0 = time.perf_counter()
    step(0, a.batch)
    warm = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    losses = [step(i * a.batch, (i + 1) * a.batch) for i in range(1, a.steps + 1)]
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dict(windows_per_s=round(a.steps * a.batch / secs, 3), seconds=round(secs, 2), cpu_seconds=round(cpu, 2),
                warmup_s=round(warm, 2),
                loaded_rss_mib=loaded, losses=[round(v, 4) for v in losses])


def flow_world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=("hf", "of", "ort"), required=True)
    ap.add_argument("--mode", choices=("eager", "graph"), default="eager")
    ap.add_argument("--model", choices=("minilm", "base"), required=True)
    ap.add_argument("--model-dir")
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--task", choices=("predict", "train", "profile", "save"), required=True)
    ap.add_argument("--rows", type=int, default=32, help="predict: windows timed")
    ap.add_argument("--batch", type=int, default=32, help="predict batch / train step windows")
    ap.add_argument("--steps", type=int, default=2, help="train: steps timed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    n = max(a.rows, a.batch) if a.task == "predict" else a.batch * (a.steps + 1)
    if a.task == "save":
        save_qa(a)
        return 0
    if a.task == "profile":
        res = pieces("torch" if a.impl == "hf" else "oneflow", a)
    elif a.impl == "ort":
        res = run_ort(a, windows(n, a.seq))
    else:
        res = (run_hf if a.impl == "hf" else run_of)(a, windows(n, a.seq))
    res.update(impl=a.impl, mode={"hf": "eager", "ort": ort_mode()}.get(a.impl, a.mode), model=a.model, seq=a.seq, task=a.task,
               batch=a.batch, peak_rss_mib=status("VmHWM"))
    if a.impl == "of":
        import bert_of.runtime.blas as blas

        from bert_of.runtime.kernels import native_status
        from bert_of.runtime.train_kernels import train_status

        res.update(blas=blas.status()["blas"], blas_threads=blas.status()["threads"],
                   blas_choice=os.environ.get("BERT_OF_BLAS"), cpu_gelu=native_status()["active"],
                   cpu_kernels=native_status(), cpu_train_kernels=train_status(),
                   cpu_dropout=os.environ.get("BERT_OF_CPU_DROPOUT", "1") != "0",
                   vm_worker_thread=os.environ.get("ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD", "0") not in ("0", "false"))
    if a.impl == "of" and flow_world() > 1:
        res.update(ranks=flow_world())
        if os.environ.get("RANK", "0") != "0":  # rank 0 reports the job (infer() timed it across ranks)
            with open(f"{a.out}.rank{os.environ['RANK']}", "w") as f:  # the others their peak RSS
                json.dump({"peak_rss_mib": res["peak_rss_mib"]}, f)
            return
    with open(a.out, "w") as f:
        json.dump(res, f)
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
