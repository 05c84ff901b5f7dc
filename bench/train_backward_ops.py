"""One MiniLM layer's training pieces at batch 8, each forward then timed backward (OneFlow synchronised),
bert_of's path (the training kernels) beside OneFlow's own ops for the same piece; and the attention's
batched GEMM three ways: OneFlow's batched matmul, one cblas_sgemm per head matrix, one
cblas_sgemm_batch_strided call (bert_of/runtime/blas.py's batched_sgemm).

    .venv/bin/python bench/train_backward_ops.py --seq 384 [--reps 3]

Prints one JSON object: {piece: [min wall ms, min CPU ms]} over --reps timed calls after one warm-up.
Shapes: B 8, N 12 heads, D 32, H 384, I 1536 (MiniLM-L6); --seq S tokens.
"""

import argparse
import contextlib
import ctypes
import json
import os
import time

os.environ.setdefault("BERT_OF_BLAS", "auto")
os.environ.setdefault("BERT_OF_CPU_TRAIN_ATTENTION_TOKENS", "1")  # bert_of's pieces at any --seq (a step: from 256)

import numpy as np  # noqa: E402

from bert_of._flow import dropout_attention, flow, merge_heads, split_heads  # noqa: E402
from bert_of.runtime import blas  # noqa: E402
from bert_of.runtime import train_kernels as TK  # noqa: E402

B, N, D, H, I = 8, 12, 32, 384, 1536


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=384)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    S = a.seq
    sync = flow._oneflow_internal.eager.Sync
    rng = np.random.default_rng(0)
    leaf = lambda *shape: flow.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True)  # noqa: E731
    res = {}

    def timed(fn):
        ts = []
        for _ in range(a.reps + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync()
            ts.append(((time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3))
        ts = ts[1:]
        return [round(min(t[0] for t in ts), 1), round(min(t[1] for t in ts), 1)]

    def backward(name, fwd, oneflows=False):
        def run():
            with TK.off() if oneflows else contextlib.nullcontext():
                y = fwd()
                g = flow.tensor(np.ones(tuple(y.shape), np.float32))
                sync()
            t0, c0 = time.perf_counter(), time.process_time()
            y.backward(g)
            sync()
            return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
        ts = [run() for _ in range(a.reps + 1)][1:]
        res[name] = [round(min(t[0] for t in ts), 1), round(min(t[1] for t in ts), 1)]
        print(name, res[name], flush=True)

    lin = flow.nn.Linear(H, H)
    drop = flow.nn.Dropout(0.1, generator=TK.DropoutGenerator())
    drop.train()
    x = leaf(B, S, H)
    q, k, v = leaf(B, N, S, D), leaf(B, N, S, D), leaf(B, N, S, D)
    mask = flow.zeros(B, 1, 1, S)
    for tag, off in (("bert_of", False), ("oneflow", True)):
        backward(f"{tag}: Linear H x H", lambda: lin(x), off)
        backward(f"{tag}: heads' split of a Linear", lambda: split_heads(lin, x, N), off)
        backward(f"{tag}: heads' merge", lambda: merge_heads(q), off)
    backward("bert_of: attention core", lambda: dropout_attention(q, k, v, mask, 0.17, drop))
    backward("oneflow: attention core", lambda: flow.matmul(drop(flow.softmax(
        flow.matmul(q, k, transpose_b=True, alpha=0.17) + mask, dim=-1)), v).permute(0, 2, 1, 3).reshape(B, S, H), True)

    # the scores' GEMM alone, three ways
    gemm = blas.batched_sgemm()
    qa, ka = q.numpy().reshape(B * N, S, D), k.numpy().reshape(B * N, S, D)
    out = np.empty((B * N, S, S), np.float32)
    res["gemm: OneFlow's batched matmul"] = timed(lambda: flow.matmul(q, k, transpose_b=True, alpha=0.17))
    if gemm is not None:
        lib = blas._state["handle"]
        one = getattr(lib, blas._state["prefix"] + "cblas_sgemm")
        i_, p_ = ctypes.c_int, ctypes.c_void_p
        one.argtypes = [i_] * 6 + [ctypes.c_float, p_, i_, p_, i_, ctypes.c_float, p_, i_]

        def per_matrix():
            for j in range(B * N):
                one(101, 111, 112, S, S, D, 0.17, qa[j].ctypes.data, D, ka[j].ctypes.data, D, 0.0,
                    out[j].ctypes.data, S)

        res["gemm: cblas_sgemm per matrix"] = timed(per_matrix)
        res["gemm: cblas_sgemm_batch_strided"] = timed(lambda: TK._bmm(gemm, qa, ka, False, True, 0.17, out))
    print(json.dumps({"seq": S, "batch": B, "blas": blas.describe(), "load": os.getloadavg()[0], "pieces": res}))


if __name__ == "__main__":
    main()
