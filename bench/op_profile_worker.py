"""Per-piece timing of one pretraining step, at the benchmark's shapes, in OneFlow or PyTorch.

    .venv/bin/python        bench/op_profile_worker.py --fw oneflow --out of.json
    .venv-anchor/bin/python bench/op_profile_worker.py --fw torch --threads 2 --out pt.json

OneFlow 0.9's profiler aborts on a machine without a CUDA driver (its
DisableProfilerAndReturnResult calls cudaDeviceSynchronize), so the step is cut
into pieces, each run forward + backward in isolation on inputs of the real
shapes: B=16, S=128, H=256, 4 heads, I=1024, P=20 masked positions, V=30522.
OneFlow pieces call what bert_of's modeling.py / training.py call; PyTorch
pieces call what HF transformers' BertForPreTraining calls (its own modules
where they exist). Each piece: 2 warm-up calls, then --reps timed calls
(OneFlow synchronised after each); min and median of the wall time and of the
process CPU time (all threads; with one thread each, the CPU time is the work
done and barely moves with machine load, unlike the wall time) in ms. ``count`` is how many
times the piece occurs in one step; min x count summed over the pieces is set
against the whole step (also timed here) to show what the pieces leave out.

Rows whose names start with "alt:" time what bert_of does NOT do (OneFlow's own
CPU LayerNorm kernel, Google's GELU as separate element-wise ops; PyTorch's fused
attention, HF's MLM head on all positions) for comparison.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pretrain_worker import CONFIG, PRED, SEQ, TRAIN, make_batch  # noqa: E402

B, S, H, N, I, P, V = 16, SEQ, CONFIG["hidden_size"], CONFIG["num_attention_heads"], CONFIG["intermediate_size"], PRED, \
    CONFIG["vocab_size"]
D = H // N
L = CONFIG["num_hidden_layers"]
DROP = CONFIG["hidden_dropout_prob"]


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# --------------------------------------------------------------------------- OneFlow (bert_of)


def oneflow_pieces():
    ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, ROOT)
    from bert_of._flow import flow
    from bert_of.config import BertConfig
    from bert_of._flow import LayerNorm, gelu_tanh  # what the model runs: for a training step the training kernels
    from bert_of.heads import BertForPreTraining
    from bert_of.modeling import BertEmbeddings, BertLayer, _mask_adder
    from bert_of.outputs import pretraining_loss
    from bert_of.training import TrainConfig, Trainer, build_optimizer, clip_by_global_norm

    flow.manual_seed(0)
    cfg = BertConfig(**CONFIG)
    sync = flow._oneflow_internal.eager.Sync
    batch = make_batch(0, B)
    T = {k: flow.tensor(v) for k, v in batch.items()}
    mask_adder = _mask_adder(T["attention_mask"], flow.float32)
    bool_keep = T["attention_mask"].to(flow.bool).unsqueeze(1).unsqueeze(2)
    nn = flow.nn

    def leaf(*shape, seed=0, scale=1.0):
        return flow.tensor(rnd(*shape, seed=seed, scale=scale), requires_grad=True)

    def fb(fn, *mods):
        """fwd + bwd of fn() with an all-ones upstream gradient; grads reset each call."""
        params = [p for m in mods for p in m.parameters()]

        def run():
            y = fn()
            y.backward(flow.ones_like(y))
            for p in params:
                p.grad = None

        return run

    pieces = {}
    emb = BertEmbeddings(cfg)
    emb.train()
    pieces["embeddings (gather x3 + add + LayerNorm + dropout)"] = (1, fb(lambda: emb(T["input_ids"], T["token_type_ids"]), emb))

    x = leaf(B, S, H)
    qkv = nn.ModuleList([nn.Linear(H, H) for _ in range(3)])

    def heads(t):
        return t.reshape(B, S, N, D).permute(0, 2, 1, 3)

    pieces["q/k/v dense (3 x Linear H->H)"] = (L, fb(lambda: qkv[0](x) + qkv[1](x) + qkv[2](x), qkv))
    q, k, v = leaf(B, S, H, seed=1), leaf(B, S, H, seed=2), leaf(B, S, H, seed=3)
    scale = 1.0 / math.sqrt(D)
    pieces["attn scores (heads, q k^T * scale + mask)"] = (
        L, fb(lambda: flow.matmul(heads(q), heads(k), transpose_b=True, alpha=scale) + mask_adder))
    sc = leaf(B, N, S, S, seed=4)
    pieces["softmax [B,N,S,S]"] = (L, fb(lambda: flow.softmax(sc, dim=-1)))
    drop = nn.Dropout(DROP)
    drop.train()
    pieces["attn-probs dropout [B,N,S,S]"] = (L, fb(lambda: drop(sc)))
    pr = leaf(B, N, S, S, seed=5)
    pieces["attn context (probs @ v, merge heads)"] = (
        L, fb(lambda: flow.matmul(pr, heads(v)).permute(0, 2, 1, 3).reshape(B, S, H)))
    dense_o, ln_o = nn.Linear(H, H), LayerNorm(H, eps=cfg.layer_norm_eps)
    res = leaf(B, S, H, seed=6)
    pieces["attn output (Linear H->H + dropout + residual + LayerNorm)"] = (
        L, fb(lambda: ln_o(drop(dense_o(x)) + res), dense_o, ln_o))
    dense_i = nn.Linear(H, I)
    pieces["FFN in (Linear H->I)"] = (L, fb(lambda: dense_i(x), dense_i))
    xi = leaf(B, S, I, seed=7)
    pieces["GELU tanh [B,S,I]"] = (L, fb(lambda: gelu_tanh(xi)))
    dense_f, ln_f = nn.Linear(I, H), LayerNorm(H, eps=cfg.layer_norm_eps)
    pieces["FFN out (Linear I->H + dropout + residual + LayerNorm)"] = (
        L, fb(lambda: ln_f(drop(dense_f(xi)) + res), dense_f, ln_f))
    pieces["  of which LayerNorm [B,S,H]"] = (2 * L + 2, fb(lambda: ln_f(x), ln_f))
    pieces["  of which Linear I->H"] = (L, fb(lambda: dense_f(xi), dense_f))
    layer = BertLayer(cfg)
    layer.train()
    pieces["= one whole encoder layer (check)"] = (0, fb(lambda: layer(x, mask_adder), layer))

    model = BertForPreTraining(cfg)
    model.init_weights(seed=0)
    model.train()
    heads_mod, wemb = model.cls, model.bert.embeddings.word_embeddings
    seq, pooled = leaf(B, S, H, seed=8), leaf(B, H, seed=9)

    def mlm():
        hid = flow.batch_gather(seq, T["masked_lm_positions"])
        logits, nsp = heads_mod(hid, pooled, wemb.weight)
        return pretraining_loss(logits, nsp, T["masked_lm_ids"], T["masked_lm_weights"],
                                T["next_sentence_labels"])["loss"]

    pieces["MLM head on P positions + NSP + loss (gather, dense, GELU, LN, x E^T [V], CE)"] = (
        1, fb(mlm, heads_mod, wemb))
    hp = leaf(B * P, H, seed=12)
    pieces["  of which decoder x E^T + bias [B*P,H]x[H,V]"] = (
        1, fb(lambda: flow.matmul(hp, wemb.weight, transpose_b=True) + heads_mod.predictions.bias, heads_mod, wemb))
    lg = leaf(B * P, V, seed=13)
    pieces["  of which cross-entropy over V [B*P,V]"] = (
        1, fb(lambda: flow.nn.functional.cross_entropy(lg, T["masked_lm_ids"].reshape(-1), reduction="none").sum()))
    pooler = model.bert.pooler
    pieces["pooler (first token, dense, tanh)"] = (1, fb(lambda: pooler(seq), pooler))
    pieces["mask adder ((1-mask) * -10000)"] = (1, lambda: _mask_adder(T["attention_mask"], flow.float32))

    # Optimizer: bert_of's eager path (two groups, AdamW without bias correction) + global-norm clip.
    tcfg = TrainConfig(**dict(TRAIN, mode="eager"))
    model3 = BertForPreTraining(cfg)
    model3.init_weights(seed=0)
    opt = build_optimizer(model3, tcfg, for_graph=False)
    params = [p for p in model3.parameters()]
    for p in params:
        p.grad = flow.tensor(rnd(*p.shape, seed=11, scale=1e-3))

    def opt_step():
        clip_by_global_norm(params, 1.0)
        opt.step()

    pieces["optimizer (global-norm clip + AdamW, 11.2M params)"] = (1, opt_step)
    pieces["  of which AdamW step alone"] = (1, lambda: opt.step())

    # The whole eager step, as the benchmark runs it.
    model2 = BertForPreTraining(cfg)
    model2.init_weights(seed=0)
    trainer = Trainer(model2, tcfg)
    pieces["WHOLE STEP (eager)"] = (0, lambda: trainer.step(batch))

    # ---- for comparison: what bert_of did before (Google's GELU as separate element-wise ops,
    # OneFlow's own CPU LayerNorm kernel)
    pieces["alt: GELU tanh as Google's element-wise expression"] = (
        0, fb(lambda: xi * (0.5 * (1.0 + flow.tanh(math.sqrt(2.0 / math.pi) * (xi + 0.044715 * flow.pow(xi, 3)))))))
    ln_flow = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
    pieces["alt: LayerNorm [B,S,H] with OneFlow's CPU kernel (nn.LayerNorm)"] = (0, fb(lambda: ln_flow(x), ln_flow))
    return pieces, sync, {"oneflow": flow.__version__}


# --------------------------------------------------------------------------- PyTorch (HF transformers)


def torch_pieces(attn_impl):
    os.environ.setdefault("USE_TF", "0")
    import torch
    import transformers
    from transformers.models.bert import modeling_bert as hf

    torch.manual_seed(0)
    cfg = transformers.BertConfig(**CONFIG, hidden_act="gelu_new", layer_norm_eps=1e-12, attn_implementation=attn_impl)
    batch = make_batch(0, B)
    T = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
    mask_adder = (1.0 - T["attention_mask"][:, None, None, :].float()) * torch.finfo(torch.float32).min
    nn = torch.nn
    gelu_new = transformers.activations.ACT2FN["gelu_new"]

    def leaf(*shape, seed=0, scale=1.0):
        return torch.tensor(rnd(*shape, seed=seed, scale=scale), requires_grad=True)

    def fb(fn, *mods):
        params = [p for m in mods for p in m.parameters()]

        def run():
            y = fn()
            y.backward(torch.ones_like(y))
            for p in params:
                p.grad = None

        return run

    pieces = {}
    emb = hf.BertEmbeddings(cfg)
    emb.train()
    pieces["embeddings (gather x3 + add + LayerNorm + dropout)"] = (
        1, fb(lambda: emb(input_ids=T["input_ids"], token_type_ids=T["token_type_ids"]), emb))
    x = leaf(B, S, H)
    qkv = nn.ModuleList([nn.Linear(H, H) for _ in range(3)])

    def heads(t):
        return t.view(B, S, N, D).transpose(1, 2)

    pieces["q/k/v dense (3 x Linear H->H)"] = (L, fb(lambda: qkv[0](x) + qkv[1](x) + qkv[2](x), qkv))
    q, k, v = leaf(B, S, H, seed=1), leaf(B, S, H, seed=2), leaf(B, S, H, seed=3)
    scale = 1.0 / math.sqrt(D)
    pieces["attn scores (heads, q k^T * scale + mask)"] = (
        L, fb(lambda: torch.matmul(heads(q), heads(k).transpose(-1, -2)) * scale + mask_adder))
    sc = leaf(B, N, S, S, seed=4)
    pieces["softmax [B,N,S,S]"] = (L, fb(lambda: torch.softmax(sc, dim=-1)))
    drop = nn.Dropout(DROP)
    drop.train()
    pieces["attn-probs dropout [B,N,S,S]"] = (L, fb(lambda: drop(sc)))
    pr = leaf(B, N, S, S, seed=5)
    pieces["attn context (probs @ v, merge heads)"] = (
        L, fb(lambda: torch.matmul(pr, heads(v)).transpose(1, 2).reshape(B, S, H)))
    pieces["alt: attention core fused (F.scaled_dot_product_attention, dropout 0.1)"] = (
        0, fb(lambda: torch.nn.functional.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=mask_adder,
                                                                       dropout_p=DROP).transpose(1, 2).reshape(B, S, H)))
    so = hf.BertSelfOutput(cfg)
    so.train()
    res = leaf(B, S, H, seed=6)
    pieces["attn output (Linear H->H + dropout + residual + LayerNorm)"] = (L, fb(lambda: so(x, res), so))
    dense_i = nn.Linear(H, I)
    pieces["FFN in (Linear H->I)"] = (L, fb(lambda: dense_i(x), dense_i))
    xi = leaf(B, S, I, seed=7)
    pieces["GELU tanh [B,S,I]"] = (L, fb(lambda: gelu_new(xi)))
    out = hf.BertOutput(cfg)
    out.train()
    pieces["FFN out (Linear I->H + dropout + residual + LayerNorm)"] = (L, fb(lambda: out(xi, res), out))
    pieces["  of which LayerNorm [B,S,H]"] = (2 * L + 2, fb(lambda: out.LayerNorm(x), out.LayerNorm))
    pieces["  of which Linear I->H"] = (L, fb(lambda: out.dense(xi), out.dense))
    layer = hf.BertLayer(cfg)
    layer.train()
    ext_mask = mask_adder
    pieces["= one whole encoder layer (check)"] = (0, fb(lambda: layer(x, attention_mask=ext_mask)[0], layer))

    model = transformers.BertForPreTraining(cfg)
    model.train()
    seq, pooled = leaf(B, S, H, seed=8), leaf(B, H, seed=9)

    def mlm():
        hid = torch.gather(seq, 1, T["masked_lm_positions"].unsqueeze(-1).expand(-1, -1, H))
        logits = model.cls.predictions(hid)
        nsp = model.cls.seq_relationship(pooled)
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, V), T["masked_lm_ids"].reshape(-1), reduction="none")
        w = T["masked_lm_weights"].reshape(-1)
        return (w * nll).sum() / (w.sum() + 1e-5) + torch.nn.functional.cross_entropy(nsp, T["next_sentence_labels"])

    pieces["MLM head on P positions + NSP + loss (gather, dense, GELU, LN, x E^T [V], CE)"] = (1, fb(mlm, model.cls))

    def mlm_all():  # HF's default: the head on all S positions
        logits = model.cls.predictions(seq)
        labels = torch.full((B, S), -100, dtype=torch.long)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1).clamp(min=0))

    hp = leaf(B * P, H, seed=12)
    dec = model.cls.predictions.decoder
    pieces["  of which decoder x E^T + bias [B*P,H]x[H,V]"] = (1, fb(lambda: dec(hp), dec))
    lg = leaf(B * P, V, seed=13)
    pieces["  of which cross-entropy over V [B*P,V]"] = (
        1, fb(lambda: torch.nn.functional.cross_entropy(lg, T["masked_lm_ids"].reshape(-1), reduction="none").sum()))
    pieces["alt: MLM head on all S positions (HF default)"] = (0, fb(mlm_all, model.cls))
    pieces["pooler (first token, dense, tanh)"] = (1, fb(lambda: model.bert.pooler(seq), model.bert.pooler))
    pieces["mask adder ((1-mask) * -10000)"] = (
        1, lambda: (1.0 - T["attention_mask"][:, None, None, :].float()) * -10000.0)

    named = [(n, p) for n, p in transformers.BertForPreTraining(cfg).named_parameters()]
    nd = ("bias", "LayerNorm")
    opt = torch.optim.AdamW([{"params": [p for n, p in named if not any(k in n for k in nd)], "weight_decay": 0.01},
                             {"params": [p for n, p in named if any(k in n for k in nd)], "weight_decay": 0.0}],
                            lr=1e-4, eps=1e-6)
    params = [p for _, p in named]
    for p in params:
        p.grad = torch.tensor(rnd(*p.shape, seed=11, scale=1e-3))

    def opt_step():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    pieces["optimizer (global-norm clip + AdamW, 11.2M params)"] = (1, opt_step)
    pieces["  of which AdamW step alone"] = (1, lambda: opt.step())

    model2 = transformers.BertForPreTraining(cfg)
    model2.train()
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01)

    def whole():
        o = model2.bert(input_ids=T["input_ids"], token_type_ids=T["token_type_ids"], attention_mask=T["attention_mask"])
        hid = torch.gather(o[0], 1, T["masked_lm_positions"].unsqueeze(-1).expand(-1, -1, H))
        logits, nsp = model2.cls.predictions(hid), model2.cls.seq_relationship(o[1])
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, V), T["masked_lm_ids"].reshape(-1), reduction="none")
        w = T["masked_lm_weights"].reshape(-1)
        loss = (w * nll).sum() / (w.sum() + 1e-5) + torch.nn.functional.cross_entropy(nsp, T["next_sentence_labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model2.parameters(), 1.0)
        opt2.step()
        opt2.zero_grad(set_to_none=True)
        return float(loss.item())

    pieces["WHOLE STEP (eager)"] = (0, whole)  # HF model, gathered head, Google's loss, clip, AdamW
    return pieces, (lambda: None), {"torch": torch.__version__, "transformers": transformers.__version__,
                                     "threads": torch.get_num_threads(), "attn_implementation": attn_impl}


DNNL_MARK = "=== bench: timed step starts"


def dnnl_step():
    ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, ROOT)
    from bert_of._flow import flow
    from bert_of.config import BertConfig
    from bert_of.heads import BertForPreTraining
    from bert_of.training import TrainConfig, Trainer

    flow.manual_seed(0)
    model = BertForPreTraining(BertConfig(**CONFIG))
    model.init_weights(seed=0)
    trainer = Trainer(model, TrainConfig(**dict(TRAIN, mode="eager")))
    batch = make_batch(0, B)
    for _ in range(2):
        trainer.step(batch)
    print(DNNL_MARK, flush=True)
    t0 = time.perf_counter()
    trainer.step(batch)
    print(f"=== bench: step wall ms {(time.perf_counter() - t0) * 1e3:.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fw", choices=("oneflow", "torch"), required=True)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (torch only)")
    ap.add_argument("--attn", default="sdpa", help="HF attn_implementation for the whole-layer / whole-step rows")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", default=None, help="substring: time only matching pieces")
    ap.add_argument("--dnnl-step", action="store_true",
                    help="OneFlow: run 2 eager steps, print a marker line, run 1 more (for DNNL_VERBOSE=1 logs) and exit")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.dnnl_step:
        dnnl_step()
        return
    if a.fw == "torch":
        import torch

        torch.set_num_threads(a.threads)
        pieces, sync, info = torch_pieces(a.attn)
    else:
        pieces, sync, info = oneflow_pieces()
    info.update(env={k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "ONEFLOW_ENABLE_ONEDNN_OPTS")})
    rows = {}
    for name, (count, fn) in pieces.items():
        if a.only and a.only not in name:
            continue
        for _ in range(2):
            fn()
        sync()
        ts, cs = [], []
        for _ in range(a.reps if "WHOLE" not in name else max(3, a.reps // 2)):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync()
            ts.append((time.perf_counter() - t0) * 1e3)
            cs.append((time.process_time() - c0) * 1e3)
        rows[name] = {"count": count, "min_ms": round(min(ts), 3), "median_ms": round(statistics.median(ts), 3),
                      "cpu_min_ms": round(min(cs), 3), "cpu_median_ms": round(statistics.median(cs), 3)}
        print(f"{name:80s} x{count:<3d} wall min {min(ts):9.2f} med {statistics.median(ts):9.2f} | "
              f"cpu min {min(cs):9.2f} med {statistics.median(cs):9.2f} ms", file=sys.stderr)
    with open(a.out, "w") as f:
        json.dump({"fw": a.fw, "info": info, "load_avg": os.getloadavg(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
