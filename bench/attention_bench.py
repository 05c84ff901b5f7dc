"""The attention core for CPU inference, alone: bert_of's fused kernel (cpu_kernels.c's
bert_of_attention) against OneFlow's ops for the same maths, and against the GEMM part alone on the
threaded BLAS bert_of loads, called single-threaded per (batch, head) pair (the other way to build
the kernel: is a hand-written micro-kernel slower than OpenBLAS's?).

    .venv/bin/python bench/attention_bench.py [--rounds 7] [--out bench/results/attention.json]

Shapes: BERT-base (12 heads of 64) and MiniLM (12 of 32) at 4 rows of 128 and 384 tokens. Wall
milliseconds (medians of --rounds, the variants interleaved) and, for the single-threaded
variants, the thread's CPU milliseconds (less sensitive to a loaded machine). Prints JSON and
writes it to --out.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("BERT_OF_BLAS", "openblas")

from bert_of._flow import flow  # noqa: E402
from bert_of.runtime import blas, kernels  # noqa: E402

CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112


def _openblas():
    """The scipy-openblas sgemm and thread setter bert_of loaded (the same library handle)."""
    path = blas.status().get("library")
    if not path or blas.status()["blas"] != "openblas":
        return None, None
    lib = ctypes.CDLL(path)
    f = lib.scipy_cblas_sgemm
    f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    return f, lib.scipy_openblas_set_num_threads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "attention.json"))
    a = ap.parse_args()
    lib = kernels._kernel("attention")
    if lib is None:
        raise SystemExit(f"the attention kernel is off: {kernels.native_status()}")
    threads = kernels._native["threads"]
    sgemm, set_threads = _openblas()
    res = {"bench": "attention", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "load_before": round(os.getloadavg()[0], 2), "threads": threads, "blas": blas.describe(), "shapes": []}
    for name, B, N, S, D in (("base", 4, 12, 384, 64), ("base", 4, 12, 128, 64), ("minilm", 4, 12, 384, 32),
                             ("minilm", 4, 12, 128, 32)):
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((B, N, S, D), dtype=np.float32) for _ in range(3))
        mask = np.zeros((B, 1, 1, S), np.float32)
        mask[1:, ..., S * 3 // 4:] = -10000.0
        scale = D ** -0.5
        tq, tk, tv, tm = (flow.tensor(t) for t in (q, k, v, mask))
        sc, ctx = np.empty((S, S), np.float32), np.empty((S, D), np.float32)

        def gemms():  # the kernel's two GEMMs alone, each (b, n) one single-threaded BLAS call
            for b in range(B):
                for n in range(N):
                    sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, S, S, D, scale, q[b, n].ctypes.data, D,
                          k[b, n].ctypes.data, D, 0.0, sc.ctypes.data, S)
                    sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, S, D, S, 1.0, sc.ctypes.data, S,
                          v[b, n].ctypes.data, D, 0.0, ctx.ctypes.data, D)

        variants = {
            f"fused kernel, {threads} threads": lambda: kernels._run_attention(lib, q, k, v, mask, scale, None, threads),
            "fused kernel, 1 thread": lambda: kernels._run_attention(lib, q, k, v, mask, scale, None, 1),
            "OneFlow's ops (2 batched matmuls, add, softmax, permute)":
                lambda: kernels._attention_oneflow(tq, tk, tv, tm, scale).numpy(),
        }
        if sgemm is not None:
            variants["OpenBLAS sgemm alone, 1 thread per (b, n) (no softmax)"] = gemms
        wall = {k_: [] for k_ in variants}
        cpu = {k_: [] for k_ in variants}
        with flow.no_grad():
            for f in variants.values():
                f()
            for _ in range(a.rounds):
                for key, f in variants.items():
                    one = "1 thread" in key
                    if one and sgemm is not None:
                        set_threads(1)
                    t0, c0 = time.perf_counter(), time.thread_time()
                    f()
                    wall[key].append((time.perf_counter() - t0) * 1000)
                    cpu[key].append((time.thread_time() - c0) * 1000)
                    if one and sgemm is not None:
                        set_threads(blas.status()["threads"])
        row = {"model": name, "shape": [B, N, S, D],
               "wall_ms": {k_: round(float(np.median(x)), 2) for k_, x in wall.items()},
               "cpu_ms_single_thread": {k_: round(float(np.median(x)), 2) for k_, x in cpu.items() if "1 thread" in k_}}
        res["shapes"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    res["load_after"] = round(os.getloadavg()[0], 2)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
