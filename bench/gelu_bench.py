"""GELU on CPU for inference: OneFlow 0.9's own kernels against bert_of's (bert_of/runtime/cpu_kernels.c),
at a BERT-base FFN's activation (4 x 384 tokens x 3072), both GELUs, inputs ~N(0, 1) and ~N(0, 9).

    .venv/bin/python bench/gelu_bench.py [--reps 7] [--out bench/results/gelu.json]

Per (GELU, input scale): OneFlow's ops (what runs with BERT_OF_CPU_KERNELS=0), bert_of's kernel on
1 thread and on the threads it uses, median ms of --reps calls (wall; the host is shared: ``cpu_ms``, the
process's CPU time per call on its threads, beside it), and each one's largest distance from the float64
GELU in float ulps of |x| (kernels.gelu_ulps: bert_of's is bounded by GELU_ULPS, not OneFlow's bits). One
process; prints one JSON object and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_of._flow import flow  # noqa: E402
from bert_of.runtime.kernels import _ONEFLOW_GELU, _native_lib, gelu_ulps, native_status  # noqa: E402

SHAPE = (4 * 384, 3072)


def median_ms(f, reps: int) -> tuple:
    """(median wall ms, median process CPU ms) of reps calls after one warm-up"""
    f()
    times, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        f()
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return round(sorted(times)[reps // 2], 1), round(sorted(cpu)[reps // 2], 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gelu.json"))
    a = ap.parse_args()
    lib = _native_lib()
    if lib is None:
        raise SystemExit(f"bert_of's GELU kernel is not in use: {native_status()['why']}")
    threads = native_status()["threads"]
    rng = np.random.default_rng(0)
    rows = []
    for scale in (1.0, 3.0):
        x = (rng.standard_normal(SHAPE) * scale).astype(np.float32)
        t = flow.tensor(x)
        y = np.empty_like(x)
        for op, name in ((0, "exact (erf)"), (1, "tanh")):
            want = _ONEFLOW_GELU[op](t).numpy()
            lib.bert_of_gelu(x.ctypes.data, y.ctypes.data, x.size, threads, op)
            row = {"gelu": name, "input_std": scale, "ulps_of_x": {"bert_of": round(gelu_ulps(y, x, op), 2),
                                                                  "oneflow": round(gelu_ulps(want, x, op), 2)}}
            row["oneflow_ms"], row["oneflow_cpu_ms"] = median_ms(lambda: _ONEFLOW_GELU[op](t).numpy(), a.reps)
            for n in sorted({1, threads}):
                row[f"bert_of_{n}_thread_ms"], row[f"bert_of_{n}_thread_cpu_ms"] = median_ms(
                    lambda: lib.bert_of_gelu(x.ctypes.data, y.ctypes.data, x.size, n, op), a.reps)
            row.update(speedup=round(row["oneflow_ms"] / row[f"bert_of_{threads}_thread_ms"], 2))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    res = {"bench": "gelu", "shape": list(SHAPE), "threads": threads, "cpus": os.cpu_count(),
           "load_avg_1m_start": round(os.getloadavg()[0], 2),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
